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
}

/// How a message is published to a stream: `XADD key * payload .. rs.id .. <headers>`. Use it
/// with `.out_reply(..)` or [`RedisBroker::route`](crate::RedisBroker::route).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct StreamPublish;

impl StreamPublish {
    /// `XADD`.
    pub fn new() -> Self {
        Self
    }
}

/// How a message is published to a channel: `PUBLISH channel frame`, or with
/// [`sharded`](Self::sharded) `SPUBLISH channel frame` (a batch in one pipeline). Use it with
/// `.out_reply(..)` or [`RedisBroker::route`](crate::RedisBroker::route); a channel a
/// `RedisChannel::new` subscription of the app reads is published to with `PUBLISH` by default,
/// one a `RedisChannel::sharded` subscription reads with `SPUBLISH`.
///
/// Nothing is stored: subscribers not connected at that moment never see the message, and a
/// delayed publish (`.delay(..)`, `.at(..)`) to a channel is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct ChannelPublish {
    pub(crate) sharded: bool,
}

impl ChannelPublish {
    /// `PUBLISH`: every `SUBSCRIBE`r of the channel, on any node of a cluster, gets the message.
    pub fn new() -> Self {
        Self::default()
    }

    /// `SPUBLISH`: sent to the node owning the channel's hash slot on a cluster; only
    /// `SSUBSCRIBE`rs (`RedisChannel::sharded`) get the message, `SUBSCRIBE`rs do not.
    pub fn sharded() -> Self {
        Self { sharded: true }
    }

    /// Whether this publishes with `SPUBLISH`.
    pub fn is_sharded(&self) -> bool {
        self.sharded
    }
}

/// How a message is published to a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishPolicy {
    /// `LPUSH` onto a list, optionally re-arming its expiry.
    List(ListPublish),
    /// `XADD` onto a stream.
    Stream(StreamPublish),
    /// `PUBLISH` or `SPUBLISH` on a Pub/Sub channel (nothing is stored).
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
