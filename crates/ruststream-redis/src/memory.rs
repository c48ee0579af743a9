//! The seam that lets a [`RedisBroker`](crate::RedisBroker) run on an in-memory server instead of Redis, for tests
//! (`ruststream::testing::TestApp`; the model itself lives in the `ruststream-testing` crate).
//!
//! With the cargo feature `testing`, [`RedisBroker::attach_memory`](crate::RedisBroker::attach_memory) hands the broker a
//! [`MemoryServer`]; every client the broker builds then carries it as fred's mocking layer
//! (`Config::mocks`), so no socket is ever opened and every command (scripts, pipelines, custom
//! commands) goes to the model. Everything above the connection — readers, settlers, publishers,
//! the scripts' keys and arguments — is the production code.
//!
//! Two things cannot go through fred's synchronous mock interface, and only these use the seam:
//! - **Blocking reads.** The model answers `BRPOP`, `BLMOVE` and `XREADGROUP .. BLOCK` at once
//!   (like their non-blocking forms). Before sending one, the reader awaits
//!   [`MemoryServer::ready`]: the model resolves it when the read would return something (the
//!   list has an entry, the group has a new stream entry) or when the block time is up, on the
//!   tokio clock (virtual under `start_paused`).
//! - **Pub/sub.** Messages a real server pushes to a subscriber connection come from
//!   [`MemoryServer::subscribe`] (the wake-ups of delayed-set readers, `RedisChannel::new`
//!   subscriptions), [`MemoryServer::psubscribe`] (`RedisChannel::pattern`) and
//!   [`MemoryServer::ssubscribe`] (`RedisChannel::sharded`) instead. A sharded subscription the
//!   server ends (its receiver closes: the model's `SUNSUBSCRIBE` of a moved slot) subscribes
//!   again at once, as a real one renews its `SSUBSCRIBE`.
//!
//! Without the feature this module compiles to no-ops and production builds carry no mocking
//! code.

#[cfg(feature = "testing")]
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
#[cfg(feature = "testing")]
use futures::future::BoxFuture;
use tokio::sync::Notify;

/// What a blocking read waits for; the model decides when it is ready.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockingRead {
    /// `BRPOP key` or `BLMOVE key ..`: ready when the list `key` (prefixed) is not empty.
    List {
        /// The list's full key.
        key: String,
    },
    /// `XREADGROUP GROUP group .. STREAMS key >`: ready when the stream has an entry the group
    /// has not been delivered yet.
    Stream {
        /// The stream's full key.
        key: String,
        /// The consumer group.
        group: String,
    },
}

/// An in-memory server with the Redis semantics the broker relies on.
///
/// fred hands it every command ([`fred::mocks::Mocks::process_command`]); the two methods here
/// cover what a synchronous mock cannot (see the [module docs](self)).
#[cfg(feature = "testing")]
pub trait MemoryServer: fred::mocks::Mocks {
    /// Resolves when `read` would return something, or after `timeout` (on the tokio clock).
    /// It may resolve early (spuriously); the reader then sends the read and gets nothing.
    fn ready(&self, read: &BlockingRead, timeout: Duration) -> BoxFuture<'static, ()>;

    /// Messages `PUBLISH`ed to `channel` from now on.
    fn subscribe(&self, channel: &str) -> tokio::sync::broadcast::Receiver<Bytes>;

    /// Messages `PUBLISH`ed from now on to any channel matching the glob `pattern`, each with
    /// its channel: what `PSUBSCRIBE pattern` gets. A server without pattern subscriptions
    /// keeps this default, whose receiver is closed at once (the subscription then fails to
    /// read, with an error that says so).
    fn psubscribe(&self, pattern: &str) -> tokio::sync::broadcast::Receiver<(Bytes, Bytes)> {
        let _ = pattern;
        tokio::sync::broadcast::channel(1).1
    }

    /// The server's clock, ms since the epoch, when it is not the wall clock (a model on a
    /// paused clock): the publisher counts a stream's `minid` age back from it. `None`: the
    /// wall clock.
    fn clock_ms(&self) -> Option<u64> {
        None
    }

    /// Messages `SPUBLISH`ed to the sharded `channel` from now on: what `SSUBSCRIBE channel`
    /// gets. The server ends the subscription (`SUNSUBSCRIBE`) by closing the receiver. A
    /// server without sharded channels keeps this default, whose receiver is closed at once.
    fn ssubscribe(&self, channel: &str) -> tokio::sync::broadcast::Receiver<Bytes> {
        let _ = channel;
        tokio::sync::broadcast::channel(1).1
    }
}

/// Where a broker keeps its in-memory server, once one is attached. Shared by the broker's clones.
#[derive(Clone, Default)]
pub(crate) struct MemorySlot {
    #[cfg(feature = "testing")]
    server: Arc<OnceLock<Arc<dyn MemoryServer>>>,
}

impl MemorySlot {
    /// Points a client's configuration at the in-memory server, if there is one.
    #[cfg_attr(not(feature = "testing"), allow(clippy::unused_self))]
    pub(crate) fn configure(&self, config: &mut fred::prelude::Config) {
        #[cfg(feature = "testing")]
        if let Some(server) = self.server.get() {
            config.mocks = Some(server.clone());
            // One in-memory server, whatever the topology: fred's cluster routing (which needs
            // the slot map of live nodes) does not apply; the model enforces the slot rule.
            config.server = fred::types::config::ServerConfig::default();
        }
        #[cfg(not(feature = "testing"))]
        let _ = config;
    }

    /// What a reader awaits before the blocking read `read`, on the in-memory server.
    #[cfg_attr(not(feature = "testing"), allow(clippy::unused_self))]
    pub(crate) fn waiter(&self, read: BlockingRead) -> Option<MemoryWait> {
        #[cfg(feature = "testing")]
        {
            self.server.get().map(|server| MemoryWait {
                server: server.clone(),
                read,
            })
        }
        #[cfg(not(feature = "testing"))]
        {
            let _ = read;
            None
        }
    }

    /// Attaches `server`; fails when one is attached already.
    #[cfg(feature = "testing")]
    pub(crate) fn attach(&self, server: Arc<dyn MemoryServer>) -> ruststream_core::Result<()> {
        self.server.set(server).map_err(|_| {
            ruststream_core::Error::broker(
                ruststream_core::ErrorKind::Other,
                "attach_memory: a server is attached already",
            )
        })
    }

    /// Milliseconds since the epoch on the attached server's clock, else on the wall clock.
    #[cfg_attr(not(feature = "testing"), allow(clippy::unused_self))]
    pub(crate) fn clock_ms(&self) -> u64 {
        #[cfg(feature = "testing")]
        if let Some(ms) = self.server.get().and_then(|s| s.clock_ms()) {
            return ms;
        }
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// Whether an in-memory server is attached.
    #[cfg(feature = "testing")]
    pub(crate) fn is_attached(&self) -> bool {
        self.server.get().is_some()
    }

    /// Whether an in-memory server is attached: never without the `testing` feature.
    #[cfg(not(feature = "testing"))]
    #[allow(clippy::unused_self)]
    pub(crate) fn is_attached(&self) -> bool {
        false
    }

    /// On the in-memory server, the messages published to `channel`; `None` on a real server.
    #[cfg_attr(not(feature = "testing"), allow(clippy::unused_self))]
    pub(crate) fn messages(
        &self,
        channel: &str,
    ) -> Option<tokio::sync::broadcast::Receiver<Bytes>> {
        #[cfg(feature = "testing")]
        if let Some(server) = self.server.get() {
            return Some(server.subscribe(channel));
        }
        let _ = channel;
        None
    }

    /// On the in-memory server, wakes `notify` on every message published to `channel` and
    /// returns `true`; returns `false` (doing nothing) on a real server.
    #[cfg_attr(not(feature = "testing"), allow(clippy::unused_self))]
    pub(crate) fn forward_wakes(&self, channel: &str, notify: &std::sync::Arc<Notify>) -> bool {
        #[cfg(feature = "testing")]
        if let Some(server) = self.server.get() {
            let mut messages = server.subscribe(channel);
            let notify = Arc::downgrade(notify);
            tokio::spawn(async move {
                loop {
                    match messages.recv().await {
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                    }
                    match notify.upgrade() {
                        Some(n) => n.notify_one(),
                        None => break,
                    }
                }
            });
            return true;
        }
        let _ = (channel, notify);
        false
    }
}

/// The messages of one Pub/Sub subscription on the in-memory server.
pub(crate) struct MemoryFeed {
    #[cfg(feature = "testing")]
    kind: FeedKind,
}

#[cfg(feature = "testing")]
enum FeedKind {
    /// `SUBSCRIBE`: the channel's name, and its messages.
    Channel(Bytes, tokio::sync::broadcast::Receiver<Bytes>),
    /// `PSUBSCRIBE`: messages with their channels.
    Pattern(tokio::sync::broadcast::Receiver<(Bytes, Bytes)>),
    /// `SSUBSCRIBE`: the channel's name, its messages, and the server to subscribe again on.
    Sharded(
        Bytes,
        tokio::sync::broadcast::Receiver<Bytes>,
        Arc<dyn MemoryServer>,
    ),
}

impl MemorySlot {
    /// On the in-memory server, the messages of a subscription to the (full) channel or pattern
    /// `name`, subscribed from now on; `None` on a real server.
    #[cfg_attr(not(feature = "testing"), allow(clippy::unused_self))]
    pub(crate) fn channel_feed(&self, name: &str, pattern: bool) -> Option<MemoryFeed> {
        #[cfg(feature = "testing")]
        {
            self.server.get().map(|server| MemoryFeed {
                kind: if pattern {
                    FeedKind::Pattern(server.psubscribe(name))
                } else {
                    FeedKind::Channel(
                        Bytes::copy_from_slice(name.as_bytes()),
                        server.subscribe(name),
                    )
                },
            })
        }
        #[cfg(not(feature = "testing"))]
        {
            let _ = (name, pattern);
            None
        }
    }

    /// On the in-memory server, the messages of a sharded subscription to the (full) channel
    /// `name`, subscribed from now on; `None` on a real server.
    #[cfg_attr(not(feature = "testing"), allow(clippy::unused_self))]
    pub(crate) fn shard_feed(&self, name: &str) -> Option<MemoryFeed> {
        #[cfg(feature = "testing")]
        {
            self.server.get().map(|server| MemoryFeed {
                kind: FeedKind::Sharded(
                    Bytes::copy_from_slice(name.as_bytes()),
                    server.ssubscribe(name),
                    server.clone(),
                ),
            })
        }
        #[cfg(not(feature = "testing"))]
        {
            let _ = name;
            None
        }
    }
}

/// What the feed's receive methods return: a message's channel and bytes.
type Received = (bytes::Bytes, bytes::Bytes);

impl MemoryFeed {
    /// The next buffered message, if any.
    #[cfg_attr(not(feature = "testing"), allow(clippy::unused_self))]
    pub(crate) fn try_recv(
        &mut self,
    ) -> Result<Received, tokio::sync::broadcast::error::TryRecvError> {
        #[cfg(feature = "testing")]
        {
            match &mut self.kind {
                FeedKind::Channel(name, rx) => rx.try_recv().map(|m| (name.clone(), m)),
                FeedKind::Pattern(rx) => rx.try_recv(),
                FeedKind::Sharded(name, rx, server) => match rx.try_recv() {
                    Err(tokio::sync::broadcast::error::TryRecvError::Closed) => {
                        *rx = server.ssubscribe(&String::from_utf8_lossy(name));
                        rx.try_recv().map(|m| (name.clone(), m))
                    }
                    got => got.map(|m| (name.clone(), m)),
                },
            }
        }
        #[cfg(not(feature = "testing"))]
        Err(tokio::sync::broadcast::error::TryRecvError::Closed)
    }

    /// The next message, waiting for it.
    #[cfg_attr(
        not(feature = "testing"),
        allow(clippy::unused_async, clippy::unused_self)
    )]
    pub(crate) async fn recv(
        &mut self,
    ) -> Result<Received, tokio::sync::broadcast::error::RecvError> {
        #[cfg(feature = "testing")]
        {
            match &mut self.kind {
                FeedKind::Channel(name, rx) => rx.recv().await.map(|m| (name.clone(), m)),
                FeedKind::Pattern(rx) => rx.recv().await,
                FeedKind::Sharded(name, rx, server) => match rx.recv().await {
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        // Ended by the server (its slot moved): subscribe again, once; a
                        // server without sharded channels stays closed.
                        *rx = server.ssubscribe(&String::from_utf8_lossy(name));
                        rx.recv().await.map(|m| (name.clone(), m))
                    }
                    got => got.map(|m| (name.clone(), m)),
                },
            }
        }
        #[cfg(not(feature = "testing"))]
        Err(tokio::sync::broadcast::error::RecvError::Closed)
    }

    /// Messages buffered and not read yet.
    #[cfg_attr(not(feature = "testing"), allow(clippy::unused_self))]
    pub(crate) fn len(&self) -> usize {
        #[cfg(feature = "testing")]
        {
            match &self.kind {
                FeedKind::Channel(_, rx) | FeedKind::Sharded(_, rx, _) => rx.len(),
                FeedKind::Pattern(rx) => rx.len(),
            }
        }
        #[cfg(not(feature = "testing"))]
        0
    }
}

/// A reader's wait before a blocking read on the in-memory server.
pub(crate) struct MemoryWait {
    #[cfg(feature = "testing")]
    server: Arc<dyn MemoryServer>,
    #[cfg(feature = "testing")]
    read: BlockingRead,
}

impl MemoryWait {
    /// Resolves when the blocking read would return something, or after `timeout`.
    #[cfg_attr(not(feature = "testing"), allow(clippy::unused_async))]
    pub(crate) async fn ready(&self, timeout: Duration) {
        #[cfg(feature = "testing")]
        self.server.ready(&self.read, timeout).await;
        #[cfg(not(feature = "testing"))]
        let _ = timeout;
    }
}
