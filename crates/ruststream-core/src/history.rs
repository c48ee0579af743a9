//! A subscription's history: what its handlers did, counted in memory and handed to the broker
//! once per interval (a minute by default) to keep, so that a dashboard can chart it later.
//!
//! Every subscription counts in its [`Tally`]: settled, failed,
//! retried, dead-lettered and timed-out deliveries, and handler times in [`TIME_BUCKETS`]
//! buckets of a log scale (a few relaxed atomic increments a message, no I/O). When its broker
//! keeps history ([`Broker::history`](crate::Broker::history)), a task of the subscription
//! takes the change since its last write every [`HistorySink::every`] and writes it, with one
//! command; once more when the subscription stops. A broker without history costs nothing.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::Result;
use crate::observe::Tally;

/// Buckets of handler time: bucket `i` holds times up to [`bucket_bound_us`]`(i)`, a factor
/// √2 apart from 50 µs; the last also holds everything longer (past about 10 minutes).
pub const TIME_BUCKETS: usize = 48;

/// The upper bound, in µs, of handler-time bucket `i`: 50 µs × 2^(i/2).
pub fn bucket_bound_us(i: usize) -> f64 {
    50.0 * 2f64.powf(i as f64 / 2.0)
}

/// The bucket of a handler time.
pub fn bucket_of(d: Duration) -> usize {
    let us = d.as_secs_f64() * 1e6;
    if us <= 50.0 {
        return 0;
    }
    let i = (2.0 * (us / 50.0).log2()).ceil();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = i as usize;
    i.min(TIME_BUCKETS - 1)
}

/// What a subscription's handlers did over some time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Deliveries settled, whatever their outcome.
    pub handled: u64,
    /// Deliveries settled other than acknowledged.
    pub failed: u64,
    /// Deliveries sent back to be tried again.
    pub retried: u64,
    /// Deliveries dead-lettered.
    pub dead: u64,
    /// Handler calls stopped at their deadline.
    pub timed_out: u64,
    /// Handler calls per time bucket (see [`TIME_BUCKETS`]).
    pub times: [u64; TIME_BUCKETS],
}

impl Default for Counts {
    fn default() -> Self {
        Self {
            handled: 0,
            failed: 0,
            retried: 0,
            dead: 0,
            timed_out: 0,
            times: [0; TIME_BUCKETS],
        }
    }
}

impl Counts {
    /// What happened after `earlier` (a previous reading of the same tally).
    pub fn since(&self, earlier: &Counts) -> Counts {
        let mut times = [0; TIME_BUCKETS];
        for (i, t) in times.iter_mut().enumerate() {
            *t = self.times[i].saturating_sub(earlier.times[i]);
        }
        Counts {
            handled: self.handled.saturating_sub(earlier.handled),
            failed: self.failed.saturating_sub(earlier.failed),
            retried: self.retried.saturating_sub(earlier.retried),
            dead: self.dead.saturating_sub(earlier.dead),
            timed_out: self.timed_out.saturating_sub(earlier.timed_out),
            times,
        }
    }

    /// Adds `other` to these counts.
    pub fn add(&mut self, other: &Counts) {
        self.handled += other.handled;
        self.failed += other.failed;
        self.retried += other.retried;
        self.dead += other.dead;
        self.timed_out += other.timed_out;
        for (t, o) in self.times.iter_mut().zip(other.times) {
            *t += o;
        }
    }

    /// Whether nothing happened.
    pub fn is_empty(&self) -> bool {
        *self == Counts::default()
    }

    /// The handler time under which a share `q` (0 to 1) of the calls finished, in ms, read off
    /// the buckets (the geometric middle of the bucket it falls in); `None` without calls.
    pub fn percentile_ms(&self, q: f64) -> Option<f64> {
        let total: u64 = self.times.iter().sum();
        if total == 0 {
            return None;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.times.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let upper = bucket_bound_us(i);
                let lower = if i == 0 { 25.0 } else { bucket_bound_us(i - 1) };
                return Some((upper * lower).sqrt() / 1000.0);
            }
        }
        None
    }
}

/// Where a broker keeps one subscription's history.
pub trait HistorySink: Send + Sync + 'static {
    /// How often the subscription writes (a minute by default).
    fn every(&self) -> Duration;

    /// Adds `counts`, what happened since the last write, to the history at `at_ms` (ms since
    /// the epoch, the worker's clock), with the queue's depth sampled beside it.
    fn write(&self, at_ms: i64, counts: Counts) -> BoxFuture<'_, Result<()>>;
}

/// How long the write made when a subscription stops may take.
const LAST_WRITE: Duration = Duration::from_secs(1);

/// Writes `tally`'s changes to `sink` every [`HistorySink::every`] until `stop`, then once more
/// (within a second). A failed write is logged and its counts are written with the next one.
pub(crate) async fn keep(
    name: String,
    tally: Arc<Tally>,
    sink: Arc<dyn HistorySink>,
    stop: CancellationToken,
) {
    let every = sink.every().max(Duration::from_millis(100));
    let mut written = tally.counts();
    let mut since = now_ms();
    loop {
        let stopping = tokio::select! {
            () = tokio::time::sleep(every) => false,
            () = stop.cancelled() => true,
        };
        let now = tally.counts();
        let counts = now.since(&written);
        let at = now_ms();
        // The middle of the interval: its counts belong to the minute most of it fell in.
        let middle = since + (at - since) / 2;
        let write = sink.write(middle, counts);
        // The last write must not hold a shutdown up when Redis does not answer.
        let written_now = if stopping {
            match tokio::time::timeout(LAST_WRITE, write).await {
                Ok(r) => r,
                Err(_) => Err(crate::Error::broker(
                    crate::ErrorKind::Timeout,
                    "the last history write took over a second",
                )),
            }
        } else {
            write.await
        };
        match written_now {
            Ok(()) => {
                written = now;
                since = at;
            }
            Err(e) => {
                tracing::warn!(subscription = %name, error = %e, "could not write the subscription's history; it is added to the next write");
            }
        }
        if stopping {
            return;
        }
    }
}

/// Milliseconds since the epoch on this machine's clock.
fn now_ms() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_a_factor_root_two_apart() {
        assert_eq!(bucket_of(Duration::from_micros(10)), 0);
        assert_eq!(bucket_of(Duration::from_micros(50)), 0);
        assert_eq!(bucket_of(Duration::from_micros(60)), 1);
        assert_eq!(bucket_of(Duration::from_micros(100)), 2);
        assert_eq!(bucket_of(Duration::from_millis(1)), 9);
        assert_eq!(bucket_of(Duration::from_secs(3600)), TIME_BUCKETS - 1);
        for i in 1..TIME_BUCKETS - 1 {
            let inside = Duration::from_secs_f64(bucket_bound_us(i) * 0.99 / 1e6);
            assert_eq!(bucket_of(inside), i, "bucket {i}");
        }
    }

    #[test]
    fn percentiles_come_from_the_buckets() {
        let mut c = Counts::default();
        assert_eq!(c.percentile_ms(0.5), None);
        c.times[bucket_of(Duration::from_millis(1))] = 90;
        c.times[bucket_of(Duration::from_millis(100))] = 10;
        let p50 = c.percentile_ms(0.5).unwrap();
        let p99 = c.percentile_ms(0.99).unwrap();
        assert!((0.7..=1.0).contains(&p50), "{p50}");
        assert!((70.0..=100.0).contains(&p99), "{p99}");
        let later = {
            let mut l = c;
            l.handled = 5;
            l.times[0] = 3;
            l
        };
        let d = later.since(&c);
        assert_eq!((d.handled, d.times[0], d.times[9]), (5, 3, 0));
        let mut sum = c;
        sum.add(&d);
        assert_eq!(sum, later);
    }
}
