//! A sweep's deadline in the server's clock: a sweep that reaches Redis late (held in a
//! client's queue through a reconnect, written to a server that froze and then thawed, stuck in
//! a congested network) must not run, because the live workers' leases, renewed through the
//! same Redis, may have aged past `min_idle` in the meantime. The reader keeps the last server
//! time it saw (a claim's or a sweep's reply carries the server's `TIME`) and when it saw it, and
//! gives each sweep a deadline: that time, plus what elapsed here since, plus a slack of one
//! lease renewal period. The script skips its sweep when the server's `TIME` is past it. A live
//! claim is renewed every `min_idle / 3`, so one the late sweep sees has aged at most that plus
//! the slack: under `min_idle`.
//!
//! The estimate errs early, by the reply's way back (the time was read before the reply left
//! Redis), so a late sweep is never let through by it; clock drift between here and the server
//! over the interval between two claims is far below the slack.
//!
//! Commands: `TIME`, when a reader has seen no server time yet.

use std::sync::Mutex;
use std::time::Duration;

use fred::prelude::*;
use ruststream_core::Result;
use tokio::time::Instant;

use crate::error::core;
use crate::rejoin::Rejoin;

/// The last server time a reader saw, for its sweeps' deadlines.
#[derive(Debug)]
pub(crate) struct SweepClock {
    /// The server's time in ms, and when its reply came.
    seen: Mutex<Option<(u64, Instant)>>,
    /// How late a sweep may run.
    slack: Duration,
}

impl SweepClock {
    /// A clock whose sweeps may run at most `slack` after they were sent.
    pub(crate) fn new(slack: Duration) -> Self {
        Self {
            seen: Mutex::new(None),
            slack,
        }
    }

    /// Notes `server_ms`, the server's time a reply that came just now carried.
    pub(crate) fn saw(&self, server_ms: u64) {
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Some((server_ms, Instant::now()));
        }
    }

    /// The server time (ms) a sweep sent now must run by; asks the server's `TIME` on `client`
    /// first when no server time was seen yet.
    ///
    /// # Errors
    /// `TIME` failed (the connection's error, typed).
    pub(crate) async fn deadline(&self, client: &Client) -> Result<u64> {
        if let Some(by) = self.estimate() {
            return Ok(by);
        }
        let time: Vec<String> = client
            .custom(fred::cmd!("TIME"), Vec::<Value>::new())
            .await
            .map_err(core)?;
        if let Some(ms) = run_ms(time.join(".").as_bytes()) {
            self.saw(ms);
        }
        Ok(self.estimate().unwrap_or(0))
    }

    /// Notes `ran`, the server time (ms) a call with a sweep deadline `by` ran at, as
    /// [`saw`](Self::saw) does. A sweep the deadline stopped (the call reached Redis late: the
    /// leases may have aged meanwhile) is logged and marks `rejoin`, so the reader renews before
    /// it sweeps again.
    pub(crate) fn ran(&self, ran: u64, by: Option<u64>, rejoin: Option<&Rejoin>, source: &str) {
        self.saw(ran);
        if let Some(by) = by.filter(|by| ran > *by) {
            tracing::warn!(
                source,
                late_ms = ran - by,
                "a sweep reached Redis past its deadline and took nothing; renewing leases before the next"
            );
            if let Some(rejoin) = rejoin {
                rejoin.mark();
            }
        }
    }

    fn estimate(&self) -> Option<u64> {
        let (ms, at) = (*self.seen.lock().ok()?)?;
        let since = at.elapsed() + self.slack;
        Some(ms.saturating_add(u64::try_from(since.as_millis()).unwrap_or(u64::MAX)))
    }
}

/// The ms of a server time `<seconds>.<microseconds>` (a claim's run id), if it is one.
pub(crate) fn run_ms(run: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(run).ok()?;
    let (secs, micros) = text.split_once('.')?;
    let (secs, micros): (u64, u64) = (secs.parse().ok()?, micros.parse().ok()?);
    Some(secs.checked_mul(1000)? + micros / 1000)
}

#[cfg(test)]
mod tests {
    use super::{SweepClock, run_ms};
    use std::time::Duration;

    #[test]
    fn a_run_id_is_read_as_the_server_time() {
        assert_eq!(run_ms(b"1700000000.123456"), Some(1_700_000_000_123));
        assert_eq!(run_ms(b"1700000000.999"), Some(1_700_000_000_000));
        assert_eq!(run_ms(b""), None);
        assert_eq!(run_ms(b"x.1"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_is_the_last_time_seen_plus_what_elapsed_plus_the_slack() {
        let clock = SweepClock::new(Duration::from_millis(300));
        assert_eq!(clock.estimate(), None, "no server time seen yet");
        clock.saw(10_000);
        assert_eq!(clock.estimate(), Some(10_300));
        tokio::time::advance(Duration::from_millis(2_000)).await;
        assert_eq!(clock.estimate(), Some(12_300));
        clock.saw(50_000);
        assert_eq!(
            clock.estimate(),
            Some(50_300),
            "the latest time seen counts"
        );
    }
}
