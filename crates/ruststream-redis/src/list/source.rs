//! [`RedisList`], a work queue on a Redis list, and its builder: its [`Mode`], its recovery
//! keys, its list-only options (a per-key rate limit, fair groups' limits); the options it
//! shares with a stream come from `crate::queue_options`, its layout's setters (partitions,
//! priority levels, fair groups) from `crate::policy::layout`. [`ListKeys`], the full names of
//! its keys and the checks of its recovery options. Sends no command.

use std::time::Duration;

use ruststream_core::{ConfigError, Result};

use super::levels;
use crate::claim::limit::RateLimit;
use crate::keys::{Delayed, KeySpace};
use crate::options::{SourceOptions, source_setters};
use crate::policy::{ListLayout, list_layout_setters};
use crate::queue_options::QueueOptions;

/// How entries leave the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Popped (`claim.lua`, recording nothing): the entry is gone before the handler runs; at
    /// most once.
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
    pub(super) key: String,
    pub(super) mode: Mode,
    pub(super) processing: Option<String>,
    pub(super) recovery_zset: Option<String>,
    pub(super) recovery_ttl: Option<Duration>,
    /// Its partitions, priority levels and groups: what its route says to publishers.
    pub(super) layout: ListLayout,
    pub(super) group_max_in_flight: Option<u32>,
    /// What it shares with a stream subscription: rate limit, cap, recovery.
    pub(super) queue: QueueOptions,
    pub(super) options: SourceOptions,
}

source_setters!(queue: RedisList);
list_layout_setters!(RedisList);

impl RedisList {
    /// A simple queue on `key`: popped, at most once.
    pub fn new(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            mode: Mode::Simple,
            processing: None,
            recovery_zset: None,
            recovery_ttl: None,
            layout: ListLayout::default(),
            group_max_in_flight: None,
            queue: QueueOptions::default(),
            options: SourceOptions::default(),
        }
    }

    /// Takes at most `n` messages per `per` for each value of the header `header` (a message
    /// without it counts under the empty value), across every worker of every instance. A read
    /// looks at up to 1,000 entries from the consuming end: a key over its limit leaves its
    /// entries in place, in order, while other keys' entries are taken past them; a reader held
    /// back by one key reads again within 100 ms, for other keys' new entries. The limiter is a
    /// sorted set `<key>.rate.keys`, one member per key with a pass in the last `per`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ruststream_redis::RedisList;
    /// let exports = RedisList::new("{exports}")
    ///     .reliable()
    ///     .rate_limit_by("customer", 10, Duration::from_secs(60));
    /// assert_eq!(exports.rate().and_then(|r| r.header()), Some("customer"));
    /// ```
    pub fn rate_limit_by(mut self, header: impl Into<String>, n: u32, per: Duration) -> Self {
        self.queue.rate = Some(RateLimit::by(header, n, per));
        self
    }

    /// Fair groups ([`groups`](Self::groups)) each taking at most `n` messages per `per`
    /// across every worker of every instance: a group over its limit is passed over in the
    /// round robin, the others served. It is the per-key limit
    /// ([`rate_limit_by`](Self::rate_limit_by)) keyed by the group's header `rs.group`, so it
    /// replaces a whole-queue limit (one limit a queue).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ruststream_redis::RedisList;
    /// let imports = RedisList::new("{imports}").reliable().group_rate_limit(10, Duration::from_secs(1));
    /// assert_eq!(imports.rate().and_then(|r| r.header()), Some("rs.group"));
    /// ```
    pub fn group_rate_limit(self, n: u32, per: Duration) -> Self {
        self.groups().rate_limit_by(super::groups::HEADER, n, per)
    }

    /// Fair groups ([`groups`](Self::groups)) each with at most `n` messages being handled at
    /// once, across every worker of every instance: a group at its cap is passed over in the
    /// round robin, the others served. Like [`max_in_flight`](Self::max_in_flight) it counts
    /// what the processing list holds (each entry's `rs.group` header, read by every claim: a
    /// claim costs O(in flight) more), so an ack, a retry, a dead letter, a timeout and the
    /// recovery sweep free a group's place without knowing of it; a reader held back claims
    /// again after 20 ms. Needs a reliable list without partitions, and `n` >= 1; combines with
    /// the whole-queue cap and the per-group rate limit.
    ///
    /// ```
    /// use ruststream_redis::RedisList;
    /// // At most two imports of one tenant at once; the other tenants' go on.
    /// let imports = RedisList::new("{imports}").reliable().group_max_in_flight(2);
    /// assert!(imports.has_groups());
    /// ```
    pub fn group_max_in_flight(mut self, n: u32) -> Self {
        self.group_max_in_flight = Some(n);
        self.groups()
    }

    /// Whether the queue has fair groups.
    pub fn has_groups(&self) -> bool {
        self.layout.groups
    }

    /// The keys of its priority levels, lowest first (without the broker's prefix, as on a
    /// standalone server; just the key without [`priorities`](Self::priorities)).
    pub fn level_keys(&self) -> Vec<String> {
        let mut keys = vec![self.key.clone()];
        keys.extend(levels::keys(
            &KeySpace::default(),
            &self.key,
            self.layout.priorities,
        ));
        keys
    }

    /// The keys of its partitions (empty without [`partitions`](Self::partitions)).
    pub fn partition_keys(&self) -> Vec<String> {
        crate::partition::keys(&self.key, self.layout.partitions)
    }

    /// Claims entries into a processing list instead of popping them: at least once. Crash
    /// recovery is on: every claim is recorded in a recovery set (`<key>.claims` unless
    /// [`recovery_zset`](Self::recovery_zset) names one), kept alive while its worker lives, and
    /// a dead worker's claims come back to the queue after [`min_idle`](Self::min_idle)
    /// ([`DEFAULT_MIN_IDLE`](crate::DEFAULT_MIN_IDLE) by default).
    /// [`no_recovery`](Self::no_recovery) turns it off.
    pub fn reliable(mut self) -> Self {
        self.mode = Mode::Reliable;
        self
    }

    /// Names the processing list (default `<key>.processing`).
    pub fn processing(mut self, key: impl Into<String>) -> Self {
        self.processing = Some(key.into());
        self
    }

    /// Records each claim in this sorted set (default `<key>.claims`), scored by claim time, for
    /// crash recovery. Naming the set needs [`min_idle`](Self::min_idle) too.
    pub fn recovery_zset(mut self, key: impl Into<String>) -> Self {
        self.recovery_zset = Some(key.into());
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
    pub(super) fn keys(&self, space: &KeySpace) -> ListKeys {
        let queue = space.key(&self.key);
        let reliable = self.mode == Mode::Reliable;
        ListKeys {
            delayed: space.delayed(&queue),
            processing: reliable.then(|| space.processing(&self.key, self.processing.as_deref())),
            recovery: (reliable && !self.queue.no_recovery).then(|| match &self.recovery_zset {
                Some(z) => space.key(z),
                None => space.derived(&queue, ".claims"),
            }),
            settle_tokens: (reliable && self.queue.no_recovery)
                .then(|| space.derived(&queue, ".settles")),
            dead: space.dead(&self.key, &self.options.dead_letter),
            rate: self.queue.rate.as_ref().map(|r| r.key(space, &queue)),
            levels: levels::keys(space, &queue, self.layout.priorities),
            ring: self
                .layout
                .groups
                .then(|| super::groups::ring(space, &queue)),
            cancels: space.cancels(&queue),
            cancel_channel: space.cancel_channel(&queue),
            queue,
        }
    }

    /// A named recovery set needs `min_idle`, its ttl must outlive `min_idle`, and none of them
    /// go with `no_recovery`.
    pub(super) fn check_recovery(&self) -> Result<()> {
        let key = &self.key;
        let queue = &self.queue;
        let recovery_options =
            self.recovery_zset.is_some() || queue.min_idle.is_some() || self.recovery_ttl.is_some();
        let e = if queue.no_recovery && recovery_options {
            ConfigError::new(
                "no_recovery",
                "no_recovery turns crash recovery off, so recovery_zset, min_idle and recovery_ttl do not apply",
                "remove one or the other",
            )
        } else if self.mode == Mode::Simple && (recovery_options || queue.no_recovery) {
            ConfigError::new(
                "recovery options",
                "recovery options need a reliable list",
                "add `.reliable()`",
            )
        } else if let (Some(z), None) = (&self.recovery_zset, queue.min_idle) {
            ConfigError::new(
                "recovery_zset",
                format!("recovery_zset `{z}` needs min_idle"),
                "add `.min_idle(Duration::from_secs(60))`, how long a dead worker's claims take to come back",
            )
        } else if queue.idle().is_zero() {
            ConfigError::new(
                "min_idle",
                "must be longer than zero, or every claim is recovered at once",
                "give how long a dead worker's claims take to come back, e.g. `.min_idle(Duration::from_secs(60))`",
            )
        } else if let Some(ttl) = self.recovery_ttl.filter(|ttl| *ttl <= queue.idle()) {
            ConfigError::new(
                "recovery_ttl",
                format!(
                    "recovery_ttl ({ttl:?}) must be longer than min_idle ({:?}), or the set expires under live claims",
                    queue.idle()
                ),
                "raise recovery_ttl above min_idle, or lower min_idle",
            )
        } else {
            return Ok(());
        };
        Err(e.on(key.as_str()).into())
    }
}

/// The full names of a list subscription's keys, built once when it opens.
#[derive(Debug, Clone)]
pub(super) struct ListKeys {
    pub(super) queue: String,
    /// Reliable lists only.
    pub(super) processing: Option<String>,
    /// With crash recovery only.
    pub(super) recovery: Option<String>,
    /// Reliable lists without crash recovery: the settle tokens already used.
    pub(super) settle_tokens: Option<String>,
    pub(super) dead: Option<String>,
    pub(super) delayed: Delayed,
    /// With a rate limit: the limiter's key.
    pub(super) rate: Option<String>,
    /// Priority levels 1 … n-1 (level 0 is the queue); empty without levels.
    pub(super) levels: Vec<String>,
    /// With fair groups: the ring of non-empty groups (`crate::list::groups`).
    pub(super) ring: Option<String>,
    /// The cancel record (`crate::cancel`).
    pub(super) cancels: String,
    /// The channel a cancel of a running message is signalled on.
    pub(super) cancel_channel: String,
}

impl ListKeys {
    /// The keys one script uses together, which must share a slot on a cluster.
    pub(super) fn used_together(&self) -> Vec<String> {
        let mut keys = vec![self.queue.clone()];
        keys.extend(self.processing.clone());
        keys.extend([self.delayed.set.clone(), self.delayed.payloads.clone()]);
        keys.extend(self.dead.clone());
        if let Some(set) = &self.recovery {
            // A claimed batch's list, `<set>:<member>` (`list/claim.lua`).
            keys.extend([set.clone(), format!("{set}:batch")]);
        }
        keys.extend(self.settle_tokens.clone());
        keys.extend(self.rate.clone());
        keys.extend(self.levels.iter().cloned());
        if let Some(ring) = &self.ring {
            keys.push(ring.clone());
            keys.push(super::groups::paused(ring));
        }
        keys.push(self.cancels.clone());
        keys
    }
}
