//! The setters that several builders share, written once: `partitions` on a list or stream
//! subscription and on its route ([`ListPublish`](super::ListPublish),
//! [`StreamPublish`](super::StreamPublish)), and `durable` on both routes. Sends no command.

/// Writes `partitions(n)` on `$ty`, setting its field `$($field).+` (an `Option<u16>`).
macro_rules! partitions_setter {
    ($ty:ty, $($field:ident).+) => {
        impl $ty {
            /// Spreads the queue over `n` lists or streams `{key:0}` … `{key:n-1}`, each in a
            /// hash slot of its own, so on a cluster one queue is not bounded by one Redis core.
            /// Every partition is a whole queue (its own delayed set and dead-letter list; a
            /// list's, its own processing list and recovery set too; a stream's, read by the
            /// same group); publishers spread messages over them, round robin or by
            /// [`partition_key`](::ruststream_core::PublishBuilder::partition_key) (order holds
            /// within a partition, so one key's messages stay in order), and every reader reads
            /// all of them. Name the key without a hash tag; the keys of the partitions cannot
            /// be named by hand. A subscription with partitions sets this on its key's route
            /// ([`list::Publish`](crate::list::Publish), [`stream::Publish`](crate::stream::Publish))
            /// itself; a producer-only process says it with
            /// [`RedisBroker::route`](crate::RedisBroker::route). How readers share their
            /// permits between partitions is in `docs/decisions.md`, "A partitioned queue is
            /// whole queues, read at once".
            ///
            /// ```
            /// use ruststream_redis::{RedisList, RedisStream, list, stream};
            /// let jobs = RedisList::new("jobs").reliable().partitions(4);
            /// assert_eq!(jobs.partition_keys(), ["{jobs:0}", "{jobs:1}", "{jobs:2}", "{jobs:3}"]);
            /// let events = RedisStream::new("events").group("audit").partitions(2);
            /// assert_eq!(events.partition_keys(), ["{events:0}", "{events:1}"]);
            /// // What a process that only publishes to them routes:
            /// let routes = (list::Publish::new().partitions(4), stream::Publish::new().partitions(2));
            /// # let _ = routes;
            /// ```
            pub fn partitions(mut self, n: u16) -> Self {
                self.$($field).+ = Some(n);
                self
            }
        }
    };
}

/// Writes `durable(replicas, timeout)` on the route `$ty`, which has a field `durable`.
macro_rules! durable_setter {
    ($ty:ty) => {
        impl $ty {
            /// Every publish to the list or stream returns `Ok` only once `replicas` replicas
            /// acknowledged it, waiting at most `timeout` (see
            /// [`PublishBuilder::durable`](::ruststream_core::PublishBuilder::durable)): as a
            /// destination's route, this covers replies and publishes from handlers too.
            pub fn durable(mut self, replicas: u32, timeout: ::std::time::Duration) -> Self {
                self.durable = Some(::ruststream_core::Durability::new(replicas, timeout));
                self
            }
        }
    };
}

pub(crate) use {durable_setter, partitions_setter};
