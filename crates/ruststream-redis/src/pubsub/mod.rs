//! Redis Pub/Sub: the [`RedisChannel`] source, its receiver, and the [`Publish`] policy.
//!
//! Pub/Sub is **at-most-once fan-out**: every subscriber connected when a message is published
//! gets it, once; nothing is stored, so a subscriber that is down, reconnecting or not yet
//! subscribed never sees it, and a message cannot be delivered again. Use a list or a stream
//! when a message must survive a crash or be retried.
//!
//! Commands sent:
//! - `SUBSCRIBE channel` ([`RedisChannel::new`]), `PSUBSCRIBE pattern`
//!   ([`RedisChannel::pattern`]) or `SSUBSCRIBE channel` ([`RedisChannel::sharded`]) on a
//!   connection of the subscription's own: a fred `SubscriberClient`, which sends them again
//!   after every reconnect (`manage_subscriptions`); a sharded subscription also sends its
//!   `SSUBSCRIBE` again every [`RESUBSCRIBE_EVERY`] (see *Sharded* below), any other one a
//!   `PING` every command timeout (`keepalive.rs`), so a connection that went silent without
//!   closing is found and replaced. The app starts once the server has confirmed the
//!   subscription.
//! - `PUBLISH channel frame` for [`Publish::new`], `SPUBLISH channel frame` for
//!   [`Publish::sharded`]: the same frame as a list value (message id,
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
//! Why two buffers: fred allocates its broadcast capacity up front, for every connection, so a
//! large buffer there costs memory even when idle; fred's channel only has to cover the moments
//! the moving task is not scheduled, so it stays small. Messages fred overwrites before the task
//! reads them are counted as lagged too. The sizing and its figures are in `docs/decisions.md`.
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
//! **Sharded** ([`RedisChannel::sharded`], Redis 7): `SSUBSCRIBE` and `SPUBLISH` go to the node
//! owning the channel's hash slot (fred routes both by the channel, as by a key), and a message
//! travels only within that shard (the primary and its replicas) instead of the whole cluster
//! bus. The two kinds are distinct: a `SUBSCRIBE`r never gets an `SPUBLISH`, an `SSUBSCRIBE`r
//! never gets a `PUBLISH`. When the slot moves (a failover, a resharding), Redis ends the
//! subscription with a `SUNSUBSCRIBE` push on the same connection, which fred discards without
//! telling anyone and without reconnecting; so the subscription sends its `SSUBSCRIBE` again
//! every [`RESUBSCRIBE_EVERY`] (a no-op while it holds; after a move fred follows the `MOVED`
//! reply to the new owner). Messages published between the move and the next `SSUBSCRIBE` are
//! lost, as Pub/Sub loses any message published while a subscriber is away. A sharded channel
//! cannot be a pattern (Redis has no sharded `PSUBSCRIBE`): a name with glob characters is
//! refused at startup. On a standalone server the commands behave like their plain forms, for
//! their own subscribers only.
//!
//! **In memory** (`TestApp`), messages come from the model's `PUBLISH` through
//! [`MemoryServer::subscribe`](crate::memory::MemoryServer::subscribe),
//! [`psubscribe`](crate::memory::MemoryServer::psubscribe) and
//! [`ssubscribe`](crate::memory::MemoryServer::ssubscribe) instead of a connection.

mod keepalive;
mod receive;
mod shard;

use fred::prelude::*;
use futures::future::BoxFuture;
use ruststream_core::{ChannelDoc, Error, Result, Retries};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::conn::Connections;
use crate::error::core;
use crate::keys::{KeySpace, SourceKeys};
use crate::options::{SourceOptions, source_setters};
pub use crate::policy::ChannelPublish as Publish;
use crate::policy::PublishPolicy;
use crate::transport::{RedisReceiver, Transport};

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

pub use shard::RESUBSCRIBE_EVERY;

/// What a [`RedisChannel`] subscribes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `SUBSCRIBE channel`.
    Channel,
    /// `PSUBSCRIBE pattern`.
    Pattern,
    /// `SSUBSCRIBE channel`.
    Sharded,
}

impl Kind {
    /// The subscription's mode, as `inspect` and the AsyncAPI bindings name it.
    fn mode(self) -> &'static str {
        match self {
            Self::Channel => "channel",
            Self::Pattern => "pattern",
            Self::Sharded => "sharded",
        }
    }
}

/// A Pub/Sub subscription: one channel (`SUBSCRIBE`), a glob pattern of channels
/// (`PSUBSCRIBE`) or one sharded channel (`SSUBSCRIBE`). At most once; see the
/// [module docs](self).
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
    name: String,
    kind: Kind,
    buffer: usize,
    options: SourceOptions,
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
    /// `SPUBLISH` ([`Publish::sharded`], the app's publisher's default for `name`) only. See the
    /// [module docs](self).
    pub fn sharded(name: impl Into<String>) -> Self {
        Self {
            kind: Kind::Sharded,
            ..Self::new(name)
        }
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
        self.kind == Kind::Pattern
    }

    /// Whether this is a sharded subscription (`SSUBSCRIBE`).
    pub fn is_sharded(&self) -> bool {
        self.kind == Kind::Sharded
    }

    /// The channel with the broker's prefix (in a pattern, the prefix escaped).
    fn full_name(&self, space: &KeySpace) -> String {
        if self.is_pattern() {
            format!("{}{}", escape_glob(space.prefix()), self.name)
        } else {
            space.key(&self.name)
        }
    }
}

impl Transport for RedisChannel {
    fn key(&self) -> &str {
        &self.name
    }

    fn options(&self) -> &SourceOptions {
        &self.options
    }

    fn source_keys(&self, space: &KeySpace) -> SourceKeys {
        SourceKeys {
            name: self.name.clone(),
            transport: "pubsub",
            mode: self.kind.mode().to_owned(),
            queue: self.full_name(space),
            processing: None,
            recovery: None,
            settle_tokens: None,
            min_idle_ms: None,
            group: None,
            delayed: None,
            delayed_payloads: None,
            dead: space.dead(&self.name, &self.options.dead_letter),
            paused: None,
            concurrency: self.options.core.concurrency,
            partition_of: None,
            levels: Vec::new(),
        }
    }

    /// Pub/Sub stores nothing, so a retry goes to the dead-letter list with [`NO_REDELIVERY`].
    fn retries(&self) -> Retries {
        Retries::DeadLetter(NO_REDELIVERY)
    }

    fn describe(&self) -> ChannelDoc {
        let mut bindings = json!({
            "subscribe": self.kind.mode(),
            "delivery": "at-most-once",
        });
        if let Some(dead) = KeySpace::default().dead(&self.name, &self.options.dead_letter) {
            bindings["deadLetter"] = json!(dead);
        }
        ChannelDoc {
            address: self.name.clone(),
            transport: "pubsub",
            bindings,
        }
    }

    /// Its one key, the dead-letter list, is used alone (`LPUSH`): no slot rule applies, except
    /// that a sharded channel's dead letters are requeued by a script that `SPUBLISH`es them, so
    /// on a cluster its dead-letter list must share the channel's slot (the default one does).
    fn validate(&self, space: &KeySpace) -> Result<()> {
        let what = match self.kind {
            Kind::Channel | Kind::Sharded => "channel",
            Kind::Pattern => "pattern",
        };
        let name = &self.name;
        if name.is_empty() {
            return Err(Error::config(format!(
                "a RedisChannel has an empty {what}: name it"
            )));
        }
        self.options.validate(&format!("{what} `{name}`"))?;
        if self.buffer == 0 || self.buffer > MAX_BUFFER {
            return Err(Error::config(format!(
                "{what} `{name}`: buffer must be between 1 and {MAX_BUFFER} messages (it is {})",
                self.buffer
            )));
        }
        if self.kind == Kind::Sharded {
            shard::validate(name, space, &self.options.dead_letter)?;
        }
        Ok(())
    }

    fn route(&self) -> Option<PublishPolicy> {
        match self.kind {
            Kind::Channel => Some(PublishPolicy::PubSub(Publish::new())),
            Kind::Sharded => Some(PublishPolicy::PubSub(Publish::sharded())),
            Kind::Pattern => None,
        }
    }

    fn prepare<'a>(&'a self, _: &'a Connections) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn open<'a>(
        &'a self,
        conns: &'a Connections,
        stop: CancellationToken,
    ) -> BoxFuture<'a, Result<RedisReceiver>> {
        Box::pin(receive::open(self, conns, stop))
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

/// Publishes `frames` to the (prefixed) channel `channel` in one pipeline, as `how` says.
pub(crate) async fn publish(
    client: &Client,
    channel: &str,
    how: Publish,
    frames: Vec<Value>,
) -> Result<()> {
    let pipeline = client.pipeline();
    for frame in frames {
        let () = if how.sharded {
            pipeline.spublish(channel, frame).await
        } else {
            pipeline.publish(channel, frame).await
        }
        .map_err(core)?;
    }
    let _: Vec<Value> = pipeline.all().await.map_err(core)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_need_a_name_and_a_usable_buffer() {
        let cluster = KeySpace::new(String::new(), true);
        let check = |c: RedisChannel| c.validate(&cluster);
        assert!(check(RedisChannel::new("events")).is_ok());
        assert!(check(RedisChannel::pattern("events.*")).is_ok());
        let e = check(RedisChannel::new("")).unwrap_err().to_string();
        assert!(e.contains("empty channel"), "{e}");
        let e = check(RedisChannel::new("e").buffer(0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("buffer must be between 1 and"), "{e}");
        assert!(check(RedisChannel::new("e").buffer(MAX_BUFFER + 1)).is_err());
        assert!(check(RedisChannel::pattern("e.*").concurrency(0)).is_err());
        assert!(check(RedisChannel::new("e").block(std::time::Duration::ZERO)).is_err());
        assert!(check(RedisChannel::new("events").dead_letter("other")).is_ok());
    }

    #[test]
    fn a_prefix_is_escaped_in_a_pattern() {
        assert_eq!(escape_glob("app:"), "app:");
        assert_eq!(escape_glob("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn dead_letter_defaults_to_the_name_dot_dead() {
        let dead = |c: &RedisChannel| {
            c.describe().bindings["deadLetter"]
                .as_str()
                .map(str::to_owned)
        };
        assert_eq!(
            dead(&RedisChannel::new("events")).as_deref(),
            Some("events.dead")
        );
        assert_eq!(
            dead(&RedisChannel::pattern("events.*")).as_deref(),
            Some("events.*.dead")
        );
        assert_eq!(dead(&RedisChannel::new("e").no_dead_letter()), None);
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
        assert_eq!(
            RedisChannel::sharded("e").describe().bindings["subscribe"],
            "sharded"
        );
    }

    #[test]
    fn a_sharded_channel_routes_to_spublish_and_a_pattern_nowhere() {
        let route = |c: &RedisChannel| c.route();
        assert_eq!(
            route(&RedisChannel::sharded("o")),
            Some(PublishPolicy::PubSub(Publish::sharded()))
        );
        assert_eq!(
            route(&RedisChannel::new("o")),
            Some(PublishPolicy::PubSub(Publish::new()))
        );
        assert_eq!(route(&RedisChannel::pattern("o.*")), None);
        let keys = RedisChannel::sharded("o").source_keys(&KeySpace::default());
        assert_eq!((keys.transport, keys.mode.as_str()), ("pubsub", "sharded"));
    }
}
