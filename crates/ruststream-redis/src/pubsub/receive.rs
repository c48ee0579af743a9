//! Reading a Pub/Sub subscription: `SUBSCRIBE`/`PSUBSCRIBE`/`SSUBSCRIBE` on a `SubscriberClient`
//! of its own (a sharded one renewed by [`shard::keep`](super::shard)),
//! messages moved from fred's broadcast channel into the subscription's buffer by a task (see
//! the [module docs](super) for why two buffers), delivered as handlers free up.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::{Message, MessageKind};
use futures::future::BoxFuture;
use ruststream_core::{Delivery, Error, Result};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::source::{Kind, RedisChannel};
use super::{keepalive, shard};
use crate::conn::Connections;
use crate::dead::PushDeadLetters;
use crate::gauges;
use crate::memory::MemoryFeed;
use crate::reply::value_bytes;
use crate::transport::{Receive, RedisReceiver, RedisSettler, Token, list_delivery};

/// The capacity of fred's broadcast channel of a subscription's connection: messages that
/// arrive while the task moving them to the subscription's buffer is not scheduled.
pub const FRED_BUFFER: usize = 4096;

/// The receiver of one Pub/Sub subscription.
struct ChannelReceiver {
    feed: Feed,
    stop: CancellationToken,
    block: Duration,
    /// The channel or pattern as the user named it: the lag metric's label and log field.
    label: Arc<str>,
    /// The broker's prefix, removed from the channel of each message.
    prefix: String,
    /// The delivery source of a `SUBSCRIBE` (always the one channel).
    source: Arc<str>,
    pattern: bool,
    lagged: metrics::Counter,
    settler: RedisSettler,
}

/// Where the messages come from.
enum Feed {
    Redis {
        client: SubscriberClient,
        messages: mpsc::Receiver<Message>,
        /// Messages dropped or overwritten since the receiver last looked.
        lagged: Arc<AtomicU64>,
        forward: JoinHandle<()>,
        resubscribe: JoinHandle<()>,
        /// The task that keeps the subscription: a sharded one's renewal, else its keepalive.
        keeper: JoinHandle<()>,
    },
    Memory(MemoryFeed),
}

/// One step of reading the feed.
enum Got {
    /// A message: the channel it was published on, and its bytes.
    Message(Bytes, Bytes),
    /// This many messages were overwritten before the receiver read them.
    Lagged(u64),
    /// Nothing buffered.
    Empty,
    /// The connection was closed for good.
    Closed,
}

impl Feed {
    fn take(&mut self) -> Got {
        match self {
            Self::Redis {
                messages, lagged, ..
            } => match lagged.swap(0, Ordering::Relaxed) {
                0 => match messages.try_recv() {
                    Ok(m) => fred_message(m),
                    Err(mpsc::error::TryRecvError::Empty) => Got::Empty,
                    Err(mpsc::error::TryRecvError::Disconnected) => Got::Closed,
                },
                n => Got::Lagged(n),
            },
            Self::Memory(feed) => match feed.try_recv() {
                Ok((channel, payload)) => Got::Message(channel, payload),
                Err(TryRecvError::Lagged(n)) => Got::Lagged(n),
                Err(TryRecvError::Empty) => Got::Empty,
                Err(TryRecvError::Closed) => Got::Closed,
            },
        }
    }

    async fn next(&mut self) -> Got {
        match self {
            Self::Redis {
                messages, lagged, ..
            } => match lagged.swap(0, Ordering::Relaxed) {
                0 => messages.recv().await.map_or(Got::Closed, fred_message),
                n => Got::Lagged(n),
            },
            Self::Memory(feed) => match feed.recv().await {
                Ok((channel, payload)) => Got::Message(channel, payload),
                Err(RecvError::Lagged(n)) => Got::Lagged(n),
                Err(RecvError::Closed) => Got::Closed,
            },
        }
    }

    /// Messages received but not read yet.
    fn buffered(&self) -> usize {
        match self {
            Self::Redis { messages, .. } => messages.len(),
            Self::Memory(feed) => feed.len(),
        }
    }
}

/// A message of fred's feed (the forwarding task passes on only messages, pattern messages and
/// sharded messages).
fn fred_message(m: Message) -> Got {
    let payload = value_bytes(m.value).unwrap_or_default();
    Got::Message(m.channel.into_inner(), payload)
}

/// Subscribes (on Redis, once this returns the server has confirmed the subscription).
pub(super) async fn open(
    source: &RedisChannel,
    conns: &Connections,
    stop: CancellationToken,
) -> Result<RedisReceiver> {
    let pool = conns.pool()?;
    let prefix = conns.keys.prefix();
    let full = source.full_name(&conns.keys);
    let memory = match source.kind {
        Kind::Sharded => conns.memory.shard_feed(&full),
        Kind::Channel | Kind::Pattern => conns.memory.channel_feed(&full, source.is_pattern()),
    };
    let feed = match memory {
        Some(feed) => Feed::Memory(feed),
        None => subscribe(conns, source, &full).await?,
    };
    let label: Arc<str> = source.name.as_str().into();
    let dead = conns.keys.dead(&source.name, &source.options.dead_letter);
    let settler =
        PushDeadLetters::new(pool.clone(), &full, dead.clone(), source.options.dead_bound);
    gauges::spawn_dead(pool, full, dead, stop.clone());
    Ok(RedisReceiver::new(ChannelReceiver {
        feed,
        stop,
        block: source.options.block,
        prefix: prefix.to_owned(),
        source: label.clone(),
        pattern: source.is_pattern(),
        lagged: metrics::counter!("ruststream_pubsub_lagged_total", "subscription" => label.to_string()),
        label,
        settler: RedisSettler::new(settler),
    }))
}

/// Subscribes a connection of its own to `full`, listening before subscribing so nothing
/// published right after is missed.
async fn subscribe(conns: &Connections, source: &RedisChannel, full: &str) -> Result<Feed> {
    let client = conns.subscriber(FRED_BUFFER).await?;
    let lagged = Arc::new(AtomicU64::new(0));
    let (tx, messages) = mpsc::channel(source.buffer.max(1));
    let forward = tokio::spawn(forward(client.message_rx(), tx, lagged.clone()));
    let resubscribe = client.manage_subscriptions();
    let subscribed = match source.kind {
        Kind::Channel => client.subscribe(full).await,
        Kind::Pattern => client.psubscribe(full).await,
        Kind::Sharded => client.ssubscribe(full).await,
    };
    if let Err(e) = subscribed {
        resubscribe.abort();
        forward.abort();
        let _ = client.quit().await;
        let hint = match source.kind {
            Kind::Sharded => " (sharded Pub/Sub needs Redis 7 or later)",
            Kind::Channel | Kind::Pattern => "",
        };
        let message = format!(
            "cannot subscribe to `{}`: {}{hint}",
            source.name,
            crate::error::redact(e.details())
        );
        return Err(crate::error::core_as(e, message));
    }
    let keeper = match source.kind {
        Kind::Sharded => shard::keep(client.clone(), full.to_owned(), source.name.clone()),
        Kind::Channel | Kind::Pattern => {
            keepalive::keep(client.clone(), conns.settings.command_timeout)
        }
    };
    Ok(Feed::Redis {
        client,
        messages,
        lagged,
        forward,
        resubscribe,
        keeper,
    })
}

impl ChannelReceiver {
    /// Takes what `got` says into `out`; `false` when there is nothing more to take now.
    fn accept(&self, got: Got, out: &mut Vec<Delivery<Token>>) -> Result<bool> {
        match got {
            Got::Message(channel, payload) => {
                out.push(self.delivery(&channel, payload));
                Ok(true)
            }
            Got::Lagged(n) => {
                self.lagged.increment(n);
                tracing::warn!(subscription = %self.label, lagged = n,
                    "pub/sub handlers fell behind: messages dropped unhandled (raise the subscription's buffer or concurrency)");
                Ok(true)
            }
            Got::Empty => Ok(false),
            Got::Closed => Err(Error::broker(
                ruststream_core::ErrorKind::Connection,
                format!("the pub/sub connection of `{}` is closed", self.label),
            )),
        }
    }

    fn delivery(&self, channel: &[u8], raw: Bytes) -> Delivery<Token> {
        let source = if self.pattern {
            let channel = channel
                .strip_prefix(self.prefix.as_bytes())
                .unwrap_or(channel);
            Arc::from(String::from_utf8_lossy(channel))
        } else {
            self.source.clone()
        };
        let mut d = list_delivery(source, raw);
        // Each message is delivered once: its first and only attempt.
        d.info.attempt = 1;
        d.token.frame.attempt = 1;
        d
    }

    /// Up to `max` buffered messages; waits for one up to the block time, or until stopped.
    async fn receive(&mut self, max: usize) -> Result<Vec<Delivery<Token>>> {
        let mut out = Vec::new();
        self.drain(&mut out, max)?;
        if out.is_empty() && !self.stop.is_cancelled() {
            let got = tokio::select! {
                got = self.feed.next() => got,
                () = self.stop.cancelled() => Got::Empty,
                () = tokio::time::sleep(self.block) => Got::Empty,
            };
            if self.accept(got, &mut out)? {
                self.drain(&mut out, max)?;
            }
        }
        Ok(out)
    }

    /// Takes buffered messages into `out` until it holds `max` or none is left.
    fn drain(&mut self, out: &mut Vec<Delivery<Token>>, max: usize) -> Result<()> {
        while out.len() < max {
            let got = self.feed.take();
            if !self.accept(got, out)? {
                break;
            }
        }
        Ok(())
    }
}

impl Receive for ChannelReceiver {
    /// Pub/Sub has no partitions: nothing hurries it.
    fn receive<'a>(
        &'a mut self,
        max: usize,
        _hurry: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Vec<Delivery<Token>>>> {
        Box::pin(ChannelReceiver::receive(self, max))
    }

    fn settler(&self) -> RedisSettler {
        self.settler.clone()
    }
    fn probe(&self) -> Option<ruststream_core::Probe> {
        match &self.feed {
            Feed::Redis { client, .. } => {
                let client = client.clone();
                Some(Arc::new(move || client.is_connected()))
            }
            Feed::Memory(_) => None,
        }
    }
}

impl Drop for ChannelReceiver {
    /// Closes the subscription's connection, and says how many buffered messages go unhandled.
    fn drop(&mut self) {
        let left = self.feed.buffered();
        if left > 0 {
            tracing::warn!(subscription = %self.label, unhandled = left,
                "pub/sub subscription stopped with messages still buffered: they are not handled");
        }
        if let Feed::Redis {
            client,
            resubscribe,
            forward,
            keeper,
            ..
        } = &self.feed
        {
            resubscribe.abort();
            forward.abort();
            keeper.abort();
            let client = client.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = client.quit().await;
                });
            }
        }
    }
}

/// Moves fred's messages into the subscription's buffer as they come, counting what does not fit
/// (or was overwritten in fred's channel first) in `lagged`. Ends when either side closes.
async fn forward(
    mut from: broadcast::Receiver<Message>,
    to: mpsc::Sender<Message>,
    lagged: Arc<AtomicU64>,
) {
    loop {
        match from.recv().await {
            Ok(m)
                if matches!(
                    m.kind,
                    MessageKind::Message | MessageKind::PMessage | MessageKind::SMessage
                ) =>
            {
                match to.try_send(m) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        lagged.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
            Ok(_) => {}
            Err(RecvError::Lagged(n)) => {
                lagged.fetch_add(n, Ordering::Relaxed);
            }
            Err(RecvError::Closed) => return,
        }
    }
}
