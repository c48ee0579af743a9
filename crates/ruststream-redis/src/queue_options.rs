//! The options of a subscription that reads a queue, a list or a stream, and their setters: one
//! [`QueueOptions`] that [`RedisList`](crate::RedisList) and
//! [`RedisStream`](crate::RedisStream) each hold (field `queue`), its checks, and the macro that
//! writes its setters on both (through `source_setters!(queue: ..)`). What differs per
//! transport stays with the transport: a list's per-key limit, a stream's bound. Sends no
//! command.

use std::time::Duration;

use ruststream_core::Result;

use crate::claim::limit::{Limiter, RateLimit};
use crate::defaults::DEFAULT_MIN_IDLE;
use crate::keys::KeySpace;

/// What a list or stream subscription can set beyond [`SourceOptions`](crate::options::SourceOptions).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct QueueOptions {
    /// The rate limit, if any (`crate::claim::limit`).
    pub(crate) rate: Option<RateLimit>,
    /// The concurrency cap across workers, if any (`crate::claim::cap`).
    pub(crate) max_in_flight: Option<u32>,
    /// How long a dead worker's claims take to come back, when set.
    pub(crate) min_idle: Option<Duration>,
    /// No crash recovery.
    pub(crate) no_recovery: bool,
}

impl QueueOptions {
    /// How long a dead worker's claims take to come back.
    pub(crate) fn idle(&self) -> Duration {
        self.min_idle.unwrap_or(DEFAULT_MIN_IDLE)
    }

    /// The rate limit's limiter on `key` (full name), when the queue has a limit and a reader
    /// of its own checks it (`key` is `None` for a partition: its reader checks the whole
    /// queue's).
    pub(crate) fn limiter(&self, key: Option<String>) -> Option<Limiter> {
        self.rate.as_ref().zip(key).map(|(r, key)| r.limiter(key))
    }

    /// The limiter of a queue spread over partitions: one, on the key `key` of the whole queue
    /// (as the user names it), which the partitions' reader reserves from.
    pub(crate) fn whole_limiter(&self, space: &KeySpace, key: &str) -> Option<Limiter> {
        let rate = self.rate.as_ref()?;
        Some(rate.limiter(rate.key(space, &space.key(key))))
    }

    /// Adds the rate limit and the cap to a description's bindings.
    pub(crate) fn describe(&self, bindings: &mut serde_json::Value) {
        if let Some(r) = &self.rate {
            bindings["rateLimit"] = r.describe();
        }
        if let Some(n) = self.max_in_flight {
            bindings["maxInFlight"] = serde_json::json!(n);
        }
    }

    /// Checks the rate limit and the cap; `key` names the subscription, `cap_cannot` says why
    /// this one cannot hold a cap, and the fix, when it cannot.
    pub(crate) fn validate(
        &self,
        key: &str,
        cap_cannot: Option<(&'static str, &'static str)>,
    ) -> Result<()> {
        if let Some(rate) = &self.rate {
            rate.validate(key)?;
        }
        crate::claim::cap::validate(key, "max_in_flight", self.max_in_flight, cap_cannot)
    }
}

/// Writes the setters of [`QueueOptions`] on a source type with a field `queue`.
macro_rules! queue_setters {
    ($ty:ty) => {
        impl $ty {
            /// Takes at most `n` messages per `per` from the queue, across every worker of every
            /// instance (a [`RateLimit`](crate::RateLimit): a burst of `n`, then one every
            /// `per / n`). The limiter lives in Redis (`<key>.rate`) and is checked by the script
            /// that takes the messages (a list's claim, a stream group's read), on the server's
            /// clock, and charged for those it took; messages over the limit stay in the queue,
            /// untouched (a stream's unread), and the reader waits until the next may pass. On a
            /// queue with [`partitions`](Self::partitions), one limit holds over them all. A
            /// stream's entries claimed back from a dead consumer were counted when first read
            /// and are not counted again. A limit per key is a list's
            /// ([`RedisList::rate_limit_by`](crate::RedisList::rate_limit_by)): a group reads a
            /// stream in order and cannot skip an entry to read a later one. Needs `n` >= 1 and
            /// `per` > 0. See `crate::claim::limit`.
            ///
            /// ```
            /// use std::time::Duration;
            /// use ruststream_redis::{RedisList, RedisStream};
            /// let emails = RedisList::new("{emails}").reliable().rate_limit(100, Duration::from_secs(1));
            /// assert_eq!(emails.rate().map(|r| r.n()), Some(100));
            /// let uploads = RedisStream::new("uploads")
            ///     .group("thumbnailer")
            ///     .rate_limit(50, Duration::from_secs(1));
            /// assert_eq!(uploads.rate().map(|r| r.per()), Some(Duration::from_secs(1)));
            /// ```
            pub fn rate_limit(mut self, n: u32, per: ::std::time::Duration) -> Self {
                self.queue.rate = Some($crate::RateLimit::new(n, per));
                self
            }

            /// The rate limit, if any.
            pub fn rate(&self) -> Option<&$crate::RateLimit> {
                self.queue.rate.as_ref()
            }

            /// Handles at most `n` messages of the queue at once, across every worker of every
            /// instance. The script that takes messages counts what the queue records in flight
            /// (a reliable list's processing list, `LLEN <key>.processing`; a stream group's
            /// pending entries, the `XPENDING key group` summary) and takes at most `n` minus
            /// that; an ack, a retry, a dead letter and the recovery of a dead worker's claims
            /// free the cap, so it adds no key and no command to a settle. A reader held back
            /// takes again after 20 ms. A dead worker's claims hold the cap until they come back
            /// (after [`min_idle`](Self::min_idle); a stream's, until the consumer that claims
            /// them back settles them); with
            /// [`no_recovery`](Self::no_recovery), until moved back by hand. Needs a reliable
            /// list (a simple list's pop records nothing in flight) or a stream group, without
            /// partitions (each partition records its own in a slot of its own), and `n` >= 1.
            /// See `crate::claim::cap`.
            ///
            /// ```
            /// use ruststream_redis::{RedisList, RedisStream};
            /// // Four renders at once in all, however many instances run, each with 16 permits.
            /// let renders = RedisList::new("{renders}").reliable().concurrency(16).max_in_flight(4);
            /// let uploads = RedisStream::new("uploads").group("thumbnailer").max_in_flight(8);
            /// # let _ = (renders, uploads);
            /// ```
            pub fn max_in_flight(mut self, n: u32) -> Self {
                self.queue.max_in_flight = Some(n);
                self
            }

            /// No crash recovery: what a worker held when it died stays there until moved back
            /// by hand. On a reliable list a claim is not recorded, and a dead worker's entries
            /// stay in the processing list (the app says at startup how many entries sit
            /// there); on a stream they stay pending on the dead consumer until a consumer of
            /// the same name starts again (or someone claims them).
            pub fn no_recovery(mut self) -> Self {
                self.queue.no_recovery = true;
                self
            }

            /// How long a dead worker's claims take to come back (default
            /// [`DEFAULT_MIN_IDLE`](crate::DEFAULT_MIN_IDLE)): a reliable list's claims go back
            /// onto the queue; a stream's entries pending on a consumer that is gone are claimed
            /// by another consumer of the group. A live worker keeps its claims alive however
            /// long its handlers run (see the transport's module docs), so this need not outlast
            /// the slowest handler; a shorter one brings a crashed worker's work back sooner, at
            /// the price of more frequent renewals. Zero is refused at startup, and so is
            /// `min_idle` with [`no_recovery`](Self::no_recovery) or on a simple list.
            pub fn min_idle(mut self, idle: ::std::time::Duration) -> Self {
                self.queue.min_idle = Some(idle);
                self
            }
        }
    };
}

pub(crate) use queue_setters;
