//! A concurrency cap across workers: `.max_in_flight(n)` on a reliable
//! [`RedisList`](crate::RedisList) or a [`RedisStream`](crate::RedisStream) group. At most `n`
//! messages of the queue are being handled at once, in every instance together.
//!
//! The cap is a gate of the claim (`GATES.cap`, `cap.lua`). It counts what is in flight where
//! the queue records it already (a reliable list's processing list, which all its readers
//! share; a group's pending entries), so it adds no key, and whatever ends a claim frees it
//! without knowing of it: an ack, a retry, a dead letter, the recovery sweep of a dead worker's
//! claims. A reader held back asks again after [`RECHECK`] (nothing announces a settle in
//! another instance), or when its queue gets an entry.
//!
//! Refused where it cannot hold: a simple list (a pop records nothing in flight) and a
//! partitioned queue (each partition records its own in-flight entries in its own slot, and no
//! one script sees them all).
//!
//! Commands: `LLEN processing` or `XPENDING stream group`, within `list/claim.lua` and
//! `stream/read.lua`.

use std::time::Duration;

use fred::prelude::*;
use ruststream_core::{ConfigError, Result};

use super::Gate;
use crate::claim::limit::Held;

/// The cap's gate in `GATES` (`cap.lua`), as a claim's reply names it when it let nothing
/// through.
pub(super) const GATE: &str = "cap";

/// How long a reader the cap held back waits before it claims again.
pub(crate) const RECHECK: Duration = Duration::from_millis(20);

/// Counts the entries the cap held back in `ruststream_capped_total{queue}` (a message that
/// waits through several claims counts at each).
pub(super) fn count(held: Held, queue: &str) {
    if held.entries > 0 {
        metrics::counter!("ruststream_capped_total", "queue" => queue.to_owned())
            .increment(held.entries);
    }
}

/// Refuses a cap of 0, and a cap on a source that cannot hold one (`cannot`: why, and the
/// fix); `option` is the cap's setting (`max_in_flight`), `key` the subscription.
pub(crate) fn validate(
    key: &str,
    option: &'static str,
    cap: Option<u32>,
    cannot: Option<(&'static str, &'static str)>,
) -> Result<()> {
    let e = match (cap, cannot) {
        (None, _) => return Ok(()),
        (Some(0), _) => ConfigError::new(
            option,
            "needs at least 1 (messages handled at once)",
            "to stop a queue, pause it (`ruststream pause`)",
        ),
        (Some(_), Some((why, fix))) => ConfigError::new(option, why, fix),
        (Some(_), None) => return Ok(()),
    };
    Err(e.on(key).into())
}

impl Gate {
    /// The cap of a reliable list: a claim takes at most `n` minus the length of its processing
    /// list `processing` (full name).
    pub fn cap_list(processing: String, n: u32) -> Self {
        Self::new(GATE, vec![processing], args(n, "list", ""))
    }

    /// The cap of the consumer group `group` of `stream` (full name): a read takes at most `n`
    /// minus the group's pending entries.
    pub fn cap_group(stream: String, group: &str, n: u32) -> Self {
        Self::new(GATE, vec![stream], args(n, "group", group))
    }
}

/// `cap.lua`'s arguments: n, the recheck in ms, the measure, the group.
fn args(n: u32, measure: &'static str, group: &str) -> Vec<Value> {
    vec![
        Value::Integer(i64::from(n)),
        Value::Integer(i64::try_from(RECHECK.as_millis()).unwrap_or(i64::MAX)),
        Value::from_static_str(measure),
        Value::from(group),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_impossible_caps_are_refused_with_the_fix() {
        let cannot = Some(("needs a reliable list", "add `.reliable()`"));
        let e = validate("q", "max_in_flight", Some(0), None).unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "max_in_flight");
        assert_eq!(config.subject.as_deref(), Some("q"));
        assert!(config.problem.contains("at least 1"), "{e}");
        let e = validate("q", "group_max_in_flight", Some(3), cannot).unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "group_max_in_flight");
        assert_eq!(config.fix, "add `.reliable()`");
        assert!(validate("q", "max_in_flight", Some(3), None).is_ok());
        assert!(validate("q", "max_in_flight", None, cannot).is_ok());
    }
}
