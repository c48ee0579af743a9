//! How a message is published to a destination: [`PublishPolicy`], and the builder of each
//! transport's policy, which users reach as [`list::Publish`](crate::list::Publish),
//! [`stream::Publish`](crate::stream::Publish) and [`pubsub::Publish`](crate::pubsub::Publish).
//! [`Routes`] holds each destination's policy. Sends no command (`publish` carries the policies
//! out).

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use ruststream_core::Durability;

/// The most priority levels a list may have
/// ([`RedisList::priorities`](crate::RedisList::priorities)).
pub const MAX_PRIORITIES: u8 = 16;

/// How a message is pushed onto a list: `LPUSH`, and with [`ttl`](Self::ttl) the key's expiry
/// re-armed in the same script, so a queue nobody feeds expires with what is left in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct ListPublish {
    pub(crate) ttl: Option<Duration>,
    pub(crate) partitions: Option<u16>,
    pub(crate) priorities: Option<u8>,
    /// The level one group of messages goes onto: set per message by the publisher (see
    /// `list::levels::place`), 0 in a route.
    pub(crate) level: u8,
    pub(crate) durable: Option<Durability>,
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

    /// The list has `n` priority levels (see
    /// [`RedisList::priorities`](crate::RedisList::priorities)): a message published with
    /// [`priority(i)`](ruststream_core::PublishBuilder::priority) goes onto level `i`, and a
    /// priority of `n` or more is refused. A subscription with levels sets this on its key's
    /// route itself; a producer-only process says it with
    /// [`RedisBroker::route`](crate::RedisBroker::route).
    ///
    /// ```
    /// use ruststream_redis::list;
    /// let route = list::Publish::new().priorities(3);
    /// assert!(route.check("jobs").is_ok());
    /// assert!(list::Publish::new().priorities(1).check("jobs").is_err());
    /// ```
    pub fn priorities(mut self, n: u8) -> Self {
        self.priorities = Some(n);
        self
    }

    /// Every publish to the list returns `Ok` only once `replicas` replicas acknowledged it,
    /// waiting at most `timeout` (see
    /// [`PublishBuilder::durable`](ruststream_core::PublishBuilder::durable)): as a
    /// destination's route, this covers replies and publishes from handlers too.
    pub fn durable(mut self, replicas: u32, timeout: Duration) -> Self {
        self.durable = Some(Durability::new(replicas, timeout));
        self
    }

    /// Whether the policy can be sent, for the destination `key`; the error says what to fix.
    ///
    /// # Errors
    /// Priority levels outside 2 ..= [`MAX_PRIORITIES`].
    pub fn check(&self, key: &str) -> Result<(), String> {
        match self.priorities {
            Some(n) if !(2..=MAX_PRIORITIES).contains(&n) => Err(format!(
                "list `{key}`: priorities({n}) must be between 2 and {} levels",
                MAX_PRIORITIES
            )),
            _ => Ok(()),
        }
    }
}

/// How a message is published to a stream: `XADD key [MAXLEN|MINID ~ ..] * payload .. rs.id ..
/// <headers>`. Use it with `.out_reply(..)` or [`RedisBroker::route`](crate::RedisBroker::route);
/// a route of the key a stream subscription reads also bounds that subscription's retries, due
/// delayed entries and requeued dead letters (they `XTRIM` the same way in their scripts).
///
/// Trimming is approximate (`~`): Redis drops whole macro nodes only (100 entries or 4 KB by
/// default), so the stream keeps at least the bound and at most about a node more, at a fraction
/// of the cost of exact trimming. It drops entries whatever the consumer groups have read: to
/// trim only what every group has acknowledged, use
/// [`RedisStream::trim_acked`](crate::RedisStream::trim_acked) instead.
///
/// ```
/// use std::time::Duration;
/// use ruststream_redis::stream;
/// let last_hour = stream::Publish::new().minid(Duration::from_secs(3600));
/// assert!(last_hour.check("events").is_ok());
/// let both = stream::Publish::new().maxlen(1000).minid(Duration::from_secs(3600));
/// assert!(both.check("events").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct StreamPublish {
    pub(crate) partitions: Option<u16>,
    pub(crate) maxlen: Option<u64>,
    pub(crate) min_age: Option<Duration>,
    pub(crate) durable: Option<Durability>,
}

impl StreamPublish {
    /// `XADD` without trimming.
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

    /// Keeps about the newest `n` entries: `XADD key MAXLEN ~ n * ..`. On a stream spread over
    /// partitions, each partition keeps about `n`.
    pub fn maxlen(mut self, n: u64) -> Self {
        self.maxlen = Some(n);
        self
    }

    /// Drops entries older than `age`: `XADD key MINID ~ <now - age> * ..`, where now is the
    /// publisher's clock for a publish and the server's (`TIME`) in the scripts that re-add
    /// entries. Entry ids are the server's milliseconds, so a publisher whose clock runs ahead
    /// of the server's trims that much younger; keep `age` well above the clocks' skew.
    pub fn minid(mut self, age: Duration) -> Self {
        self.min_age = Some(age);
        self
    }

    /// Every publish to the stream returns `Ok` only once `replicas` replicas acknowledged it,
    /// as [`ListPublish::durable`] for lists.
    pub fn durable(mut self, replicas: u32, timeout: Duration) -> Self {
        self.durable = Some(Durability::new(replicas, timeout));
        self
    }

    /// Whether the policy can be sent, for the destination `key`; the error says what to fix.
    ///
    /// # Errors
    /// Both a `maxlen` and a `minid`, a `maxlen` of 0 or a `minid` age under a millisecond.
    pub fn check(&self, key: &str) -> Result<(), String> {
        match (self.maxlen, self.min_age) {
            (Some(_), Some(_)) => Err(format!(
                "stream `{key}`: maxlen and minid both bound the stream; choose one"
            )),
            (Some(0), None) => Err(format!(
                "stream `{key}`: maxlen(0) would empty the stream on every publish; give the number of entries to keep"
            )),
            (None, Some(age)) if age.as_millis() == 0 => Err(format!(
                "stream `{key}`: minid needs an age of at least a millisecond, or every publish drops everything older than itself"
            )),
            _ => Ok(()),
        }
    }

    /// The trimming arguments of a plain `XADD` published at `now_ms` (the publisher's clock):
    /// `MAXLEN ~ n`, `MINID ~ <now - age>-0`, or none.
    pub(crate) fn xadd_args(&self, now_ms: u64) -> Option<[String; 3]> {
        if let Some(n) = self.maxlen {
            return Some(["MAXLEN".into(), "~".into(), n.to_string()]);
        }
        let age = u64::try_from(self.min_age?.as_millis()).unwrap_or(u64::MAX);
        let min = now_ms.saturating_sub(age);
        Some(["MINID".into(), "~".into(), format!("{min}-0")])
    }

    /// The bound as the scripts take it (`bound.lua`): `maxlen:<n>`, `minage:<ms>` or `""`.
    pub(crate) fn script_arg(&self) -> String {
        match (self.maxlen, self.min_age) {
            (Some(n), _) => format!("maxlen:{n}"),
            (None, Some(age)) => format!("minage:{}", age.as_millis()),
            (None, None) => String::new(),
        }
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

impl PublishPolicy {
    /// Over how many partitions the destination is spread, when it is.
    pub(crate) fn partitions(&self) -> Option<u16> {
        match self {
            Self::List(p) => p.partitions,
            Self::Stream(p) => p.partitions,
            Self::PubSub(_) => None,
        }
    }

    /// Whether the policy can be sent to `key`; the error says what to fix.
    pub(crate) fn check(&self, key: &str) -> Result<(), String> {
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

    /// Whether any route asks for durable publishes.
    pub(crate) fn any_durable(routes: &Routes) -> bool {
        routes
            .0
            .read()
            .is_ok_and(|r| r.values().any(|p| p.durable().is_some()))
    }

    /// The stream policy, when this is one.
    pub(crate) fn stream(&self) -> Option<StreamPublish> {
        match self {
            Self::Stream(p) => Some(*p),
            Self::List(_) | Self::PubSub(_) => None,
        }
    }
}

/// Each destination's default policy (keys as the user names them), and the round robin of
/// messages without a partition key over a destination's partitions.
#[derive(Debug, Default)]
pub(crate) struct Routes(RwLock<HashMap<String, PublishPolicy>>, AtomicUsize);

impl Routes {
    /// Sets `destination`'s policy.
    pub(crate) fn set(&self, destination: String, policy: PublishPolicy) {
        if let Ok(mut routes) = self.0.write() {
            routes.insert(destination, policy);
        }
    }

    /// Sets `destination`'s policy unless one is set.
    pub(crate) fn learn(&self, destination: &str, policy: PublishPolicy) {
        if let Ok(mut routes) = self.0.write() {
            routes.entry(destination.to_owned()).or_insert(policy);
        }
    }

    /// `destination`'s policy, if one is set.
    pub(crate) fn get(&self, destination: &str) -> Option<PublishPolicy> {
        self.0.read().ok()?.get(destination).copied()
    }

    /// The partition of `n` the next message without a partition key goes to.
    pub(crate) fn round_robin(&self) -> &AtomicUsize {
        &self.1
    }

    /// Checks every route's policy; the error names the destination and what to fix.
    pub(crate) fn check(&self) -> Result<(), String> {
        let routes = self
            .0
            .read()
            .map_err(|_| "routes lock poisoned".to_owned())?;
        routes.iter().try_for_each(|(k, p)| p.check(k))
    }

    /// A copy, for a reconfigured broker.
    pub(crate) fn copy(&self) -> Self {
        Self(
            RwLock::new(self.0.read().map(|r| r.clone()).unwrap_or_default()),
            AtomicUsize::new(0),
        )
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
