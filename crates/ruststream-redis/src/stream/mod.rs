//! Redis Streams read by a consumer group: the [`RedisStream`] source and the [`Publish`] policy.
//!
//! An entry's body is its `payload` field; other fields are headers, except the reserved `rs.id`
//! and `rs.attempt`. This folder holds all of it:
//!
//! | file | what | Redis |
//! |---|---|---|
//! | `mod.rs` | the source's options, checks, keys; creating the group | `XGROUP CREATE key group 0 MKSTREAM` (an existing group is kept) |
//! | `receive.rs` | reading | `read.lua` (see `crate::claim`: the pause, concurrency-cap and rate-limit gates, `XREADGROUP` without `BLOCK`, `XINFO GROUPS` for what they held back) and `XREAD BLOCK ms STREAMS key <last id>` to wait |
//! | `settle.rs` | settling | `XACK key group id..` for acks; `settle.lua` (`XACK`, then `XADD` / delayed set / `LPUSH` dead letters) for the rest |
//! | `publish.rs` | publishing | `XADD key [MAXLEN ~ n \| MINID ~ id] * ..`, pipelined |
//! | `bound.lua` | a route's bound, for the scripts that re-add entries | `XTRIM key MAXLEN ~ n` or `MINID ~ <TIME - age>` |
//! | `trim.rs` | [`trim_acked`](RedisStream::trim_acked) | `trim.lua`: `XINFO GROUPS`, `XPENDING key group`, `XTRIM key MINID ~ id` |

mod publish;
mod receive;
mod recover;
mod settle;
mod trim;

use fred::prelude::*;
use fred::types::ClusterHash;
use futures::future::BoxFuture;
use ruststream_core::{ChannelDoc, Error, ErrorKind, Result};
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub(crate) use self::publish::{add, fields, xadds};

use crate::conn::Connections;
use crate::keys::{Delayed, KeySpace, SourceKeys};
use crate::limit::RateLimit;
use crate::options::{SourceOptions, source_setters};
use crate::policy::PublishPolicy;
pub use crate::policy::StreamPublish as Publish;
use crate::transport::{RedisReceiver, Transport};

/// The field that holds an entry's payload.
pub const PAYLOAD_FIELD: &str = "payload";
/// The field that holds the message id set by a RustStream publisher.
pub const ID_FIELD: &str = "rs.id";
/// The field that holds the delivery attempt of a retried entry.
pub const ATTEMPT_FIELD: &str = "rs.attempt";

/// A stream read with a consumer group.
///
/// One subscription has one `XREADGROUP` in flight at a time, on a connection of its own, and
/// decoding its replies bounds its rate (about 250-290k messages/s in the benchmark). Including
/// the same subscription twice in the app makes two consumers of the group, each with its own
/// connection, which read and decode at once (about 350k/s); or run more processes.
///
/// ```
/// use ruststream_redis::RedisStream;
/// let uploads = RedisStream::new("uploads").group("thumbnailer");
/// assert_eq!(uploads.group_name(), "thumbnailer");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct RedisStream {
    key: String,
    group: Option<String>,
    consumer: Option<String>,
    min_idle: Option<std::time::Duration>,
    no_recovery: bool,
    partitions: Option<u16>,
    /// A partition's stream: the key of the stream it is a partition of.
    partition_of: Option<String>,
    trim_acked: Option<std::time::Duration>,
    rate: Option<RateLimit>,
    max_in_flight: Option<u32>,
    options: SourceOptions,
}

source_setters!(queue: RedisStream);

impl RedisStream {
    /// A stream on `key`; set its group with [`group`](Self::group).
    pub fn new(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            group: None,
            consumer: None,
            min_idle: None,
            no_recovery: false,
            partitions: None,
            partition_of: None,
            trim_acked: None,
            rate: None,
            max_in_flight: None,
            options: SourceOptions::default(),
        }
    }

    /// Reads at most `n` entries per `per` for the group, across every consumer of every
    /// instance (a [`RateLimit`]: a burst of `n`, then one every `per / n`). One script checks
    /// the limiter (`<key>.rate`, on the server's clock), reads as many new entries as it allows
    /// and charges it for those it got; entries over the limit stay unread in the stream. A
    /// per-key limit needs a list ([`RedisList::rate_limit_by`](crate::RedisList::rate_limit_by)):
    /// a group reads in order and cannot skip an entry to read a later one. Entries claimed
    /// back from a dead consumer (after `min_idle`) were counted when first read and are not
    /// counted again.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ruststream_redis::RedisStream;
    /// let uploads = RedisStream::new("uploads")
    ///     .group("thumbnailer")
    ///     .rate_limit(50, Duration::from_secs(1));
    /// assert_eq!(uploads.rate().map(|r| r.per()), Some(Duration::from_secs(1)));
    /// ```
    pub fn rate_limit(mut self, n: u32, per: std::time::Duration) -> Self {
        self.rate = Some(RateLimit::new(n, per));
        self
    }

    /// The rate limit, if any.
    pub fn rate(&self) -> Option<&RateLimit> {
        self.rate.as_ref()
    }

    /// Handles at most `n` entries of the group at once, across every consumer of every
    /// instance. The read script counts the group's pending entries (the `XPENDING key group`
    /// summary) and reads at most `n` minus that; an ack, a retry and a dead letter free the
    /// cap. A dead consumer's pending entries hold it until another consumer claims them back
    /// (after [`min_idle`](Self::min_idle)) and settles them. A reader held back reads again
    /// after 20 ms. Needs no partitions (each partition's pending entries are in a slot of its
    /// own) and `n` >= 1. See `crate::claim::cap`.
    ///
    /// ```
    /// use ruststream_redis::RedisStream;
    /// let uploads = RedisStream::new("uploads").group("thumbnailer").max_in_flight(8);
    /// # let _ = uploads;
    /// ```
    pub fn max_in_flight(mut self, n: u32) -> Self {
        self.max_in_flight = Some(n);
        self
    }

    /// Spreads the stream over `n` streams `{key:0}` … `{key:n-1}`, each in a hash slot of its
    /// own and read by the same group, as [`RedisList::partitions`](crate::RedisList::partitions)
    /// does for lists. Order holds within a partition: publish with a
    /// [`partition_key`](ruststream_core::PublishBuilder::partition_key) to keep one key's
    /// entries in order.
    pub fn partitions(mut self, n: u16) -> Self {
        self.partitions = Some(n);
        self
    }

    /// The keys of its partitions (empty without [`partitions`](Self::partitions)).
    pub fn partition_keys(&self) -> Vec<String> {
        crate::partition::keys(&self.key, self.partitions)
    }

    /// The consumer group (created at start if missing, reading from the stream's beginning).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// This process's consumer name in the group (default: `<host>-<pid>-<random>`).
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = Some(name.into());
        self
    }

    /// How long an entry stays pending on a consumer that is gone before another consumer of
    /// the group claims it (default [`DEFAULT_MIN_IDLE`](crate::DEFAULT_MIN_IDLE)). A live
    /// consumer keeps the entries it holds from going idle, however long its handlers run.
    pub fn min_idle(mut self, idle: std::time::Duration) -> Self {
        self.min_idle = Some(idle);
        self
    }

    /// No crash recovery: entries a consumer held when it died stay pending on it until a
    /// consumer of the same name starts again (or someone claims them by hand).
    pub fn no_recovery(mut self) -> Self {
        self.no_recovery = true;
        self
    }

    /// Every `every`, drops the entries that every consumer group of the stream has
    /// acknowledged, so a stream read by groups stays bounded without losing work: never an
    /// entry pending in a group (delivered, not yet acknowledged) or not yet read by one.
    ///
    /// One script (`XINFO GROUPS`, `XPENDING` summaries, `XTRIM key MINID ~ <lowest id a group
    /// needs>`) run by every instance of the subscription; what it drops is counted in
    /// `ruststream_trimmed_total{queue}`. Trimming is approximate: whole macro nodes (100
    /// entries or 4 KB by default) go once all their entries are acknowledged.
    ///
    /// It protects the groups that exist when it runs: a group created later from `0` finds
    /// what was trimmed gone (create it with `$`, or before the first trim). A group that has
    /// read nothing keeps the whole stream.
    pub fn trim_acked(mut self, every: std::time::Duration) -> Self {
        self.trim_acked = Some(every);
        self
    }

    /// The stream's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The group name (`""` until set; the app refuses to start without one).
    pub fn group_name(&self) -> &str {
        self.group.as_deref().unwrap_or("")
    }

    /// The full names of every key this subscription uses.
    fn keys(&self, space: &KeySpace) -> StreamKeys {
        let stream = space.key(&self.key);
        StreamKeys {
            delayed: space.delayed(&stream),
            dead: space.dead(&self.key, &self.options.dead_letter),
            rate: self.rate.as_ref().map(|r| r.key(space, &stream)),
            stream,
        }
    }
}

/// The full names of a stream subscription's keys, built once when it opens.
#[derive(Debug, Clone)]
struct StreamKeys {
    stream: String,
    dead: Option<String>,
    delayed: Delayed,
    /// With a rate limit: the limiter's key.
    rate: Option<String>,
}

impl StreamKeys {
    /// The keys one script uses together, which must share a slot on a cluster.
    fn used_together(&self) -> Vec<String> {
        let mut keys = vec![
            self.stream.clone(),
            self.delayed.set.clone(),
            self.delayed.payloads.clone(),
        ];
        keys.extend(self.dead.clone());
        keys.extend(self.rate.clone());
        keys
    }
}

impl Transport for RedisStream {
    fn key(&self) -> &str {
        &self.key
    }

    fn options(&self) -> &SourceOptions {
        &self.options
    }

    fn describe(&self) -> ChannelDoc {
        ChannelDoc {
            address: self.key.clone(),
            transport: "stream",
            bindings: {
                let mut b = json!({ "group": self.group_name() });
                if let Some(n) = self.partitions {
                    b["partitions"] = json!(n);
                }
                if let Some(r) = &self.rate {
                    b["rateLimit"] = r.describe();
                }
                if let Some(n) = self.max_in_flight {
                    b["maxInFlight"] = json!(n);
                }
                b
            },
        }
    }

    fn source_keys(&self, space: &KeySpace) -> SourceKeys {
        let keys = self.keys(space);
        SourceKeys {
            name: self.key.clone(),
            transport: "stream",
            mode: format!("group {}", self.group_name()),
            paused: Some(space.paused(&keys.stream)),
            queue: keys.stream,
            processing: None,
            recovery: None,
            settle_tokens: None,
            min_idle_ms: (!self.no_recovery).then(|| {
                let idle = self.min_idle.unwrap_or(crate::options::DEFAULT_MIN_IDLE);
                u64::try_from(idle.as_millis()).unwrap_or(u64::MAX)
            }),
            group: Some(self.group_name().to_owned()),
            delayed: Some(keys.delayed.set),
            delayed_payloads: Some(keys.delayed.payloads),
            dead: keys.dead,
            concurrency: self.options.core.concurrency,
            partition_of: None,
            levels: Vec::new(),
        }
    }

    fn validate(&self, space: &KeySpace) -> Result<()> {
        let key = &self.key;
        if self.group.as_deref().is_none_or(str::is_empty) {
            return Err(Error::config(format!(
                "stream `{key}` has no consumer group: add `.group(\"name\")`"
            )));
        }
        self.options.validate(&format!("stream `{key}`"))?;
        if self.no_recovery && self.min_idle.is_some() {
            return Err(Error::config(format!(
                "stream `{key}`: no_recovery turns crash recovery off, so min_idle does not apply: remove one or the other"
            )));
        }
        if self.trim_acked.is_some_and(|d| d.is_zero()) {
            return Err(Error::config(format!(
                "stream `{key}`: trim_acked needs a period longer than zero (e.g. 10 s): it runs a script each period"
            )));
        }
        if self.min_idle.is_some_and(|d| d.is_zero()) {
            return Err(Error::config(format!(
                "stream `{key}`: min_idle must be longer than zero, or every pending entry is claimed at once"
            )));
        }
        if let Some(rate) = &self.rate {
            rate.validate(&format!("stream `{key}`"))?;
        }
        let cannot = self.partitions.is_some().then_some(
            "cannot span partitions (each partition's pending entries are in its own slot, and no one script sees them all): cap a stream without partitions, or lower each instance's `.concurrency(n)`",
        );
        crate::claim::cap::validate(&format!("stream `{key}`"), self.max_in_flight, cannot)?;
        if let Some(n) = self.partitions {
            let named = matches!(self.options.dead_letter, crate::keys::DeadLetter::Named(_));
            let named: &[&str] = if named { &["dead_letter"] } else { &[] };
            crate::partition::validate(&format!("stream `{key}`"), key, n, named)?;
            return self.partitions().iter().try_for_each(|p| p.validate(space));
        }
        space.check_same_slot(key, &self.keys(space).used_together())
    }

    fn route(&self) -> Option<PublishPolicy> {
        let publish = crate::policy::StreamPublish::new();
        Some(PublishPolicy::Stream(match self.partitions {
            Some(n) => publish.partitions(n),
            None => publish,
        }))
    }

    fn partitions(&self) -> Vec<Box<dyn Transport>> {
        crate::partition::transports(&self.key, self.partitions, |key| Self {
            key,
            partitions: None,
            partition_of: Some(self.key.clone()),
            // The limit holds over the whole stream: the partitions' reader reserves from it.
            rate: None,
            ..self.clone()
        })
    }

    fn limiter(&self, space: &KeySpace) -> Option<crate::limit::Limiter> {
        self.partitions?;
        let rate = self.rate.as_ref()?;
        Some(rate.limiter(rate.key(space, &space.key(&self.key))))
    }

    /// Creates the consumer group (and the stream) if missing.
    fn prepare<'a>(&'a self, conns: &'a Connections) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let key = conns.keys.key(&self.key);
            let group = self.group_name();
            let client = conns.pool()?.next().clone();
            let r: Result<Value, _> = client
                .custom(
                    fred::cmd!("XGROUP", hash: ClusterHash::Offset(1)),
                    vec!["CREATE", key.as_str(), group, "0", "MKSTREAM"],
                )
                .await;
            match r {
                Ok(_) => Ok(()),
                Err(e) if crate::error::kind_of(&e) == ErrorKind::GroupExists => Ok(()),
                // At maxmemory Redis refuses XGROUP CREATE before looking, even for a group that
                // exists; an existing group is all the consumer needs to drain the stream.
                Err(e)
                    if crate::error::kind_of(&e) == ErrorKind::OutOfMemory
                        && has_group(&client, &key, group).await =>
                {
                    Ok(())
                }
                Err(e) => {
                    let message = format!(
                        "cannot create consumer group `{group}` on stream `{key}`: {}",
                        crate::error::redact(e.details())
                    );
                    Err(crate::error::core_as(e, message))
                }
            }
        })
    }

    fn open<'a>(
        &'a self,
        conns: &'a Connections,
        stop: CancellationToken,
    ) -> BoxFuture<'a, Result<RedisReceiver>> {
        Box::pin(receive::open(self, conns, stop))
    }
}

/// Whether the stream `key` has the consumer group `group` (`XINFO GROUPS`).
async fn has_group(client: &Client, key: &str, group: &str) -> bool {
    let groups: Result<Value, _> = client
        .custom(
            fred::cmd!("XINFO", hash: ClusterHash::Offset(1)),
            vec!["GROUPS", key],
        )
        .await;
    let Ok(Value::Array(groups)) = groups else {
        return false;
    };
    groups.into_iter().any(|g| {
        pairs(g)
            .iter()
            .any(|(k, v)| k == "name" && v.as_str().as_deref() == Some(group))
    })
}

/// The fields of one `XINFO` record (a flat array of names and values, or a map).
pub(crate) fn pairs(record: Value) -> Vec<(String, Value)> {
    match record {
        Value::Array(fields) => {
            let mut out = Vec::with_capacity(fields.len() / 2);
            let mut it = fields.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k.as_string().unwrap_or_default(), v));
            }
            out
        }
        Value::Map(map) => map
            .inner()
            .into_iter()
            .map(|(k, v)| (k.as_str().map(str::to_owned).unwrap_or_default(), v))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untagged_streams_keep_derived_keys_in_their_slot() {
        let cluster = KeySpace::new(String::new(), true);
        assert!(
            RedisStream::new("uploads")
                .group("g")
                .validate(&cluster)
                .is_ok()
        );
        let named = RedisStream::new("uploads").group("g").dead_letter("failed");
        assert!(named.validate(&cluster).is_err());
        let e = RedisStream::new("uploads")
            .validate(&cluster)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no consumer group"), "{e}");
    }
}
