//! Work queues on Redis lists: the [`RedisList`] source and the [`Publish`] policy.
//!
//! Producers `LPUSH`; consumers take from the right, so entries come out in the order they went
//! in. A simple list pops (`RPOP key n`, `BRPOP` when empty): at most once. A reliable list claims
//! instead (`LMOVE key key.processing RIGHT LEFT` in a script, `BLMOVE key key RIGHT RIGHT t` to
//! wait when empty) and settles with `LREM` on the processing list: at least once. The commands
//! live in `reader`; this module is configuration.

use std::time::Duration;

use ruststream_core::{Backoff, BrokerSource, ChannelDoc, Source, SubscribeOptions};
use serde_json::json;

use crate::RedisBroker;

/// How entries leave the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `BRPOP`: the entry is gone before the handler runs; at most once.
    Simple,
    /// `LMOVE` into a processing list, removed when settled; at least once.
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
    pub(crate) key: String,
    pub(crate) mode: Mode,
    pub(crate) processing: Option<String>,
    pub(crate) dead_letter: Option<Option<String>>,
    pub(crate) block: Duration,
    pub(crate) recovery_zset: Option<String>,
    pub(crate) min_idle: Option<Duration>,
    pub(crate) recovery_ttl: Option<Duration>,
    pub(crate) scheduling: bool,
    pub(crate) opts: SubscribeOptions,
}

impl RedisList {
    /// A simple queue on `key`: `BRPOP`, at most once.
    pub fn new(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            mode: Mode::Simple,
            processing: None,
            dead_letter: None,
            block: Duration::from_secs(5),
            recovery_zset: None,
            min_idle: None,
            recovery_ttl: None,
            scheduling: true,
            opts: SubscribeOptions::default(),
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

    /// Names the dead-letter list (default `<key>.dead`): dropped, undecodable and exhausted
    /// entries land there with a `reason` header.
    pub fn dead_letter(mut self, key: impl Into<String>) -> Self {
        self.dead_letter = Some(Some(key.into()));
        self
    }

    /// No dead-letter list: such entries are removed, with an error log.
    pub fn no_dead_letter(mut self) -> Self {
        self.dead_letter = Some(None);
        self
    }

    /// How long one blocking read waits for an entry (default 5 s).
    pub fn block(mut self, timeout: Duration) -> Self {
        self.block = timeout;
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

    /// Whether this subscription moves due entries of its delayed set (default on). Off makes
    /// the node a pure handler: other nodes move them (the seed's `enableScheduling(false)`).
    pub fn scheduling(mut self, on: bool) -> Self {
        self.scheduling = on;
        self
    }

    /// Most handlers running at once (default 128); claims never run ahead of them.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.opts.concurrency = n;
        self
    }

    /// Deliveries an entry gets before it goes to the dead-letter list (default 10).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.opts.max_attempts = n;
        self
    }

    /// Delay before each retry (default: exponential from 1 s, capped at 1024 s, ±20 %).
    pub fn retry(mut self, backoff: Backoff) -> Self {
        self.opts.retry = backoff;
        self
    }

    /// The queue's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The processing list's key.
    pub fn processing_key(&self) -> String {
        self.processing
            .clone()
            .unwrap_or_else(|| format!("{}.processing", self.key))
    }

    /// The dead-letter list's key, if there is one.
    pub fn dead_letter_key(&self) -> Option<String> {
        match &self.dead_letter {
            None => Some(format!("{}.dead", self.key)),
            Some(k) => k.clone(),
        }
    }

    /// The delayed set for retries (`<key>.delayed`) and its payload hash.
    pub fn delayed_keys(&self) -> (String, String) {
        delayed_keys(&self.key)
    }

    /// The delivery mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }
}

/// The delayed set of a destination and its payload hash: `K.delayed`, `K.delayed.payloads`.
pub(crate) fn delayed_keys(key: &str) -> (String, String) {
    (format!("{key}.delayed"), format!("{key}.delayed.payloads"))
}

/// A name derived from the (prefixed) key `key` of a subscription: `key` + `suffix`.
///
/// On a cluster, the derived names a script uses with `key` must share its slot. A key with a
/// hash tag passes it on (`{thumbnails}.dead`); an untagged one is put whole in a tag
/// (`app:uploads` → `{app:uploads}.dead`), which hashes like the untagged key itself, so a
/// simple list or a stream need no tag to run on a cluster. Standalone names stay `key.suffix`.
pub(crate) fn derived(key: &str, suffix: &str, cluster: bool) -> String {
    if cluster && !has_hash_tag(key) {
        format!("{{{key}}}{suffix}")
    } else {
        format!("{key}{suffix}")
    }
}

/// Whether Redis Cluster hashes only part of `key`: a `{` followed later by a `}` with
/// something between them.
pub(crate) fn has_hash_tag(key: &str) -> bool {
    key.find('{')
        .is_some_and(|open| key[open + 1..].find('}').is_some_and(|len| len > 0))
}

impl BrokerSource for RedisList {
    fn key(&self) -> &str {
        &self.key
    }

    fn options(&self) -> &SubscribeOptions {
        &self.opts
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
}

impl Source for RedisList {
    type Broker = RedisBroker;
    fn into_source(self) -> crate::RedisSource {
        crate::RedisSource::List(self)
    }
}

/// How a message is pushed onto a list: `LPUSH`, and with [`ttl`](Self::ttl) the key's expiry
/// re-armed in the same script, so a queue nobody feeds expires with what is left in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct Publish {
    pub(crate) ttl: Option<Duration>,
}

impl Publish {
    /// Plain `LPUSH`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Re-arms the list's expiry to `ttl` on every push.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
}
