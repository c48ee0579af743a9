//! [`PublishPolicy`], how a message is published to a destination: one of the three transports'
//! policies. Sends no command.

use ruststream_core::Durability;

use super::channel::ChannelPublish;
use super::list::ListPublish;
use super::stream::StreamPublish;

/// How a message is published to a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

impl PublishPolicy {
    /// Over how many partitions the destination is spread, when it is.
    pub(crate) fn partitions(&self) -> Option<u16> {
        match self {
            Self::List(p) => p.layout.partitions,
            Self::Stream(p) => p.partitions,
            Self::PubSub(_) => None,
        }
    }

    /// Whether the policy can be sent to `key`; the error says what to fix.
    pub(crate) fn check(&self, key: &str) -> Result<(), ruststream_core::ConfigError> {
        match self {
            Self::Stream(p) => p.check(key),
            Self::List(p) => p.check(key),
            Self::PubSub(_) => Ok(()),
        }
    }

    /// How durable its publishes are, when they are (see [`crate::durable`]).
    pub(crate) fn durable(&self) -> Option<Durability> {
        match self {
            Self::List(p) => p.durable,
            Self::Stream(p) => p.durable,
            Self::PubSub(_) => None,
        }
    }

    /// This policy with a publish's own durability, which overrides the route's.
    pub(crate) fn with_durable(mut self, durable: Option<Durability>) -> Self {
        if durable.is_some() {
            match &mut self {
                Self::List(p) => p.durable = durable,
                Self::Stream(p) => p.durable = durable,
                Self::PubSub(_) => {}
            }
        }
        self
    }

    /// The stream policy, when this is one.
    pub(crate) fn stream(&self) -> Option<StreamPublish> {
        match self {
            Self::Stream(p) => Some(*p),
            Self::List(_) | Self::PubSub(_) => None,
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
