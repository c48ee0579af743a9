//! Reading a Pub/Sub subscription: its connection of its own ([`session`](super::session))
//! reads the socket only as fast as this receiver takes messages from the read-ahead buffer,
//! which it does as handlers free up; on `TestApp`, the model's feed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use ruststream_core::{Delivery, Error, Result};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::session::{self, Message, Spec};
use super::source::{Kind, RedisChannel};
use crate::conn::Connections;
use crate::conn::wire::Dial;
use crate::dead::PushDeadLetters;
use crate::gauges;
use crate::memory::MemoryFeed;
use crate::transport::{Receive, RedisReceiver, RedisSettler, Token, list_delivery};

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
        messages: mpsc::Receiver<Message>,
        connected: Arc<AtomicBool>,
        /// The task reading the connection (`session.rs`).
        task: JoinHandle<()>,
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
            Self::Redis { messages, .. } => match messages.try_recv() {
                Ok((channel, payload)) => Got::Message(channel, payload),
                Err(mpsc::error::TryRecvError::Empty) => Got::Empty,
                Err(mpsc::error::TryRecvError::Disconnected) => Got::Closed,
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
            Self::Redis { messages, .. } => messages
                .recv()
                .await
                .map_or(Got::Closed, |(channel, payload)| {
                    Got::Message(channel, payload)
                }),
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

/// Subscribes a connection of its own to `full` (see `session.rs`).
async fn subscribe(conns: &Connections, source: &RedisChannel, full: &str) -> Result<Feed> {
    let config = conns.client_config()?;
    let fallback = match conns.settings.topology {
        crate::conn::Topology::Sentinel { .. } => Vec::new(),
        _ => config.server.hosts(),
    };
    let spec = Spec {
        kind: source.kind,
        channel: full.to_owned(),
        label: source.name.as_str().into(),
        dial: Dial::new(
            &config,
            conns.settings.command_timeout.min(Duration::from_secs(5)),
        ),
        pool: conns.pool()?,
        fallback,
        idle: conns.settings.command_timeout,
    };
    match session::start(spec, source.buffer).await {
        Ok(s) => Ok(Feed::Redis {
            messages: s.messages,
            connected: s.connected,
            task: s.task,
        }),
        Err(e) => {
            let hint = match source.kind {
                Kind::Sharded => " (sharded Pub/Sub needs Redis 7 or later)",
                Kind::Channel | Kind::Pattern => "",
            };
            let message = format!(
                "cannot subscribe to `{}`: {}{hint}",
                source.name,
                crate::error::in_words(&e)
            );
            Err(crate::error::core_as(e, message))
        }
    }
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
            Feed::Redis { connected, .. } => {
                let connected = connected.clone();
                Some(Arc::new(move || connected.load(Ordering::Relaxed)))
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
        if let Feed::Redis { task, .. } = &self.feed {
            // Closes the connection, even while the task waits for room in the buffer.
            task.abort();
        }
    }
}
