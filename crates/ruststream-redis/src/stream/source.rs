//! [`RedisStream`], a stream read by a consumer group, and its builder (the options it shares
//! with a list come from `crate::queue_options`, `partitions` from `crate::policy`);
//! [`StreamKeys`], the full names of its keys. Sends no command.

use crate::keys::{Delayed, KeySpace};
use crate::options::{SourceOptions, source_setters};
use crate::policy::partitions_setter;
use crate::queue_options::QueueOptions;

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
    pub(super) partitions: Option<u16>,
    /// A partition's stream: the key of the stream it is a partition of.
    pub(super) partition_of: Option<String>,
    pub(super) trim_acked: Option<std::time::Duration>,
    pub(super) readers: Option<usize>,
    /// What it shares with a list subscription: rate limit, cap, recovery.
    pub(super) queue: QueueOptions,
    pub(super) options: SourceOptions,
}

/// The concurrency from which a stream subscription reads with two readers by default (see
/// [`RedisStream::readers`]).
pub const TWO_READERS_FROM: usize = 128;

source_setters!(queue: RedisStream);
partitions_setter!(RedisStream, partitions);

impl RedisStream {
    /// A stream on `key`; set its group with [`group`](Self::group).
    pub fn new(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            group: None,
            consumer: None,
            partitions: None,
            partition_of: None,
            trim_acked: None,
            readers: None,
            queue: QueueOptions::default(),
            options: SourceOptions::default(),
        }
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
            rate: self.queue.rate.as_ref().map(|r| r.key(space, &stream)),
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
