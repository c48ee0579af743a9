//! Redis Pub/Sub: the [`RedisChannel`] source, its receiver, and the [`Publish`] policy.
//!
//! Pub/Sub is **at-most-once fan-out**: every subscriber connected when a message is published
//! gets it, once; nothing is stored, so a subscriber that is down, reconnecting or not yet
//! subscribed never sees it, and a message cannot be delivered again. Use a list or a stream
//! when a message must survive a crash or be retried.
//!
//! Commands sent:
//! - `SUBSCRIBE channel` ([`RedisChannel::new`]) or `PSUBSCRIBE pattern`
//!   ([`RedisChannel::pattern`]) on a connection of the subscription's own: a fred
//!   `SubscriberClient`, which sends them again after every reconnect (`manage_subscriptions`).
//!   The app starts once the server has confirmed the subscription.
//! - `PUBLISH channel frame` for [`Publish`]: the same frame as a list value (message id,
//!   headers, payload; see [`frame`](crate::frame)), so ids and headers reach the handler. A
//!   batch goes out as one pipeline. A value without the frame prefix (`redis-cli PUBLISH events
//!   '{"n":1}'`) is a raw payload with no headers.
//! - `LPUSH dead-letter-list frame` for settlements that do not acknowledge.
//!
//! | handler outcome | what happens |
//! |---|---|
//! | ack | nothing to send |
//! | drop, undecodable payload | `LPUSH` to the dead-letter list with a `reason` header (`dropped`, `decode: ...`) |
//! | retry, retry_after | Pub/Sub cannot redeliver: `LPUSH` to the dead-letter list with reason [`NO_REDELIVERY`] |
//!
//! The dead-letter list is `<channel>.dead` by default (for a pattern, `<pattern>.dead`), in the
//! channel name's hash slot on a cluster; `no_dead_letter()` discards such messages with an error
//! log instead. Every message a subscription delivers has attempt 1.
//!
//! **Buffering and lag.** fred reads the connection continuously (so Redis never disconnects the
//! subscriber for a full output buffer) and hands every message to a tokio broadcast channel of
//! [`FRED_BUFFER`] slots. A small task of the subscription's own moves each message at once from
//! there into the subscription's buffer, which the receiver drains as handlers free up. That
//! buffer holds up to [`DEFAULT_BUFFER`] (16,384) messages unless [`RedisChannel::buffer`] says
//! otherwise, and takes memory only for what is waiting in it. When handlers fall behind by more
//! than that, new messages are dropped, and each drop is counted: the receiver logs a warning
//! naming the subscription and the count and adds it to
//! `ruststream_pubsub_lagged_total{subscription}` (the channel or pattern). Messages still
//! buffered when the subscription stops are not handled (a warning gives their count).
//!
//! Why two buffers: fred allocates its broadcast capacity up front for each of its eight
//! notification channels of the connection (measured: about 0.7 KB per slot in all), so a
//! 16,384-message burst buffer there cost ~12 MB per subscription even when idle and put the
//! benchmark's consumer at 27 MB. fred's channel only has to cover the moments the moving task is
//! not scheduled, so it stays small (~2.8 MB); messages fred overwrites before the task reads
//! them are counted as lagged too. Sizing, from the benchmark (100,000 messages published at
//! ~190k/s on a 2-core machine also running the publisher and Redis): with 2,048 slots the task
//! fell behind fred by more than that in most runs (150-1,900 messages overwritten); with 4,096,
//! none in six runs, consumer peak RSS 13.6-15.1 MB; 8,192 cost 17-19 MB. Moving the task to a
//! thread of its own was tried: slower (a cross-thread wake-up per message) and it still lagged
//! when the machine's two cores were oversubscribed.
//!
//! **Channel names** get the broker's key prefix, like keys, so apps with different prefixes do
//! not hear each other; in a pattern the prefix is escaped, so only the pattern part matches.
//! The handler's `Context::source` is the channel the message was published on, without the
//! prefix (for a pattern subscription, the matching channel).
//!
//! **Cluster.** Plain (not sharded) Pub/Sub works across a cluster: a `PUBLISH` on any node
//! reaches subscribers on every node. fred sends a client's `SUBSCRIBE`/`PSUBSCRIBE` to one
//! node (chosen by the client's id) and re-sends them after a reconnect or a topology change.
//!
//! **In memory** (`TestApp`), messages come from the model's `PUBLISH` through
//! [`MemoryServer::subscribe`](crate::memory::MemoryServer::subscribe) and
//! [`psubscribe`](crate::memory::MemoryServer::psubscribe) instead of a connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::{Message, MessageKind};
use ruststream_core::{
    BrokerSource, ChannelDoc, Delivery, Error, Result, Source, SubscribeOptions,
};
use serde_json::json;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::RedisBroker;
use crate::error::core;
use crate::frame::Frame;
use crate::memory::MemoryFeed;
use crate::reader::Token;
use crate::settler::{RedisSettler, SettleKind};

/// The dead-letter reason of a message whose handler asked for a retry.
pub const NO_REDELIVERY: &str =
    "no-redelivery: pub/sub cannot redeliver (use a list or stream for retries)";

/// Messages a subscription buffers for its handlers by default (see the [module docs](self)).
pub const DEFAULT_BUFFER: usize = 16_384;

/// The capacity of fred's broadcast channel of a subscription's connection: messages that
/// arrive while the task moving them to the subscription's buffer is not scheduled.
pub const FRED_BUFFER: usize = 4096;

/// The largest buffer a subscription may ask for.
pub const MAX_BUFFER: usize = 1 << 22;

/// A Pub/Sub subscription: one channel (`SUBSCRIBE`) or a glob pattern of channels
/// (`PSUBSCRIBE`). At most once; see the [module docs](self).
///
/// ```
/// use ruststream_redis::RedisChannel;
///
/// let events = RedisChannel::new("events").concurrency(32);
/// assert_eq!(events.dead_letter_key().as_deref(), Some("events.dead"));
/// let all = RedisChannel::pattern("events.*").dead_letter("events.failed");
/// assert!(all.is_pattern());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct RedisChannel {
    pub(crate) name: String,
    pub(crate) pattern: bool,
    pub(crate) dead_letter: Option<Option<String>>,
    pub(crate) block: Duration,
    pub(crate) buffer: usize,
    pub(crate) opts: SubscribeOptions,
}

impl RedisChannel {
    /// A subscription to the channel `name`: `SUBSCRIBE name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            pattern: false,
            dead_letter: None,
            block: Duration::from_secs(5),
            buffer: DEFAULT_BUFFER,
            opts: SubscribeOptions::default(),
        }
    }

    /// A subscription to every channel matching the glob `pattern` (`*`, `?`, `[a-z]`, `\x`):
    /// `PSUBSCRIBE pattern`.
    pub fn pattern(pattern: impl Into<String>) -> Self {
        Self {
            pattern: true,
            ..Self::new(pattern)
        }
    }

    /// Names the dead-letter list (default `<channel>.dead`): dropped, undecodable and retried
    /// messages land there with a `reason` header.
    pub fn dead_letter(mut self, key: impl Into<String>) -> Self {
        self.dead_letter = Some(Some(key.into()));
        self
    }

    /// No dead-letter list: such messages are discarded, with an error log.
    pub fn no_dead_letter(mut self) -> Self {
        self.dead_letter = Some(None);
        self
    }

    /// Most handlers running at once (default 128).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.opts.concurrency = n;
        self
    }

    /// How long one read waits for a message before the reader looks around (default 5 s).
    pub fn block(mut self, timeout: Duration) -> Self {
        self.block = timeout;
        self
    }

    /// Messages buffered for the handlers before new ones are dropped and counted as lagged
    /// (default [`DEFAULT_BUFFER`], at most [`MAX_BUFFER`]). Memory is taken only for messages
    /// actually waiting.
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
        self.pattern
    }

    /// The dead-letter list's key, if there is one.
    pub fn dead_letter_key(&self) -> Option<String> {
        match &self.dead_letter {
            None => Some(format!("{}.dead", self.name)),
            Some(k) => k.clone(),
        }
    }
}

impl BrokerSource for RedisChannel {
    fn key(&self) -> &str {
        &self.name
    }

    fn options(&self) -> &SubscribeOptions {
        &self.opts
    }

    /// Pub/Sub stores nothing, so a retry goes to the dead-letter list with [`NO_REDELIVERY`].
    fn no_redelivery(&self) -> Option<&'static str> {
        Some(NO_REDELIVERY)
    }

    fn describe(&self) -> ChannelDoc {
        let mut bindings = json!({
            "subscribe": if self.pattern { "pattern" } else { "channel" },
            "delivery": "at-most-once",
        });
        if let Some(dead) = self.dead_letter_key() {
            bindings["deadLetter"] = json!(dead);
        }
        ChannelDoc {
            address: self.name.clone(),
            transport: "pubsub",
            bindings,
        }
    }
}

impl Source for RedisChannel {
    type Broker = RedisBroker;
    fn into_source(self) -> crate::RedisSource {
        crate::RedisSource::Channel(self)
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
pub struct Publish;

impl Publish {
    /// `PUBLISH`.
    pub fn new() -> Self {
        Self
    }
}

/// `\`-escapes the glob characters of `prefix`, so that a pattern behind it matches only channels
/// that start with the prefix itself.
pub(crate) fn escape_glob(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The receiver of one Pub/Sub subscription.
pub(crate) struct ChannelReceiver {
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

/// A message of fred's feed (the forwarding task passes on only messages and pattern messages).
fn fred_message(m: Message) -> Got {
    let payload = crate::reader::value_bytes(m.value).unwrap_or_default();
    Got::Message(m.channel.into_inner(), payload)
}

impl ChannelReceiver {
    /// Subscribes (on Redis, once this returns the server has confirmed the subscription).
    pub(crate) async fn open(
        broker: &RedisBroker,
        source: &RedisChannel,
        stop: CancellationToken,
    ) -> Result<Self> {
        let inner = &broker.inner;
        let pool = broker.pool()?;
        let full = if source.pattern {
            format!("{}{}", escape_glob(&inner.prefix), source.name)
        } else {
            inner.key(&source.name)
        };
        let feed = match inner.memory.channel_feed(&full, source.pattern) {
            Some(feed) => Feed::Memory(feed),
            None => {
                let client = broker.subscriber_client(FRED_BUFFER).await?;
                // Listen before subscribing, so nothing published right after is missed.
                let lagged = Arc::new(AtomicU64::new(0));
                let (tx, messages) = mpsc::channel(source.buffer.max(1));
                let forward = tokio::spawn(forward(client.message_rx(), tx, lagged.clone()));
                let resubscribe = client.manage_subscriptions();
                let subscribed = if source.pattern {
                    client.psubscribe(full.as_str()).await
                } else {
                    client.subscribe(full.as_str()).await
                };
                if let Err(e) = subscribed {
                    resubscribe.abort();
                    forward.abort();
                    let _ = client.quit().await;
                    return Err(Error::Broker(format!(
                        "cannot subscribe to `{}`: {}",
                        source.name,
                        crate::error::redact(e.details())
                    )));
                }
                Feed::Redis {
                    client,
                    messages,
                    lagged,
                    forward,
                    resubscribe,
                }
            }
        };
        let label: Arc<str> = source.name.as_str().into();
        let dead = inner.dead_key_of(&source.name, source.dead_letter.as_ref());
        crate::gauges::spawn_dead(pool.clone(), full, dead.clone(), stop.clone());
        Ok(Self {
            feed,
            stop,
            block: source.block,
            prefix: inner.prefix.clone(),
            source: label.clone(),
            pattern: source.pattern,
            lagged: metrics::counter!("ruststream_pubsub_lagged_total", "subscription" => label.to_string()),
            label,
            settler: RedisSettler::new(pool, SettleKind::Simple { dead }),
        })
    }

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
            Got::Closed => Err(Error::Broker(format!(
                "the pub/sub connection of `{}` is closed",
                self.label
            ))),
        }
    }

    fn delivery(&self, channel: &[u8], raw: Bytes) -> Delivery<Token> {
        let mut frame = Frame::decode(raw.clone());
        // Each message is delivered once: its first and only attempt.
        frame.attempt = 1;
        let source = if self.pattern {
            let channel = channel
                .strip_prefix(self.prefix.as_bytes())
                .unwrap_or(channel);
            Arc::from(String::from_utf8_lossy(channel))
        } else {
            self.source.clone()
        };
        crate::reader::delivery(source, raw, frame)
    }

    /// Up to `max` buffered messages; waits for one up to the block time, or until stopped.
    pub(crate) async fn receive(&mut self, max: usize) -> Result<Vec<Delivery<Token>>> {
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

    pub(crate) fn settler(&self) -> RedisSettler {
        self.settler.clone()
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
            ..
        } = &self.feed
        {
            resubscribe.abort();
            forward.abort();
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
            Ok(m) if matches!(m.kind, MessageKind::Message | MessageKind::PMessage) => {
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

/// Publishes `frames` to the (prefixed) channel `channel` in one pipeline.
pub(crate) async fn publish(client: &Client, channel: &str, frames: Vec<Value>) -> Result<()> {
    let pipeline = client.pipeline();
    for frame in frames {
        let () = pipeline.publish(channel, frame).await.map_err(core)?;
    }
    let _: Vec<Value> = pipeline.all().await.map_err(core)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_escaped_in_a_pattern() {
        assert_eq!(escape_glob("app:"), "app:");
        assert_eq!(escape_glob("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn dead_letter_defaults_to_the_name_dot_dead() {
        assert_eq!(
            RedisChannel::new("events").dead_letter_key().as_deref(),
            Some("events.dead")
        );
        assert_eq!(
            RedisChannel::pattern("events.*")
                .dead_letter_key()
                .as_deref(),
            Some("events.*.dead")
        );
        assert_eq!(
            RedisChannel::new("e").no_dead_letter().dead_letter_key(),
            None
        );
    }

    #[test]
    fn describe_says_channel_or_pattern() {
        let d = RedisChannel::new("events").describe();
        assert_eq!((d.transport, d.address.as_str()), ("pubsub", "events"));
        assert_eq!(d.bindings["subscribe"], "channel");
        assert_eq!(
            RedisChannel::pattern("e.*").describe().bindings["subscribe"],
            "pattern"
        );
    }
}
