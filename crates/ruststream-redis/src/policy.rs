//! How a message is published to a destination: [`PublishPolicy`], and the builder of each
//! transport's policy, which users reach as [`list::Publish`](crate::list::Publish),
//! [`stream::Publish`](crate::stream::Publish) and [`pubsub::Publish`](crate::pubsub::Publish).
//! Sends no command (`publish` carries the policies out).

use std::time::Duration;

/// How a message is pushed onto a list: `LPUSH`, and with [`ttl`](Self::ttl) the key's expiry
/// re-armed in the same script, so a queue nobody feeds expires with what is left in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct ListPublish {
    pub(crate) ttl: Option<Duration>,
    pub(crate) partitions: Option<u16>,
}

impl ListPublish {
    /// Plain `LPUSH`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Re-arms the list's expiry to `ttl` on every push.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The list is spread over `n` partitions `{key:0}` … `{key:n-1}` (see
    /// [`RedisList::partitions`](crate::RedisList::partitions)): each message goes to one,
    /// round robin or by its partition key. A subscription with partitions sets this on its
    /// key's route itself; a producer-only process says it with
    /// [`RedisBroker::route`](crate::RedisBroker::route).
    pub fn partitions(mut self, n: u16) -> Self {
        self.partitions = Some(n);
        self
    }
}

/// How a message is published to a stream: `XADD key * payload .. rs.id .. <headers>`. Use it
/// with `.out_reply(..)` or [`RedisBroker::route`](crate::RedisBroker::route).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct StreamPublish {
    pub(crate) partitions: Option<u16>,
}

impl StreamPublish {
    /// `XADD`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The stream is spread over `n` partitions `{key:0}` … `{key:n-1}` (see
    /// [`RedisStream::partitions`](crate::RedisStream::partitions)), as
    /// [`ListPublish::partitions`] for lists.
    pub fn partitions(mut self, n: u16) -> Self {
        self.partitions = Some(n);
        self
    }
}

/// How a message is published to a channel: `PUBLISH channel frame` (a batch in one pipeline).
/// Use it with `.out_reply(..)` or [`RedisBroker::route`](crate::RedisBroker::route); a channel a
/// `RedisChannel::new` subscription of the app reads is published to this way by default.
///
/// Nothing is stored: subscribers not connected at that moment never see the message, and a
/// delayed publish (`.delay(..)`, `.at(..)`) to a channel is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct ChannelPublish;

impl ChannelPublish {
    /// `PUBLISH`.
    pub fn new() -> Self {
        Self
    }
}

/// How a message is published to a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishPolicy {
    /// `LPUSH` onto a list, optionally re-arming its expiry.
    List(ListPublish),
    /// `XADD` onto a stream.
    Stream(StreamPublish),
    /// `PUBLISH` on a Pub/Sub channel (nothing is stored).
    PubSub(ChannelPublish),
}

impl Default for PublishPolicy {
    /// A list `LPUSH`: what a destination no subscription of the app reads gets.
    fn default() -> Self {
        Self::List(ListPublish::new())
    }
}

impl PublishPolicy {
    /// The transport this policy publishes on, as the AsyncAPI document names it.
    pub fn transport(&self) -> &'static str {
        match self {
            Self::List(_) => "list",
            Self::Stream(_) => "stream",
            Self::PubSub(_) => "pubsub",
        }
    }
}

impl PublishPolicy {
    /// Over how many partitions the destination is spread, when it is.
    pub(crate) fn partitions(&self) -> Option<u16> {
        match self {
            Self::List(p) => p.partitions,
            Self::Stream(p) => p.partitions,
            Self::PubSub(_) => None,
        }
    }
}

impl From<ListPublish> for PublishPolicy {
    fn from(p: ListPublish) -> Self {
        Self::List(p)
    }
}

impl From<StreamPublish> for PublishPolicy {
    fn from(p: StreamPublish) -> Self {
        Self::Stream(p)
    }
}

impl From<ChannelPublish> for PublishPolicy {
    fn from(p: ChannelPublish) -> Self {
        Self::PubSub(p)
    }
}
