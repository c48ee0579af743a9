//! [`StreamPublish`], how a message is added to a stream, and the bound a route puts on it.
//! Sends no command.

use std::time::Duration;

use ruststream_core::{ConfigError, Durability};

use super::setters::{durable_setter, partitions_setter};

/// How a message is published to a stream: `XADD key [MAXLEN|MINID ~ ..] * payload .. rs.id ..
/// <headers>`. Use it with `.out_reply(..)` or [`RedisBroker::route`](crate::RedisBroker::route);
/// a route of the key a stream subscription reads also bounds that subscription's retries, due
/// delayed entries and requeued dead letters (they `XTRIM` the same way in their scripts).
///
/// Trimming is approximate (`~`): Redis drops whole macro nodes only (100 entries or 4 KB by
/// default), so the stream keeps at least the bound and at most about a node more, at a fraction
/// of the cost of exact trimming. It drops entries whatever the consumer groups have read: to
/// trim only what every group has acknowledged, use
/// [`RedisStream::trim_acked`](crate::RedisStream::trim_acked) instead.
///
/// ```
/// use std::time::Duration;
/// use ruststream_redis::stream;
/// let last_hour = stream::Publish::new().minid(Duration::from_secs(3600));
/// assert!(last_hour.check("events").is_ok());
/// let both = stream::Publish::new().maxlen(1000).minid(Duration::from_secs(3600));
/// assert!(both.check("events").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[must_use]
pub struct StreamPublish {
    pub(crate) partitions: Option<u16>,
    pub(crate) maxlen: Option<u64>,
    pub(crate) min_age: Option<Duration>,
    pub(crate) durable: Option<Durability>,
}

partitions_setter!(StreamPublish, partitions);
durable_setter!(StreamPublish);

impl StreamPublish {
    /// `XADD` without trimming.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps about the newest `n` entries: `XADD key MAXLEN ~ n * ..`. On a stream spread over
    /// partitions, each partition keeps about `n`.
    pub fn maxlen(mut self, n: u64) -> Self {
        self.maxlen = Some(n);
        self
    }

    /// Drops entries older than `age`: `XADD key MINID ~ <now - age> * ..`, where now is the
    /// publisher's clock for a publish and the server's (`TIME`) in the scripts that re-add
    /// entries. Entry ids are the server's milliseconds, so a publisher whose clock runs ahead
    /// of the server's trims that much younger; keep `age` well above the clocks' skew.
    pub fn minid(mut self, age: Duration) -> Self {
        self.min_age = Some(age);
        self
    }

    /// Whether the policy can be sent, for the destination `key`; the error says what to fix.
    ///
    /// # Errors
    /// Both a `maxlen` and a `minid`, a `maxlen` of 0 or a `minid` age under a millisecond.
    pub fn check(&self, key: &str) -> Result<(), ConfigError> {
        let e = match (self.maxlen, self.min_age) {
            (Some(_), Some(_)) => ConfigError::new(
                "maxlen",
                "maxlen and minid both bound the stream",
                "choose one",
            ),
            (Some(0), None) => ConfigError::new(
                "maxlen",
                "maxlen(0) would empty the stream on every publish",
                "give the number of entries to keep",
            ),
            (None, Some(age)) if age.as_millis() == 0 => ConfigError::new(
                "minid",
                "needs an age of at least a millisecond, or every publish drops everything older than itself",
                "give how long entries are kept, e.g. an hour",
            ),
            _ => return Ok(()),
        };
        Err(e.on(key))
    }

    /// The trimming arguments of a plain `XADD` published at `now_ms` (the publisher's clock):
    /// `MAXLEN ~ n`, `MINID ~ <now - age>-0`, or none.
    pub(crate) fn xadd_args(&self, now_ms: u64) -> Option<[String; 3]> {
        if let Some(n) = self.maxlen {
            return Some(["MAXLEN".into(), "~".into(), n.to_string()]);
        }
        let age = u64::try_from(self.min_age?.as_millis()).unwrap_or(u64::MAX);
        let min = now_ms.saturating_sub(age);
        Some(["MINID".into(), "~".into(), format!("{min}-0")])
    }

    /// The bound as the scripts take it (`bound.lua`): `maxlen:<n>`, `minage:<ms>` or `""`.
    pub(crate) fn script_arg(&self) -> String {
        match (self.maxlen, self.min_age) {
            (Some(n), _) => format!("maxlen:{n}"),
            (None, Some(age)) => format!("minage:{}", age.as_millis()),
            (None, None) => String::new(),
        }
    }
}
