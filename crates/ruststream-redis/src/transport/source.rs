//! [`Transport`], what one transport (`list`, `stream`, `pubsub`) does for a subscription, and
//! [`RedisSource`], the source the core sees whatever the transport, compared across transport
//! types with [`DynEq`]. Sends no command itself.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use ruststream_core::{BrokerSource, ChannelDoc, Result, Retries, SubscribeOptions};
use tokio_util::sync::CancellationToken;

use super::receiver::RedisReceiver;
use crate::conn::Connections;
use crate::keys::{KeySpace, SourceKeys};
use crate::options::SourceOptions;
use crate::policy::PublishPolicy;

/// Equality across transport types: `other` equals `self` when it is a `Self` that compares
/// equal. Every `PartialEq` transport has it.
pub(crate) trait DynEq {
    fn same_as(&self, other: &dyn Any) -> bool;
}

impl<T: PartialEq + Any> DynEq for T {
    fn same_as(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>() == Some(self)
    }
}

/// What one transport does for a subscription: check it, prepare it, open its receiver.
pub(crate) trait Transport: Any + DynEq + fmt::Debug + Send + Sync {
    /// The key (or channel) the user named.
    fn key(&self) -> &str;
    /// The options every transport has.
    fn options(&self) -> &SourceOptions;
    /// The channel, for the AsyncAPI document.
    fn describe(&self) -> ChannelDoc;
    /// Every key of the subscription, by full name, in `keys`.
    fn source_keys(&self, keys: &KeySpace) -> SourceKeys;
    /// What becomes of a retry of this transport's messages.
    fn retries(&self) -> Retries {
        Retries::Redeliver
    }
    /// Checks the configuration, and on a cluster the slot rule of the keys it uses together;
    /// the error says what to change.
    fn validate(&self, keys: &KeySpace) -> Result<()>;
    /// How the app's publisher sends to this key by default, when the transport says.
    fn route(&self) -> Option<PublishPolicy> {
        None
    }
    /// On a source spread over partitions (`crate::partition`), one transport per partition,
    /// each a whole queue of its own; empty otherwise.
    fn partitions(&self) -> Vec<Box<dyn Transport>> {
        Vec::new()
    }
    /// With partitions and a whole-queue rate limit: the logical queue's limiter, which the
    /// partitions' reader reserves passes from (`crate::claim::Reserve`); the partitions'
    /// own claims have no rate gate.
    fn limiter(&self, _space: &KeySpace) -> Option<crate::claim::limit::Limiter> {
        None
    }
    /// Prepares the server once the broker is connected (consumer groups, scripts).
    fn prepare<'a>(&'a self, conns: &'a Connections) -> BoxFuture<'a, Result<()>>;
    /// Opens the receiver, on a connection of its own.
    fn open<'a>(
        &'a self,
        conns: &'a Arc<Connections>,
        stop: CancellationToken,
    ) -> BoxFuture<'a, Result<RedisReceiver>>;
}

/// A subscription's source on Redis: a [`RedisList`](crate::RedisList),
/// [`RedisStream`](crate::RedisStream) or [`RedisChannel`](crate::RedisChannel), made with
/// `RedisSource::from(..)` or by the `#[subscriber]` macro.
#[derive(Clone)]
pub struct RedisSource(Arc<dyn Transport>);

impl RedisSource {
    pub(crate) fn new(transport: impl Transport) -> Self {
        Self(Arc::new(transport))
    }

    pub(crate) fn transport(&self) -> &dyn Transport {
        &*self.0
    }
}

impl fmt::Debug for RedisSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for RedisSource {
    fn eq(&self, other: &Self) -> bool {
        let other: &dyn Any = &*other.0;
        self.0.same_as(other)
    }
}

impl BrokerSource for RedisSource {
    fn key(&self) -> &str {
        self.0.key()
    }

    fn options(&self) -> &SubscribeOptions {
        &self.0.options().core
    }

    fn describe(&self) -> ChannelDoc {
        self.0.describe()
    }

    fn retries(&self) -> Retries {
        self.0.retries()
    }
}
