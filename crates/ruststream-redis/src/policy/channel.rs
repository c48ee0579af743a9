//! [`ChannelPublish`], how a message is published to a Pub/Sub channel. Sends no command.

/// How a message is published to a channel: `PUBLISH channel frame`, or with
/// [`sharded`](Self::sharded) `SPUBLISH channel frame` (a batch in one pipeline). Use it with
/// `.out_reply(..)` or [`RedisBroker::route`](crate::RedisBroker::route); a channel a
/// `RedisChannel::new` subscription of the app reads is published to with `PUBLISH` by default,
/// one a `RedisChannel::sharded` subscription reads with `SPUBLISH`.
///
/// Nothing is stored: subscribers not connected at that moment never see the message, and a
/// delayed publish (`.delay(..)`, `.at(..)`) to a channel is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
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
