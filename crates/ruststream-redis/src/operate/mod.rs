//! What an operator does to a running service's queues without writing code: look at them
//! ([`Operator::inspect`]), read, requeue and purge dead letters, list, promote and cancel
//! delayed entries, pause and resume a subscription. The `ruststream` crate's CLI subcommands
//! (`inspect`, `dead`, `delayed`, `pause`, `resume`) and its web dashboard are built on this.
//!
//! An [`Operator`] is made from the app's own subscriptions ([`RedisBroker::operator`]), so the
//! keys, prefix and hash tags are the ones the service uses, on any topology.
//!
//! | file | what | Redis |
//! |---|---|---|
//! | `inspect.rs` | sizes, ages, group state | `TIME`, `LLEN`, `ZRANGE .. WITHSCORES`, `ZCARD`, `XLEN`, `XINFO GROUPS`/`CONSUMERS`, `EXISTS`, `PUBSUB NUMSUB` |
//! | `dead.rs` | dead letters | `LRANGE`, `requeue.lua` (`LREM`/`LTRIM`, then `RPUSH`, `XADD` or `PUBLISH`), `purge.lua` (`LREM`, `LTRIM`, `DEL`) |
//! | `periodic.rs` | periodic jobs every instance registered | `TIME`, `HGETALL` of the registry and of the last ticks |
//! | `groups.rs` | a grouped list's largest groups; pausing one group | `groups.lua` (`LRANGE`, `LLEN`, `HLEN`, `HEXISTS`), `HSET`/`HDEL` + `PUBLISH` |
//! | `jobs.rs` | every job of a list queue or stream by state, paged; found by id or header | `LLEN`, `LRANGE` (levels, processing list, claims' batch lists), `ZRANGE .. WITHSCORES` of the recovery set, then `stream_jobs.rs`, `delayed.rs`, `dead.rs`, `completed.rs` |
//! | `stream_jobs.rs` | a stream's waiting and pending entries | `XINFO GROUPS`/`CONSUMERS`, `XRANGE`, `XPENDING` |
//! | `completed.rs` | completed jobs whose records live | `SCAN MATCH` (every node), `HMGET`, `PTTL` |
//! | `limits.rs` | a rate limit in use now | `TIME`, `GET` of `K.rate`, or `ZRANGE .. REV` and `ZCOUNT` of `K.rate.keys` |
//! | `flows.rs` | a queue's open flows and the children each waits for | `SCAN MATCH K.flow:*` (every node), `HGETALL` of each |
//! | `story.rs` | one job's story: its step record | `HGETALL`, `PTTL` of `K.steps:<id>` |
//! | `delayed.rs` | delayed entries | `ZRANGE .. WITHSCORES`, `HMGET`, `delayed.lua` (`ZADD XX CH` + `PUBLISH`, or `ZREM` + `HDEL`) |
//!
//! Pause and resume are `crate::pause`'s `SET`/`DEL` of `K.paused` with a `PUBLISH`.
//!
//! [`RedisBroker::operator`]: crate::RedisBroker::operator

mod completed;
pub(crate) mod dead;
pub(crate) mod delayed;
mod flows;
pub(crate) mod groups;
pub(crate) mod inspect;
mod jobs;
mod limits;
mod periodic;
mod scan;
mod story;
mod stream_jobs;

use std::sync::Arc;

use ruststream_core::{ConfigError, Error, Result};

pub use self::completed::COMPLETED_SCANNED;
pub use self::dead::DeadLetter;
pub use self::delayed::DelayedEntry;
pub use self::flows::FLOWS_SCANNED;
pub use self::groups::{GROUPS_READ, GROUPS_SHOWN, GroupLen, Groups};
pub use self::inspect::{CLAIMS_READ, Consumer, GroupState, Inspection};
pub use self::jobs::{GROUPS_LISTED, JOBS_SCANNED, Job, JobPage, JobState};
pub use self::limits::{KEYS_SHOWN, RateUse};
pub use self::periodic::PeriodicJob;
pub use self::scan::SCAN_CALLS;
pub use self::story::{Step, StepState, Steps};
pub use self::stream_jobs::STREAM_PAGED;
use crate::conn::Connections;
use crate::keys::SourceKeys;
pub use crate::pause::POLL as PAUSE_POLL;
use crate::transport::RedisSource;

/// Which entries an operator's change applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Select {
    /// The entry with this message id (for a dead letter without an id, `#N`: the N-th oldest).
    Id(String),
    /// Every entry, oldest (or earliest due) first, up to `limit` when given.
    All {
        /// Most entries to change.
        limit: Option<usize>,
    },
}

/// Entries one script call of the operator changes at most (the scripts' own bound), and the
/// page size of a dead-letter search.
const BATCH: usize = 1000;

/// Runs `call(take)` (a script that changes up to `take` entries and says how many it changed)
/// on `limit` of `len` entries (all without a limit), [`BATCH`] at a time, stopping early when
/// a call changes fewer than asked (the rest went meanwhile). Returns how many changed. Never
/// more than `len`, what the set or list held when the command started, so entries that arrive
/// meanwhile are left alone.
async fn in_batches<F, Fut>(len: usize, limit: Option<usize>, mut call: F) -> Result<usize>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<usize>>,
{
    let mut left = limit.map_or(len, |l| l.min(len));
    let mut done = 0;
    while left > 0 {
        let take = left.min(BATCH);
        let n = call(take).await?;
        done += n;
        left = left.saturating_sub(take);
        if n < take {
            break;
        }
    }
    Ok(done)
}

/// The operator's view of one broker's subscriptions.
#[derive(Clone)]
pub struct Operator {
    pub(crate) conns: Arc<Connections>,
    queues: Vec<SourceKeys>,
}

impl std::fmt::Debug for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("target", &self.conns.target())
            .field("queues", &self.queues)
            .finish()
    }
}

impl Operator {
    /// The operator of `sources` (one entry per key: a key subscribed twice is one queue).
    pub(crate) fn new(conns: Arc<Connections>, sources: &[RedisSource]) -> Self {
        let mut queues: Vec<SourceKeys> = Vec::new();
        for s in sources {
            for keys in crate::partition::queues(s.transport(), &conns.keys) {
                if !queues.iter().any(|q| q.name == keys.name) {
                    queues.push(keys);
                }
            }
        }
        Self { conns, queues }
    }

    /// Connects to Redis (the broker's pool), if not yet connected.
    pub async fn connect(&self) -> Result<()> {
        self.conns.connect().await
    }

    /// Where it connects, with passwords removed.
    pub fn target(&self) -> String {
        self.conns.target()
    }

    /// Every subscription's keys, in the order the app mounts them.
    pub fn subscriptions(&self) -> &[SourceKeys] {
        &self.queues
    }

    /// The subscription on `name` (its key or channel as the app names it).
    pub fn find(&self, name: &str) -> Option<&SourceKeys> {
        self.queues.iter().find(|q| q.name == name)
    }

    /// The subscription on `name`, or an error listing the app's subscriptions.
    pub(crate) fn queue(&self, name: &str) -> Result<&SourceKeys> {
        self.find(name).ok_or_else(|| {
            let names: Vec<&str> = self.queues.iter().map(|q| q.name.as_str()).collect();
            ConfigError::new(
                "subscription",
                "this app has no subscription of this name",
                format!("name one of: {}", names.join(", ")),
            )
            .on(name)
            .into()
        })
    }

    /// Pauses every reader of the subscription `name`, in every instance of the service, until
    /// [`resume`](Self::resume); handlers already running finish. `note` is kept in the pause
    /// key (who paused it and why). A Pub/Sub subscription cannot be paused: it stores nothing,
    /// so a paused subscriber would lose what is published meanwhile.
    ///
    /// `name` may be one partition of a queue spread over partitions (`{jobs:0}`), or the queue
    /// (`jobs`): every partition.
    pub async fn pause(&self, name: &str, note: &str) -> Result<()> {
        let pool = self.conns.pool()?;
        for key in self.pause_keys(name)? {
            crate::pause::pause(&pool, &key, note).await?;
        }
        Ok(())
    }

    /// Lets the readers of the subscription `name` (a partition, or every partition of the
    /// queue `name`) read again.
    pub async fn resume(&self, name: &str) -> Result<()> {
        let pool = self.conns.pool()?;
        for key in self.pause_keys(name)? {
            crate::pause::resume(&pool, &key).await?;
        }
        Ok(())
    }

    /// Cancels message `id` of the list or stream subscription `name` (a partition, or every partition of
    /// the queue `name`) wherever it is, as
    /// [`Publisher::cancel`](ruststream_core::Publisher::cancel) does, on the subscription's own
    /// keys (its processing list, its levels).
    pub async fn cancel_message(
        &self,
        name: &str,
        id: &str,
    ) -> Result<ruststream_core::CancelOutcome> {
        let parts = self.partitions_of(name);
        let queues: Vec<&SourceKeys> = if parts.is_empty() {
            vec![self.queue(name)?]
        } else {
            parts
        };
        let space = &self.conns.keys;
        let pool = self.conns.pool()?;
        let outcome = if queues.iter().all(|q| q.transport == "stream") {
            let streams: Vec<crate::cancel::StreamCancelKeys> = queues
                .iter()
                .map(|q| crate::cancel::StreamCancelKeys::of(space, &q.queue))
                .collect();
            let calls = streams
                .iter()
                .map(|keys| crate::cancel::CancelStream { keys, id })
                .collect();
            crate::cancel::on_each(&pool, calls).await?
        } else {
            let mut lists = Vec::new();
            for q in queues {
                if q.transport != "list" {
                    return Err(ConfigError::new(
                        "cancel",
                        format!(
                            "it is a {} subscription: only list queues and streams can be cancelled from",
                            q.transport
                        ),
                        "cancel messages of a list queue or a stream",
                    )
                    .on(name)
                    .into());
                }
                let mut levels = vec![q.queue.clone()];
                levels.extend(q.levels.iter().cloned());
                // A grouped queue's entries wait in its groups: its ring is non-empty while any does.
                levels.extend(q.groups.iter().cloned());
                lists.push(crate::cancel::CancelKeys {
                    record: space.cancels(&q.queue),
                    channel: space.cancel_channel(&q.queue),
                    delayed: q.delayed.clone().unwrap_or_default(),
                    payloads: q.delayed_payloads.clone().unwrap_or_default(),
                    levels,
                    processing: q.processing.clone(),
                    steps: space.steps(&q.queue, ""),
                });
            }
            let calls = lists
                .iter()
                .map(|keys| crate::cancel::CancelList { keys, id })
                .collect();
            crate::cancel::on_each(&pool, calls).await?
        };
        let jobs = crate::publisher::RedisPublisher {
            conns: self.conns.clone(),
            routes: self.conns.routes.clone(),
        };
        ruststream_core::cancel::with_job(&jobs, id, outcome).await
    }

    /// The flow `id` whose parent goes to the subscription `name` (a list or a stream; on a
    /// queue with partitions, each partition is looked in): its state and each child's
    /// (`crate::flow`); `None` when there is no such record (never published, or expired).
    pub async fn flow(&self, name: &str, id: &str) -> Result<Option<ruststream_core::FlowState>> {
        let parts = self.partitions_of(name);
        let queues: Vec<&SourceKeys> = if parts.is_empty() {
            vec![self.queue(name)?]
        } else {
            parts
        };
        let pool = self.conns.pool()?;
        for q in queues {
            let record = crate::flow::record_key(&self.conns.keys, &q.queue, id);
            if let Some(state) = crate::flow::read(pool.next(), &record).await? {
                return Ok(Some(state));
            }
        }
        Ok(None)
    }

    /// The flow `id` wherever its parent goes among this app's lists and streams (each
    /// partition too): the name of the queue whose record holds it, and its state; `None` when
    /// no queue has it. One `HGETALL` a queue, sent concurrently.
    pub async fn find_flow(
        &self,
        id: &str,
    ) -> Result<Option<(String, ruststream_core::FlowState)>> {
        let pool = self.conns.pool()?;
        let queues = self
            .queues
            .iter()
            .filter(|q| q.transport == "list" || q.transport == "stream");
        let reads = queues.map(|q| async {
            let record = crate::flow::record_key(&self.conns.keys, &q.queue, id);
            let state = crate::flow::read(pool.next(), &record).await?;
            Ok::<_, Error>(state.map(|s| (q.partition_of.clone().unwrap_or(q.name.clone()), s)))
        });
        let found = futures::future::try_join_all(reads).await?;
        Ok(found.into_iter().flatten().next())
    }

    /// The partitions of the queue `name`, when it has some.
    pub fn partitions_of(&self, name: &str) -> Vec<&SourceKeys> {
        self.queues
            .iter()
            .filter(|q| q.partition_of.as_deref() == Some(name))
            .collect()
    }

    fn pause_keys(&self, name: &str) -> Result<Vec<String>> {
        let parts = self.partitions_of(name);
        if parts.is_empty() {
            return Ok(vec![self.pause_key(name)?]);
        }
        Ok(parts.into_iter().filter_map(|q| q.paused.clone()).collect())
    }

    fn pause_key(&self, name: &str) -> Result<String> {
        let q = self.queue(name)?;
        q.paused.clone().ok_or_else(|| {
            ConfigError::new(
                "pause",
                "it is a Pub/Sub subscription: it stores nothing, so pausing it would lose what is published meanwhile",
                "stop the service instead",
            )
            .on(name)
            .into()
        })
    }
}
