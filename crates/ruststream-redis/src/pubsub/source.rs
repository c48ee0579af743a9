//! [`RedisChannel`], a Pub/Sub subscription, and its builder: what it subscribes to ([`Kind`])
//! and its buffer. Sends no command.

use crate::keys::{KeySpace, escape_glob};
use crate::options::{SourceOptions, source_setters};

/// Messages a subscription buffers for its handlers by default (see the [module docs](super)).
pub const DEFAULT_BUFFER: usize = 16_384;

/// The largest buffer a subscription may ask for.
pub const MAX_BUFFER: usize = 1 << 22;

/// What a [`RedisChannel`] subscribes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `SUBSCRIBE channel`.
    Channel,
    /// `PSUBSCRIBE pattern`.
    Pattern,
    /// `SSUBSCRIBE channel`.
    Sharded,
}

impl Kind {
    /// The subscription's mode, as `inspect` and the AsyncAPI bindings name it.
    pub(super) fn mode(self) -> &'static str {
        match self {
            Self::Channel => "channel",
            Self::Pattern => "pattern",
            Self::Sharded => "sharded",
        }
    }
}

/// A Pub/Sub subscription: one channel (`SUBSCRIBE`), a glob pattern of channels
/// (`PSUBSCRIBE`) or one sharded channel (`SSUBSCRIBE`). At most once; see the
/// [module docs](super).
///
/// ```
/// use ruststream_redis::RedisChannel;
///
/// let events = RedisChannel::new("events").concurrency(32);
/// assert_eq!(events.name(), "events");
/// let all = RedisChannel::pattern("events.*").dead_letter("events.failed");
/// assert!(all.is_pattern());
/// let orders = RedisChannel::sharded("orders");
/// assert!(orders.is_sharded() && !orders.is_pattern());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct RedisChannel {
    pub(super) name: String,
    pub(super) kind: Kind,
    pub(super) buffer: usize,
    pub(super) options: SourceOptions,
}

source_setters!(base: RedisChannel);

impl RedisChannel {
    /// A subscription to the channel `name`: `SUBSCRIBE name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            kind: Kind::Channel,
            buffer: DEFAULT_BUFFER,
            options: SourceOptions::default(),
        }
    }

    /// A subscription to every channel matching the glob `pattern` (`*`, `?`, `[a-z]`, `\x`):
    /// `PSUBSCRIBE pattern`.
    pub fn pattern(pattern: impl Into<String>) -> Self {
        Self {
            kind: Kind::Pattern,
            ..Self::new(pattern)
        }
    }

    /// A subscription to the sharded channel `name` (Redis 7): `SSUBSCRIBE name` on the node
    /// owning its hash slot, followed to the new owner after a failover. Messages come from
    /// `SPUBLISH` ([`Publish::sharded`](super::Publish::sharded), the app's publisher's default
    /// for `name`) only. See the [module docs](super).
    pub fn sharded(name: impl Into<String>) -> Self {
        Self {
            kind: Kind::Sharded,
            ..Self::new(name)
        }
    }

    /// Messages read ahead of the handlers (default [`DEFAULT_BUFFER`], at most
    /// [`MAX_BUFFER`]): when that many wait, the subscription stops reading its connection
    /// until a handler takes one, and Redis holds the rest (see the [module docs](super)).
    /// Memory is taken only for messages actually waiting. On `TestApp`, messages beyond it are
    /// dropped and counted as lagged.
    pub fn buffer(mut self, messages: usize) -> Self {
        self.buffer = messages;
        self
    }

    /// The channel, or the pattern.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this is a pattern subscription (`PSUBSCRIBE`).
    pub fn is_pattern(&self) -> bool {
        self.kind == Kind::Pattern
    }

    /// Whether this is a sharded subscription (`SSUBSCRIBE`).
    pub fn is_sharded(&self) -> bool {
        self.kind == Kind::Sharded
    }

    /// The channel with the broker's prefix (in a pattern, the prefix escaped).
    pub(super) fn full_name(&self, space: &KeySpace) -> String {
        if self.is_pattern() {
            format!("{}{}", escape_glob(space.prefix()), self.name)
        } else {
            space.key(&self.name)
        }
    }
}
