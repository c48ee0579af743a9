//! Work queues on Redis lists: the [`RedisList`] source and the [`Publish`] policy.
//!
//! Producers `LPUSH`; consumers take from the right, so entries come out in the order they went
//! in. A simple list pops: at most once. A reliable list claims into a processing list and
//! settles with `LREM`: at least once. This folder holds all of it:
//!
//! | file | what | Redis |
//! |---|---|---|
//! | `mod.rs` | the source's options, its checks, its keys | none |
//! | `receive.rs` | reading | simple: `RPOP key n`, `BRPOP` when empty; reliable: `claim.lua`, `BLMOVE key key RIGHT RIGHT t` to wait when empty |
//! | `settle.rs` | settling a reliable list | `settle.lua` (`LREM`, `LPUSH`, `ZADD`/`HSET`, `ZREM`) |
//! | `publish.rs` | publishing | `LPUSH`, `push_ttl.lua` |
//!
//! A simple list's settle only pushes dead letters (see `crate::dead`).

mod publish;
mod receive;
mod settle;

use std::time::Duration;

use futures::future::BoxFuture;
use ruststream_core::{ChannelDoc, Error, Result, Retries, Source};
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub(crate) use self::publish::push;
use crate::RedisBroker;
use crate::conn::Connections;
use crate::keys::{Delayed, KeySpace};
use crate::options::{SourceOptions, source_setters};
pub use crate::policy::ListPublish as Publish;
use crate::transport::{RedisReceiver, RedisSource, Transport, same_as};

/// How entries leave the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Popped (`RPOP`/`BRPOP`): the entry is gone before the handler runs; at most once.
    Simple,
    /// Claimed into a processing list, removed when settled; at least once.
    Reliable,
}

/// A work queue on a Redis list.
///
/// ```
/// use std::time::Duration;
/// use ruststream_redis::RedisList;
///
/// let simple = RedisList::new("cache.warmups");
/// let reliable = RedisList::new("{thumbnails}")
///     .reliable()
///     .concurrency(16)
///     .block(Duration::from_secs(2));
/// assert_eq!(reliable.processing_key(), "{thumbnails}.processing");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct RedisList {
    key: String,
    mode: Mode,
    processing: Option<String>,
    recovery_zset: Option<String>,
    min_idle: Option<Duration>,
    recovery_ttl: Option<Duration>,
    options: SourceOptions,
}

source_setters!(queue: RedisList);

impl RedisList {
    /// A simple queue on `key`: popped, at most once.
    pub fn new(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            mode: Mode::Simple,
            processing: None,
            recovery_zset: None,
            min_idle: None,
            recovery_ttl: None,
            options: SourceOptions::default(),
        }
    }

    /// Claims entries into a processing list instead of popping them: at least once.
    pub fn reliable(mut self) -> Self {
        self.mode = Mode::Reliable;
        self
    }

    /// Names the processing list (default `<key>.processing`).
    pub fn processing(mut self, key: impl Into<String>) -> Self {
        self.processing = Some(key.into());
        self
    }

    /// Records each claim in this sorted set, scored by claim time, for crash recovery.
    pub fn recovery_zset(mut self, key: impl Into<String>) -> Self {
        self.recovery_zset = Some(key.into());
        self
    }

    /// Claims idle longer than this belong to no live worker and go back to the queue.
    pub fn min_idle(mut self, idle: Duration) -> Self {
        self.min_idle = Some(idle);
        self
    }

    /// Lets an abandoned recovery set expire; must be longer than `min_idle`.
    pub fn recovery_ttl(mut self, ttl: Duration) -> Self {
        self.recovery_ttl = Some(ttl);
        self
    }

    /// The queue's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The processing list's key (without the broker's prefix).
    pub fn processing_key(&self) -> String {
        self.processing
            .clone()
            .unwrap_or_else(|| format!("{}.processing", self.key))
    }

    /// The delivery mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The full names of every key this subscription uses.
    fn keys(&self, space: &KeySpace) -> ListKeys {
        let queue = space.key(&self.key);
        let reliable = self.mode == Mode::Reliable;
        ListKeys {
            delayed: space.delayed(&queue),
            processing: reliable.then(|| space.processing(&self.key, self.processing.as_deref())),
            recovery: self.recovery_zset.as_deref().map(|z| space.key(z)),
            dead: space.dead(&self.key, &self.options.dead_letter),
            queue,
        }
    }

    /// The recovery set needs `min_idle`, and its ttl must outlive `min_idle`.
    fn check_recovery(&self) -> Result<()> {
        let key = &self.key;
        match (&self.recovery_zset, self.min_idle, self.recovery_ttl) {
            (Some(z), None, _) => Err(Error::config(format!(
                "list `{key}`: recovery_zset `{z}` needs min_idle: add `.min_idle(Duration::from_secs(60))`, longer than the slowest handler ever takes"
            ))),
            (Some(z), Some(idle), Some(ttl)) if ttl <= idle => Err(Error::config(format!(
                "list `{key}`: recovery_ttl ({ttl:?}) of `{z}` must be longer than min_idle ({idle:?}), or the set expires under live claims"
            ))),
            (Some(_), Some(idle), _) if idle.is_zero() => Err(Error::config(format!(
                "list `{key}`: min_idle must be longer than zero, or every claim is recovered at once"
            ))),
            (None, Some(_), _) | (None, _, Some(_)) => Err(Error::config(format!(
                "list `{key}`: min_idle and recovery_ttl need a recovery set: add `.recovery_zset(\"{key}.claims\")`"
            ))),
            _ => Ok(()),
        }
    }
}

/// The full names of a list subscription's keys, built once when it opens.
#[derive(Debug, Clone)]
struct ListKeys {
    queue: String,
    /// Reliable lists only.
    processing: Option<String>,
    /// With crash recovery only.
    recovery: Option<String>,
    dead: Option<String>,
    delayed: Delayed,
}

impl ListKeys {
    /// The keys one script uses together, which must share a slot on a cluster.
    fn used_together(&self) -> Vec<String> {
        let mut keys = vec![self.queue.clone()];
        keys.extend(self.processing.clone());
        keys.extend([self.delayed.set.clone(), self.delayed.payloads.clone()]);
        keys.extend(self.dead.clone());
        keys.extend(self.recovery.clone());
        keys
    }
}

impl Transport for RedisList {
    fn key(&self) -> &str {
        &self.key
    }

    fn options(&self) -> &SourceOptions {
        &self.options
    }

    fn describe(&self) -> ChannelDoc {
        let mut bindings = json!({
            "mode": match self.mode { Mode::Simple => "simple", Mode::Reliable => "reliable" },
        });
        if self.mode == Mode::Reliable {
            bindings["processing"] = json!(self.processing_key());
        }
        if let Some(z) = &self.recovery_zset {
            bindings["recoveryZset"] = json!(z);
        }
        ChannelDoc {
            address: self.key.clone(),
            transport: "list",
            bindings,
        }
    }

    /// A simple list popped the entry before its handler ran: a retry settles nothing.
    fn retries(&self) -> Retries {
        match self.mode {
            Mode::Simple => Retries::Ignored,
            Mode::Reliable => Retries::Redeliver,
        }
    }

    fn validate(&self, space: &KeySpace) -> Result<()> {
        let key = &self.key;
        if key.is_empty() {
            return Err(Error::config("a RedisList has an empty key: name the list"));
        }
        self.options.validate(&format!("list `{key}`"))?;
        if self.mode == Mode::Simple && (self.processing.is_some() || self.recovery_zset.is_some())
        {
            return Err(Error::config(format!(
                "list `{key}`: processing and recovery_zset need a reliable list; add `.reliable()`"
            )));
        }
        self.check_recovery()?;
        if self.mode == Mode::Reliable && self.processing_key() == *key {
            return Err(Error::config(format!(
                "list `{key}`: the processing list must differ from the queue"
            )));
        }
        space.check_same_slot(key, &self.keys(space).used_together())
    }

    fn prepare<'a>(&'a self, _: &'a Connections) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn open<'a>(
        &'a self,
        conns: &'a Connections,
        stop: CancellationToken,
    ) -> BoxFuture<'a, Result<RedisReceiver>> {
        Box::pin(receive::open(self, conns, stop))
    }

    fn same_as(&self, other: &dyn std::any::Any) -> bool {
        same_as(self, other)
    }
}

impl From<RedisList> for RedisSource {
    fn from(list: RedisList) -> Self {
        Self::new(list)
    }
}

impl Source for RedisList {
    type Broker = RedisBroker;
    fn into_source(self) -> RedisSource {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(l: &RedisList) -> String {
        l.validate(&KeySpace::default()).unwrap_err().to_string()
    }

    #[test]
    fn recovery_needs_min_idle_and_a_longer_ttl() {
        let l = RedisList::new("{t}").reliable().recovery_zset("{t}.claims");
        assert!(err(&l).contains("needs min_idle"));
        let l = l.min_idle(Duration::from_secs(60));
        assert!(l.validate(&KeySpace::default()).is_ok());
        assert!(
            err(&l.recovery_ttl(Duration::from_secs(60))).contains("must be longer than min_idle")
        );
        assert!(
            err(&RedisList::new("q")
                .reliable()
                .min_idle(Duration::from_secs(1)))
            .contains("recovery_zset")
        );
    }

    #[test]
    fn on_a_cluster_untagged_simple_lists_pass_and_untagged_reliable_ones_get_the_tag() {
        let cluster = KeySpace::new("app:".into(), true);
        let simple = RedisList::new("cache.warmups");
        let keys = simple.keys(&cluster).used_together();
        assert!(
            keys.contains(&"{app:cache.warmups}.delayed".to_owned()),
            "{keys:?}"
        );
        assert!(
            keys.contains(&"{app:cache.warmups}.dead".to_owned()),
            "{keys:?}"
        );
        assert!(simple.validate(&cluster).is_ok());
        let e = err_on(&RedisList::new("jobs").reliable(), &cluster);
        assert!(e.contains("hash tag: `{jobs}`"), "{e}");
        let tagged = RedisList::new("{thumbnails}")
            .reliable()
            .recovery_zset("{thumbnails}.claims")
            .min_idle(Duration::from_secs(1));
        assert!(tagged.validate(&cluster).is_ok());
        let stray = RedisList::new("{t}")
            .reliable()
            .recovery_zset("claims")
            .min_idle(Duration::from_secs(1));
        assert!(stray.validate(&cluster).is_err());
    }

    fn err_on(l: &RedisList, space: &KeySpace) -> String {
        l.validate(space).unwrap_err().to_string()
    }
}
