//! [`RedisStream`], a stream read by a consumer group, and its builder; [`StreamKeys`], the
//! full names of its keys. Sends no command.

use crate::claim::limit::RateLimit;
use crate::keys::{Delayed, KeySpace};
use crate::options::{SourceOptions, source_setters};

/// A stream read with a consumer group.
///
/// One reader has one `XREADGROUP` in flight at a time, on a connection of its own, and decoding
/// its replies bounds its rate. So a subscription whose concurrency is at least
/// [`TWO_READERS_FROM`] reads with two readers by default: two consumers of the group, each
/// with its own connection, recovery and settler, sharing the subscription's permits; set
/// another number with [`readers`](Self::readers).
///
/// ```
/// use ruststream_redis::RedisStream;
/// let uploads = RedisStream::new("uploads").group("thumbnailer");
/// assert_eq!(uploads.group_name(), "thumbnailer");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct RedisStream {
    pub(super) key: String,
    pub(super) group: Option<String>,
    pub(super) consumer: Option<String>,
    pub(super) min_idle: Option<std::time::Duration>,
    pub(super) no_recovery: bool,
    pub(super) partitions: Option<u16>,
    /// A partition's stream: the key of the stream it is a partition of.
    pub(super) partition_of: Option<String>,
    pub(super) trim_acked: Option<std::time::Duration>,
    pub(super) rate: Option<RateLimit>,
    pub(super) max_in_flight: Option<u32>,
    pub(super) readers: Option<usize>,
    pub(super) options: SourceOptions,
}

/// The concurrency from which a stream subscription reads with two readers by default (see
/// [`RedisStream::readers`]).
pub const TWO_READERS_FROM: usize = 128;

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
            readers: None,
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

    /// Reads with `n` readers (default: two when the concurrency is at least
    /// [`TWO_READERS_FROM`], else one): `n` consumers of the group in this process, each with
    /// its own connection, `XREADGROUP` in flight, recovery (its own pending entries at start,
    /// sweeps, leases) and settler, all taking the subscription's
    /// [`concurrency`](Self::concurrency) permits, so no more is claimed than with one. The first
    /// is named as [`consumer`](Self::consumer) says, the others `<name>-2` … `<name>-n`.
    /// A stream with [`partitions`](Self::partitions) reads them all with one reader.
    ///
    /// ```
    /// use ruststream_redis::RedisStream;
    /// let uploads = RedisStream::new("uploads").group("thumbnailer");
    /// assert_eq!(uploads.reader_count(), 2);
    /// assert_eq!(uploads.concurrency(16).reader_count(), 1);
    /// ```
    pub fn readers(mut self, n: usize) -> Self {
        self.readers = Some(n);
        self
    }

    /// How many readers it reads with (see [`readers`](Self::readers)).
    pub fn reader_count(&self) -> usize {
        if self.partitions.is_some() || self.partition_of.is_some() {
            return 1;
        }
        let default = if self.options.core.concurrency >= TWO_READERS_FROM {
            2
        } else {
            1
        };
        self.readers.unwrap_or(default)
    }

    /// The consumer group (created at start if missing, reading from the stream's beginning).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// This process's consumer name in the group (default: `<host>-<pid>-<random>`); its other
    /// readers' are `<name>-2` … (see [`readers`](Self::readers)).
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
    pub(super) fn keys(&self, space: &KeySpace) -> StreamKeys {
        let stream = space.key(&self.key);
        StreamKeys {
            delayed: space.delayed(&stream),
            dead: space.dead(&self.key, &self.options.dead_letter),
            rate: self.rate.as_ref().map(|r| r.key(space, &stream)),
            cancels: space.cancels(&stream),
            cancel_channel: space.cancel_channel(&stream),
            stream,
        }
    }
}

/// The full names of a stream subscription's keys, built once when it opens.
#[derive(Debug, Clone)]
pub(super) struct StreamKeys {
    pub(super) stream: String,
    pub(super) dead: Option<String>,
    pub(super) delayed: Delayed,
    /// With a rate limit: the limiter's key.
    pub(super) rate: Option<String>,
    /// The cancel record (`K.cancels`, see `crate::cancel`).
    pub(super) cancels: String,
    /// The channel cancels of running messages are signalled on (`K.cancel`).
    pub(super) cancel_channel: String,
}

impl StreamKeys {
    /// The keys one script uses together, which must share a slot on a cluster.
    pub(super) fn used_together(&self) -> Vec<String> {
        let mut keys = vec![
            self.stream.clone(),
            self.delayed.set.clone(),
            self.delayed.payloads.clone(),
            self.cancels.clone(),
        ];
        keys.extend(self.dead.clone());
        keys.extend(self.rate.clone());
        keys
    }
}
