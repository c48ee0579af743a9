//! Redis Streams read by a consumer group: the [`RedisStream`] source.
//!
//! At start `XGROUP CREATE key group 0 MKSTREAM` (an existing group is kept); reads are
//! `XREADGROUP GROUP g consumer COUNT n BLOCK ms STREAMS key >`; settles are a script of `XACK`
//! (+ `XADD` for a retry, `LPUSH` to the dead-letter list). An entry's body is its `payload` field;
//! other fields are headers, except the reserved `rs.id` and `rs.attempt`.

use std::time::Duration;

use ruststream_core::{Backoff, BrokerSource, ChannelDoc, Source, SubscribeOptions};
use serde_json::json;

use crate::RedisBroker;

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
    pub(crate) key: String,
    pub(crate) group: Option<String>,
    pub(crate) consumer: Option<String>,
    pub(crate) dead_letter: Option<Option<String>>,
    pub(crate) block: Duration,
    pub(crate) scheduling: bool,
    pub(crate) opts: SubscribeOptions,
}

impl RedisStream {
    /// A stream on `key`; set its group with [`group`](Self::group).
    pub fn new(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            group: None,
            consumer: None,
            dead_letter: None,
            block: Duration::from_secs(5),
            scheduling: true,
            opts: SubscribeOptions::default(),
        }
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

    /// Names the dead-letter list (default `<key>.dead`).
    pub fn dead_letter(mut self, key: impl Into<String>) -> Self {
        self.dead_letter = Some(Some(key.into()));
        self
    }

    /// No dead-letter list.
    pub fn no_dead_letter(mut self) -> Self {
        self.dead_letter = Some(None);
        self
    }

    /// How long one blocking read waits (default 5 s).
    pub fn block(mut self, timeout: Duration) -> Self {
        self.block = timeout;
        self
    }

    /// Whether this subscription moves due entries of its delayed set (default on). Off makes
    /// the node a pure handler: other nodes move them (the seed's `enableScheduling(false)`).
    pub fn scheduling(mut self, on: bool) -> Self {
        self.scheduling = on;
        self
    }

    /// Most handlers running at once (default 128).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.opts.concurrency = n;
        self
    }

    /// Deliveries an entry gets before it goes to the dead-letter list (default 10).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.opts.max_attempts = n;
        self
    }

    /// Delay before each retry.
    pub fn retry(mut self, backoff: Backoff) -> Self {
        self.opts.retry = backoff;
        self
    }

    /// The group name (`""` until set; the app refuses to start without one).
    pub fn group_name(&self) -> &str {
        self.group.as_deref().unwrap_or("")
    }

    /// The dead-letter list's key, if there is one.
    pub fn dead_letter_key(&self) -> Option<String> {
        match &self.dead_letter {
            None => Some(format!("{}.dead", self.key)),
            Some(k) => k.clone(),
        }
    }
}

impl BrokerSource for RedisStream {
    fn key(&self) -> &str {
        &self.key
    }

    fn options(&self) -> &SubscribeOptions {
        &self.opts
    }

    fn describe(&self) -> ChannelDoc {
        ChannelDoc {
            address: self.key.clone(),
            transport: "stream",
            bindings: json!({ "group": self.group_name() }),
        }
    }
}

impl Source for RedisStream {
    type Broker = RedisBroker;
    fn into_source(self) -> crate::RedisSource {
        crate::RedisSource::Stream(self)
    }
}

/// How a message is published to a stream: `XADD key * payload .. rs.id .. <headers>`. Use it
/// with `.out_reply(..)` or [`RedisBroker::route`](crate::RedisBroker::route).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct Publish;

impl Publish {
    /// `XADD`.
    pub fn new() -> Self {
        Self
    }
}
