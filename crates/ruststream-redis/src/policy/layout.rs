//! [`ListLayout`], the shape of a list queue (partitions, priority levels, fair groups), which a
//! [`RedisList`](crate::RedisList) and its route ([`ListPublish`](super::ListPublish)) both
//! hold, so the route a subscription derives is its own layout; the macro that writes its
//! setters on both; the most priority levels a list may have. Sends no command.

use ruststream_core::ConfigError;

/// The most priority levels a list may have
/// ([`RedisList::priorities`](crate::RedisList::priorities)).
pub const MAX_PRIORITIES: u8 = 16;

/// The shape of a list queue: what its readers and its publishers must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct ListLayout {
    /// Over how many partitions the list is spread, when it is.
    pub(crate) partitions: Option<u16>,
    /// How many priority levels it has, when it has them.
    pub(crate) priorities: Option<u8>,
    /// Whether it has fair groups.
    pub(crate) groups: bool,
}

impl ListLayout {
    /// A plain list: one key, one level, no groups.
    pub(crate) fn is_plain(&self) -> bool {
        self.partitions.is_none() && self.priorities.is_none() && !self.groups
    }

    /// Whether the layout can be sent, for the destination `key`; the error says what to fix.
    pub(crate) fn check(&self, key: &str) -> Result<(), ConfigError> {
        match self.priorities {
            Some(n) if !(2..=MAX_PRIORITIES).contains(&n) => Err(ConfigError::new(
                "priorities",
                format!("priorities({n}) must be between 2 and {MAX_PRIORITIES} levels"),
                "give 2 or more levels; for one level leave priorities out",
            )
            .on(key)),
            _ => Ok(()),
        }
    }
}

/// Writes the setters of [`ListLayout`] on `$ty`, which has a field `layout`.
macro_rules! list_layout_setters {
    ($ty:ty) => {
        $crate::policy::partitions_setter!($ty, layout.partitions);

        impl $ty {
            /// Fair groups: one sub-queue per group (a tenant, a customer), and readers take
            /// round robin over the groups with waiting messages, one entry a group a turn, in
            /// one script run across every worker of every instance, so a small group's wait
            /// does not grow with a large group's backlog. A message's group is its
            /// [`group`](::ruststream_core::PublishBuilder::group) (the header `rs.group`; the
            /// default group '' without one), and it is published onto its group's sub-queue.
            /// Retries, recovered claims, delayed messages and requeued dead letters go back to
            /// their own group. The keys (`<key>.groups`, the ring of non-empty groups;
            /// `<key>.groups:<group>`, each group's entries; `<key>.groups.paused`) are in the
            /// key's slot; the operator's `pause --group` passes a group over. A per-group rate
            /// limit is [`RedisList::group_rate_limit`](crate::RedisList::group_rate_limit).
            /// Not with [`priorities`](Self::priorities). See `crate::list::groups`. A
            /// subscription with groups sets this on its key's route
            /// ([`list::Publish`](crate::list::Publish)) itself; a producer-only process says it
            /// with [`RedisBroker::route`](crate::RedisBroker::route) (without it, messages
            /// wait in the queue's inbox until a reader's claim sorts them onto their groups).
            ///
            /// ```no_run
            /// # use ruststream_core::{MessageType, Publisher, Result};
            /// # async fn run(publisher: Publisher, job: &impl MessageType) -> Result<()> {
            /// use ruststream_redis::RedisList;
            /// let imports = RedisList::new("{imports}").reliable().groups();
            /// # let _ = imports;
            /// // ... subscribe a handler to `imports`, then publish for a tenant:
            /// publisher.message(job).to("{imports}").group("acme").publish().await?;
            /// # Ok(()) }
            /// ```
            pub fn groups(mut self) -> Self {
                self.layout.groups = true;
                self
            }

            /// Gives the list `n` priority levels, `0` (the lowest, where a publish without a
            /// priority and a raw `LPUSH key` land) to `n - 1` (the highest), `n` from 2 to
            /// [`MAX_PRIORITIES`](crate::list::MAX_PRIORITIES); a message is published onto one
            /// with [`priority(i)`](::ruststream_core::PublishBuilder::priority), and a priority
            /// of `n` or more is refused. Level 0 is the key itself, level `i` the list
            /// `<key>.p<i>` in its slot. Readers, simple or reliable, always take from the
            /// highest non-empty level first, in one script run: the priority is strict, so
            /// lower levels wait (starve) for as long as a higher one has entries. Claims,
            /// leases, settling and recovery are the same as without levels; an entry swept back
            /// from a dead worker, a retry and a delayed message all go onto their own level
            /// (the `rs.priority` header, which handlers see). With
            /// [`partitions`](Self::partitions) every partition has the levels. Why readers wake
            /// for a higher level at once while they wait on level 0: `docs/decisions.md`,
            /// "Priority levels". A subscription with levels sets this on its key's route
            /// ([`list::Publish`](crate::list::Publish)) itself; a producer-only process says it
            /// with [`RedisBroker::route`](crate::RedisBroker::route).
            ///
            /// ```no_run
            /// # use ruststream_core::{MessageType, Publisher, Result};
            /// # async fn run(publisher: Publisher, job: &impl MessageType) -> Result<()> {
            /// use ruststream_redis::RedisList;
            /// let jobs = RedisList::new("{jobs}").reliable().priorities(3);
            /// // ... subscribe a handler to `jobs`, then publish onto its highest level:
            /// publisher.message(job).to("{jobs}").priority(2).publish().await?;
            /// # Ok(()) }
            /// ```
            ///
            /// ```
            /// use ruststream_redis::{RedisList, list};
            /// let jobs = RedisList::new("{jobs}").reliable().priorities(3);
            /// assert_eq!(jobs.level_keys(), ["{jobs}", "{jobs}.p1", "{jobs}.p2"]);
            /// // A producer-only process's route to it:
            /// let route = list::Publish::new().priorities(3);
            /// assert!(route.check("jobs").is_ok());
            /// assert!(list::Publish::new().priorities(1).check("jobs").is_err());
            /// ```
            pub fn priorities(mut self, n: u8) -> Self {
                self.layout.priorities = Some(n);
                self
            }
        }
    };
}

pub(crate) use list_layout_setters;
