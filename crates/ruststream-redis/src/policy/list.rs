//! [`ListPublish`], how a message is pushed onto a list, and the most priority levels a list may
//! have. Sends no command.

use std::time::Duration;

use ruststream_core::Durability;

/// The most priority levels a list may have
/// ([`RedisList::priorities`](crate::RedisList::priorities)).
pub const MAX_PRIORITIES: u8 = 16;

/// How a message is pushed onto a list: `LPUSH`, and with [`ttl`](Self::ttl) the key's expiry
/// re-armed in the same script, so a queue nobody feeds expires with what is left in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[must_use]
pub struct ListPublish {
    pub(crate) ttl: Option<Duration>,
    pub(crate) partitions: Option<u16>,
    pub(crate) priorities: Option<u8>,
    /// The level one group of messages goes onto: set per message by the publisher (see
    /// `list::levels::place`), 0 in a route.
    pub(crate) level: u8,
    pub(crate) durable: Option<Durability>,
    pub(crate) groups: bool,
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

    /// The list has fair groups (see [`RedisList::groups`](crate::RedisList::groups)): each
    /// message goes onto its group's sub-queue (its
    /// [`group`](ruststream_core::PublishBuilder::group), the default group without one). A
    /// subscription with groups sets this on its key's route itself; a producer-only process
    /// says it with [`RedisBroker::route`](crate::RedisBroker::route) (without it, messages
    /// wait in the queue's inbox until a reader's claim sorts them onto their groups).
    pub fn groups(mut self) -> Self {
        self.groups = true;
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
