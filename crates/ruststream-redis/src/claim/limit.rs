//! Rate limits on a subscription: [`RateLimit`], set with `.rate_limit(n, per)` (and on lists
//! `.rate_limit_by(header, n, per)`) on [`RedisList`](crate::RedisList) and
//! [`RedisStream`](crate::RedisStream).
//!
//! The limiter lives in Redis, next to the queue (`K.rate`, or `K.rate.keys` per key), and is
//! checked inside the script that takes the messages, on the server's clock: every worker of
//! every instance shares it, and nothing is counted on the client. `limit.lua` holds the
//! algorithm (GCRA, a burst of `n` then one every `per / n`) as a gate of the claim
//! (`GATES.rate`, see `crate::claim`): the scripts that use it are `list/claim.lua` (simple and
//! reliable lists) and `stream/read.lua` (instead of `XREADGROUP`); a partitioned queue's
//! reader reserves and gives back passes with `claim/reserve.lua` and `claim/refund.lua` on the
//! limiter's own slot. Commands: `TIME`, `GET`,
//! `SET .. PX` (whole queue) or `ZSCORE`, `ZADD`, `ZREMRANGEBYSCORE`, `PEXPIRE` (per key), within
//! those scripts; a reader held back waits (no command) for as long as the script says.
//!
//! Messages over the limit stay queued, untouched: nothing is failed, retried or counted as an
//! attempt. How many a read held back is counted in `ruststream_rate_limited_total{queue}` (a
//! message that waits through several reads counts at each).

use std::time::Duration;

use fred::prelude::*;
use ruststream_core::{ConfigError, Result};
use tokio_util::sync::CancellationToken;

use super::Gate;
use crate::keys::{KeySpace, RateKeys};

/// The limit's gate in `GATES` (`limit.lua`).
const GATE: &str = "rate";

/// At most `n` messages per `per`, across every worker of every instance: a burst of `n` after
/// a quiet spell, then one every `per / n`. So in any window of length `W`, at most
/// `n + n * W / per` messages are taken; on average `n` per `per`.
///
/// ```
/// use std::time::Duration;
/// use ruststream_redis::RedisList;
///
/// // 100 a second in all, whatever the number of instances.
/// let emails = RedisList::new("{emails}").reliable().rate_limit(100, Duration::from_secs(1));
/// // 10 a minute per customer, named by each message's `customer` header.
/// let per_customer = RedisList::new("{exports}")
///     .reliable()
///     .rate_limit_by("customer", 10, Duration::from_secs(60));
/// # let _ = (emails, per_customer);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    n: u32,
    per: Duration,
    by: Option<String>,
}

impl RateLimit {
    /// `n` messages per `per` for the whole queue.
    pub fn new(n: u32, per: Duration) -> Self {
        Self { n, per, by: None }
    }

    /// `n` messages per `per` for each value of the header `header` (a message without it
    /// counts under the empty value).
    pub fn by(header: impl Into<String>, n: u32, per: Duration) -> Self {
        Self {
            n,
            per,
            by: Some(header.into()),
        }
    }

    /// How many messages may pass per [`per`](Self::per).
    pub fn n(&self) -> u32 {
        self.n
    }

    /// The period of the limit.
    pub fn per(&self) -> Duration {
        self.per
    }

    /// The header that names each message's key, for a per-key limit.
    pub fn header(&self) -> Option<&str> {
        self.by.as_deref()
    }

    /// Refuses `n` = 0, a zero or over-long period, and an empty header name; `key` names the
    /// subscription.
    pub(crate) fn validate(&self, key: &str) -> Result<()> {
        let e = if self.n == 0 {
            ConfigError::new(
                "rate_limit",
                "needs n of at least 1 (messages per period)",
                "to stop a queue, pause it (`ruststream pause`)",
            )
        } else if self.per.is_zero() {
            ConfigError::new(
                "rate_limit",
                "needs a period longer than zero",
                "give one, e.g. `.rate_limit(100, Duration::from_secs(1))`",
            )
        } else if self.per > MAX_PER {
            ConfigError::new(
                "rate_limit",
                format!(
                    "its period is at most {} days (it is {:?})",
                    MAX_PER.as_secs() / 86_400,
                    self.per
                ),
                "use a smaller n over a shorter period",
            )
        } else if self.by.as_deref() == Some("") {
            ConfigError::new(
                "rate_limit_by",
                "the header's name is empty",
                "give the name of the header that holds each message's key",
            )
        } else {
            return Ok(());
        };
        Err(e.on(key).into())
    }

    /// The full name of the limiter's key for the queue `queue` (full name): `K.rate`, or
    /// `K.rate.keys` per key, in the queue's slot.
    pub(crate) fn key(&self, space: &KeySpace, queue: &str) -> String {
        match self.by {
            None => space.derived(queue, ".rate"),
            Some(_) => space.derived(queue, ".rate.keys"),
        }
    }

    /// What the operator's tools show of this limit on the queue `queue` (full name).
    pub(crate) fn keys(&self, space: &KeySpace, queue: &str) -> RateKeys {
        RateKeys {
            n: self.n(),
            per_ms: u64::try_from(self.per().as_millis()).unwrap_or(u64::MAX),
            by_header: self.header().map(str::to_owned),
            key: self.key(space, queue),
        }
    }

    /// The limit in the AsyncAPI bindings: `{n, perMs, byHeader?}`.
    pub(crate) fn describe(&self) -> serde_json::Value {
        let mut b = serde_json::json!({
            "n": self.n,
            "perMs": u64::try_from(self.per.as_millis()).unwrap_or(u64::MAX),
        });
        if let Some(h) = &self.by {
            b["byHeader"] = serde_json::json!(h);
        }
        b
    }

    /// The limiter of this limit on its key (see [`key`](Self::key)).
    pub(crate) fn limiter(&self, key: String) -> Limiter {
        Limiter {
            key,
            args: self.args(),
            keyed: self.by.is_some(),
        }
    }

    /// The script arguments `limit.lua`'s `rate_spec` reads: mode, n, per in µs, header.
    fn args(&self) -> [Value; 4] {
        let per_us = u64::try_from(self.per.as_micros()).unwrap_or(u64::MAX);
        [
            Value::from_static_str(if self.by.is_some() { "key" } else { "all" }),
            Value::from(self.n.to_string()),
            Value::from(per_us.to_string()),
            Value::from(self.by.clone().unwrap_or_default()),
        ]
    }
}

/// The longest period: ten years in µs stays far below 2^53, where Lua's numbers stop being
/// exact.
const MAX_PER: Duration = Duration::from_secs(10 * 365 * 86_400);

/// A rate limit as a reader sends it: the limiter's key and its script arguments.
#[derive(Debug, Clone)]
pub(crate) struct Limiter {
    /// The limiter's key (full name).
    pub(crate) key: String,
    /// `limit.lua`'s `rate_spec` arguments: mode, n, per in µs, header.
    pub(crate) args: [Value; 4],
    /// A per-key limit: entries of other keys may arrive while one key is held.
    keyed: bool,
}

/// Longest a reader of a per-key limit waits for a held key before it reads again: entries of
/// other keys may arrive meanwhile, and nothing announces them without taking them.
const KEYED_RECHECK: Duration = Duration::from_millis(100);

impl Limiter {
    /// The claim gate of this limit (`GATES.rate` in `limit.lua`).
    pub(crate) fn gate(&self) -> Gate {
        Gate::new(GATE, vec![self.key.clone()], self.args.to_vec())
    }

    /// Longest a held-back reader waits before reading again: the read's `block`, or for a
    /// per-key limit [`KEYED_RECHECK`] at most.
    pub(crate) fn wait_cap(&self, block: Duration) -> Duration {
        if self.keyed {
            block.min(KEYED_RECHECK)
        } else {
            block
        }
    }
}

/// What a limited read's script said besides the entries: how many it held back and how long
/// until the limit lets the next one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Entries the limit held back in this read.
    pub entries: u64,
    /// How long until the next may pass (zero when none was held).
    pub wait: Duration,
}

impl Held {
    /// Reads the next two integers of a script's reply: the entries held back, then the wait in
    /// ms.
    pub(crate) fn read(items: &mut impl Iterator<Item = crate::reply::Reply>) -> Self {
        let mut int = || items.next().map_or(0, |f| crate::reply::frame_u64(&f));
        let entries = int();
        Self {
            entries,
            wait: Duration::from_millis(int()),
        }
    }

    /// Counts the held entries in `ruststream_rate_limited_total{queue}`.
    pub(crate) fn count(self, queue: &str) {
        if self.entries > 0 {
            metrics::counter!("ruststream_rate_limited_total", "queue" => queue.to_owned())
                .increment(self.entries);
        }
    }

    /// Waits until the limit lets the next message pass, at most `cap`; a stop or a hurry ends
    /// the wait early. Returns at once when the limit said no wait.
    pub(crate) async fn wait(
        self,
        cap: Duration,
        stop: &CancellationToken,
        hurry: &CancellationToken,
    ) {
        if self.wait.is_zero() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(self.wait.min(cap)) => {}
            () = stop.cancelled() => {}
            () = hurry.cancelled() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option and problem of `l`'s refusal, checked to be on the subscription `q`.
    fn err(l: &RateLimit) -> (String, String) {
        let e = l.validate("q").unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.subject.as_deref(), Some("q"), "{e}");
        (config.option.to_string(), config.problem.to_string())
    }

    #[test]
    fn bad_limits_are_refused_with_the_fix() {
        let (option, problem) = err(&RateLimit::new(0, Duration::from_secs(1)));
        assert_eq!(option, "rate_limit");
        assert!(problem.contains("n of at least 1"), "{problem}");
        let (_, problem) = err(&RateLimit::new(1, Duration::ZERO));
        assert!(problem.contains("longer than zero"), "{problem}");
        let (_, problem) = err(&RateLimit::new(1, Duration::from_secs(u64::MAX)));
        assert!(problem.contains("at most"), "{problem}");
        let (option, _) = err(&RateLimit::by("", 1, Duration::from_secs(1)));
        assert_eq!(option, "rate_limit_by");
        assert!(
            RateLimit::by("k", 1, Duration::from_millis(1))
                .validate("q")
                .is_ok()
        );
    }

    #[test]
    fn the_limiter_key_is_in_the_queue_slot() {
        let cluster = KeySpace::new(String::new(), true);
        let all = RateLimit::new(5, Duration::from_secs(1));
        assert_eq!(all.key(&cluster, "jobs"), "{jobs}.rate");
        let keyed = RateLimit::by("customer", 5, Duration::from_secs(1));
        assert_eq!(keyed.key(&cluster, "{t}"), "{t}.rate.keys");
    }
}
