//! `inspect`: how much waits, runs, is delayed or dead in each subscription, read in one pipeline
//! per subscription: `TIME`, `LLEN` (of each priority level too), `ZRANGE 0 0 WITHSCORES`,
//! `ZCARD`, `EXISTS`, `oldest_claim.lua` (a read-only `ZRANGE` of the recovery set) (lists);
//! `groups.lua` (a grouped list's largest groups);
//! `XINFO GROUPS`, `XINFO CONSUMERS`, `XLEN` (streams); `PUBSUB NUMSUB` (Pub/Sub; a sharded
//! channel's `PUBSUB SHARDNUMSUB`, on the node owning its slot, counts that node's subscribers).

use std::sync::LazyLock;

use crate::keys::slot_of;
use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::Result;
use serde::Serialize;

use super::Operator;
use crate::error::core;
use crate::keys::SourceKeys;
use crate::lua::{self, Call};

/// Most claims `inspect` reads to find the oldest (claims in flight are bounded by the workers'
/// concurrency; this bounds the reply).
pub const CLAIMS_READ: usize = 10_000;

static OLDEST_CLAIM: LazyLock<Script> =
    LazyLock::new(|| lua::script(include_str!("oldest_claim.lua")));

/// One call of `oldest_claim.lua`: when the oldest of the first `most` claims in a recovery set
/// was made.
#[derive(Debug, Clone, PartialEq)]
pub struct OldestClaim<'a> {
    /// The recovery set (full name).
    pub zset: &'a str,
    /// Most members to read.
    pub most: usize,
}

impl Call for OldestClaim<'_> {
    /// The members read, and the oldest claim's time in ms since the epoch (`None` when no
    /// member names one).
    type Reply = (u64, Option<i64>);

    fn script(&self) -> &'static Script {
        &OLDEST_CLAIM
    }

    /// KEYS and ARGV: see `oldest_claim.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        (vec![self.zset.to_owned()], vec![lua::int(self.most)])
    }

    fn parse(&self, reply: Value) -> (u64, Option<i64>) {
        let Value::Array(items) = reply else {
            return (0, None);
        };
        let oldest = match items.get(1) {
            Some(Value::Integer(at)) if *at >= 0 => Some(*at),
            _ => None,
        };
        (items.first().map_or(0, lua::reply_u64), oldest)
    }
}

/// One subscription's state.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Inspection {
    /// The subscription's keys, transport and mode.
    pub keys: SourceKeys,
    /// Entries waiting to be read (a stream: entries the group has not read yet, its lag; a
    /// list with priority levels: on all its levels).
    pub ready: Option<u64>,
    /// A list with priority levels: the entries waiting on each level, lowest first.
    pub levels: Option<Vec<u64>>,
    /// Entries claimed and not settled (a reliable list's processing list, a group's pending).
    pub in_flight: Option<u64>,
    /// A reliable list with recovery: how long ago the oldest claim was made (a handler that
    /// runs long, or is stuck, shows here), among the first [`CLAIMS_READ`] claims.
    pub oldest_claim_age_ms: Option<u64>,
    /// A reliable list with recovery: how long ago the stalest claim was last renewed by its
    /// worker (claims of a dead worker grow past `min_idle`, then come back to the queue).
    pub oldest_claim_idle_ms: Option<u64>,
    /// Entries waiting in the delayed set.
    pub delayed: Option<u64>,
    /// When the next delayed entry is due, in ms from now (negative: overdue).
    pub next_due_in_ms: Option<i64>,
    /// Entries in the dead-letter list.
    pub dead: Option<u64>,
    /// Whether an operator paused the subscription.
    pub paused: Option<bool>,
    /// A list with fair groups: its largest groups (`ready` counts the inbox and the groups).
    pub groups: Option<super::Groups>,
    /// A stream's consumer group.
    pub group: Option<GroupState>,
    /// Pub/Sub: subscribers of the channel on the node asked (on a cluster, one node's count).
    pub subscribers: Option<u64>,
}

/// A stream consumer group's state (`XINFO GROUPS`, `XINFO CONSUMERS`).
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct GroupState {
    /// Entries in the stream the group has not read yet (`lag`; absent when Redis cannot tell).
    pub lag: Option<u64>,
    /// Entries delivered and not acknowledged.
    pub pending: u64,
    /// The last entry id delivered to the group.
    pub last_delivered_id: String,
    /// Each consumer's pending count and idle time.
    pub consumers: Vec<Consumer>,
}

/// One consumer of a group.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Consumer {
    /// Its name.
    pub name: String,
    /// Entries it holds.
    pub pending: u64,
    /// Milliseconds since it last read or claimed.
    pub idle_ms: u64,
}

impl Operator {
    /// The state of the subscription `name` (each partition of the queue `name`, when it has
    /// partitions), or of every subscription when `None`.
    pub async fn inspect(&self, name: Option<&str>) -> Result<Vec<Inspection>> {
        let queues: Vec<&SourceKeys> = match name {
            Some(n) if !self.partitions_of(n).is_empty() => self.partitions_of(n),
            Some(n) => vec![self.queue(n)?],
            None => self.queues.iter().collect(),
        };
        let client = self.conns.pool()?.next().clone();
        let mut out = Vec::with_capacity(queues.len());
        for q in queues {
            out.push(inspect_one(&client, q).await?);
        }
        Ok(out)
    }
}

async fn inspect_one(client: &Client, q: &SourceKeys) -> Result<Inspection> {
    let mut i = Inspection {
        keys: q.clone(),
        ready: None,
        levels: None,
        in_flight: None,
        oldest_claim_age_ms: None,
        oldest_claim_idle_ms: None,
        delayed: None,
        next_due_in_ms: None,
        dead: None,
        paused: None,
        groups: None,
        group: None,
        subscribers: None,
    };
    let now = server_ms(client).await?;
    match (q.transport, &q.group) {
        ("stream", Some(group)) => {
            let state = group_state(client, &q.queue, group).await?;
            i.ready = state.lag;
            i.in_flight = Some(state.pending);
            i.group = Some(state);
        }
        ("pubsub", _) => {
            let v: Value = if q.mode == "sharded" {
                // To the node owning the channel's slot, which keeps its sharded subscribers.
                let cmd = fred::cmd!("PUBSUB", hash: slot_of(&q.queue));
                client.custom(cmd, vec!["SHARDNUMSUB", q.queue.as_str()])
            } else {
                client.custom(fred::cmd!("PUBSUB"), vec!["NUMSUB", q.queue.as_str()])
            }
            .await
            .map_err(core)?;
            i.subscribers = count_of_numsub(v);
        }
        _ => {
            i.ready = Some(client.llen(&q.queue).await.map_err(core)?);
            if !q.levels.is_empty() {
                let mut levels = vec![i.ready.unwrap_or(0)];
                for l in &q.levels {
                    levels.push(client.llen(l).await.map_err(core)?);
                }
                i.ready = Some(levels.iter().sum());
                i.levels = Some(levels);
            }
            if let Some(ring) = &q.groups {
                let groups = super::groups::GroupsTop {
                    queue: &q.queue,
                    ring,
                    most: super::GROUPS_READ,
                    top: super::GROUPS_SHOWN,
                }
                .call(client)
                .await?;
                i.ready = Some(groups.inbox + groups.waiting);
                i.groups = Some(groups);
            }
            if let Some(p) = &q.processing {
                i.in_flight = Some(client.llen(p).await.map_err(core)?);
            }
            if let Some(z) = &q.recovery {
                let since = |at: i64| now.saturating_sub(at).max(0).unsigned_abs();
                i.oldest_claim_idle_ms = first_score(client, z).await?.map(since);
                let oldest = OldestClaim {
                    zset: z,
                    most: CLAIMS_READ,
                };
                let (_, oldest) = oldest.call(client).await?;
                i.oldest_claim_age_ms = oldest.map(since);
            }
        }
    }
    if let Some(d) = &q.delayed {
        i.delayed = Some(client.zcard(d).await.map_err(core)?);
        i.next_due_in_ms = first_score(client, d).await?.map(|at| at - now);
    }
    if let Some(d) = &q.dead {
        i.dead = Some(client.llen(d).await.map_err(core)?);
    }
    if let Some(p) = &q.paused {
        let n: i64 = client.exists(p).await.map_err(core)?;
        i.paused = Some(n > 0);
    }
    Ok(i)
}

/// The server's clock, in ms since the epoch.
pub(super) async fn server_ms(client: &Client) -> Result<i64> {
    let t: Vec<i64> = client
        .custom(fred::cmd!("TIME"), Vec::<Value>::new())
        .await
        .map_err(core)?;
    Ok(t.first().copied().unwrap_or(0) * 1000 + t.get(1).copied().unwrap_or(0) / 1000)
}

/// The lowest score of the sorted set `key`, if it has any member.
async fn first_score(client: &Client, key: &str) -> Result<Option<i64>> {
    let v: Vec<Value> = client
        .zrange(key, 0, 0, None, false, None, true)
        .await
        .map_err(core)?;
    Ok(v.get(1).and_then(Value::as_f64).map(|s| {
        #[allow(clippy::cast_possible_truncation)]
        let ms = s as i64;
        ms
    }))
}

/// `PUBSUB NUMSUB c` replies `[c, n]`.
fn count_of_numsub(v: Value) -> Option<u64> {
    match v {
        Value::Array(items) => items.get(1).and_then(Value::as_u64),
        Value::Map(map) => map.inner().into_values().next().and_then(|v| v.as_u64()),
        _ => None,
    }
}

pub(super) async fn group_state(client: &Client, stream: &str, group: &str) -> Result<GroupState> {
    let mut state = GroupState::default();
    let groups: Value = match client
        .custom(
            fred::cmd!("XINFO", hash: slot_of(stream)),
            vec!["GROUPS", stream],
        )
        .await
    {
        Ok(v) => v,
        Err(e) => {
            // The stream (and so the group) does not exist yet: nothing waits or runs. (Redis
            // says so with a plain `ERR`, so the stream's absence is asked, not read from it.)
            let exists: std::result::Result<i64, _> = client.exists(stream).await;
            if exists.is_ok_and(|n| n == 0) {
                state.lag = Some(0);
                return Ok(state);
            }
            return Err(core(e));
        }
    };
    for g in list_of(groups) {
        let f = crate::stream::pairs(g);
        if field(&f, "name").and_then(Value::as_string).as_deref() != Some(group) {
            continue;
        }
        state.lag = field(&f, "lag").and_then(Value::as_u64);
        state.pending = field(&f, "pending").and_then(Value::as_u64).unwrap_or(0);
        state.last_delivered_id = field(&f, "last-delivered-id")
            .and_then(Value::as_string)
            .unwrap_or_default();
    }
    let consumers: Value = match client
        .custom(
            fred::cmd!("XINFO", hash: slot_of(stream)),
            vec!["CONSUMERS", stream, group],
        )
        .await
    {
        Ok(v) => v,
        Err(e) if crate::error::kind_of(&e) == ruststream_core::ErrorKind::NoGroup => {
            return Ok(state);
        }
        Err(e) => return Err(core(e)),
    };
    for c in list_of(consumers) {
        let f = crate::stream::pairs(c);
        state.consumers.push(Consumer {
            name: field(&f, "name")
                .and_then(Value::as_string)
                .unwrap_or_default(),
            pending: field(&f, "pending").and_then(Value::as_u64).unwrap_or(0),
            idle_ms: field(&f, "idle").and_then(Value::as_u64).unwrap_or(0),
        });
    }
    Ok(state)
}

fn list_of(v: Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items,
        _ => Vec::new(),
    }
}

fn field<'a>(pairs: &'a [(String, Value)], name: &str) -> Option<&'a Value> {
    pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}
