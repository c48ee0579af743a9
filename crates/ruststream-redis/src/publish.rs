//! Publishing: groups a batch of messages by destination and policy, and hands each group to its
//! transport (`LPUSH` or `push_ttl.lua` for lists, pipelined `XADD` (with `MAXLEN`/`MINID ~`
//! when the policy bounds the stream) for streams, pipelined `PUBLISH` or `SPUBLISH` for
//! channels) or, for delayed messages, to the delayed set (`schedule.lua`). Groups for different
//! keys go out concurrently on the pool, which pipelines them.
//!
//! A destination spread over partitions (`crate::partition`) gets each message on the partition
//! its partition key picks, or the next one round robin. A message with a priority goes onto its
//! level of a list with priority levels (`list::place`).
//!
//! Each destination's default policy comes from [`Routes`]: what the app's subscriptions read
//! (a stream is `XADD`ed to, a channel `PUBLISH`ed on, a sharded channel `SPUBLISH`ed on), what
//! `RedisBroker::route` set, else a list.

use std::sync::Arc;

use fred::prelude::*;
use futures::future::{BoxFuture, try_join_all};
use ruststream_core::{Due, Error, OutMessage, PublishBackend, Result};

use crate::conn::Connections;
use crate::error::PubSubError;
use crate::frame::{encode_parts, new_id};
use crate::policy::{PublishPolicy, Routes};
use crate::{delayed, list, pubsub, stream};

/// The publish backend of a [`RedisBroker`](crate::RedisBroker).
pub(crate) struct RedisPublisher {
    pub(crate) conns: Arc<Connections>,
    pub(crate) routes: Arc<Routes>,
}

impl PublishBackend for RedisPublisher {
    fn publish(&self, messages: Vec<OutMessage>) -> BoxFuture<'_, Result<usize>> {
        Box::pin(async move {
            // A publisher taken from a broker that no app started connects on first use.
            self.conns.connect().await?;
            publish(&self.conns, &self.routes, messages, None).await
        })
    }
}

/// Messages for one key with one policy.
struct Group {
    key: String,
    policy: PublishPolicy,
    /// List values or channel messages to send now.
    now: Vec<Value>,
    /// `schedule.lua` arguments of delayed messages.
    later: Vec<Value>,
    /// Stream entries' fields.
    entries: Vec<Vec<Value>>,
}

/// Publishes `messages`, each with `policy` or its destination's default; returns how many
/// were enqueued.
pub(crate) async fn publish(
    conns: &Connections,
    routes: &Routes,
    messages: Vec<OutMessage>,
    policy: Option<PublishPolicy>,
) -> Result<usize> {
    let pool = conns.pool()?;
    let mut groups: Vec<Group> = Vec::new();
    for mut m in messages {
        let policy = policy
            .or_else(|| routes.get(&m.destination))
            .unwrap_or_default();
        policy.check(&m.destination).map_err(Error::config)?;
        if matches!(policy, PublishPolicy::PubSub(_)) && m.due.is_some() {
            return Err(PubSubError::CannotDelay {
                channel: m.destination,
            }
            .into());
        }
        let key = match policy.partitions() {
            Some(n) => {
                let i = crate::partition::pick(n, m.partition_key.as_deref(), routes.round_robin());
                conns.keys.key(&crate::partition::key(&m.destination, i))
            }
            None => conns.keys.key(&m.destination),
        };
        let (key, policy) = list::place(&conns.keys, key, policy, &mut m)?;
        let i = match groups
            .iter()
            .position(|g| g.key == key && g.policy == policy)
        {
            Some(i) => i,
            None => {
                groups.push(Group {
                    key,
                    policy,
                    now: Vec::new(),
                    later: Vec::new(),
                    entries: Vec::new(),
                });
                groups.len() - 1
            }
        };
        add(&mut groups[i], m);
    }
    let sent = try_join_all(groups.into_iter().map(|g| send(&pool, conns, g))).await?;
    Ok(sent.into_iter().sum())
}

fn add(g: &mut Group, m: OutMessage) {
    let id = m.id.unwrap_or_else(new_id);
    if let Some(due) = m.due {
        // Waits in the delayed set as a frame; the mover turns it into its destination's form.
        let (kind, ms) = due_arg(due);
        g.later.extend([
            Value::from_static_str(kind),
            Value::Integer(ms),
            Value::from(id.as_str()),
            Value::Bytes(encode_parts(&id, 1, &m.headers, &m.payload)),
        ]);
        return;
    }
    match g.policy {
        PublishPolicy::List(_) | PublishPolicy::PubSub(_) => g
            .now
            .push(Value::Bytes(encode_parts(&id, 1, &m.headers, &m.payload))),
        PublishPolicy::Stream(_) => {
            g.entries
                .push(stream::fields(&id, 1, &m.headers, m.payload));
        }
    }
}

fn due_arg(due: Due) -> (&'static str, i64) {
    match due {
        Due::In(d) => ("in", i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        Due::At(t) => (
            "at",
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        ),
    }
}

/// Sends one group; returns how many of its messages were enqueued.
async fn send(pool: &Pool, conns: &Connections, g: Group) -> Result<usize> {
    let client = pool.next();
    let mut enqueued = g.now.len() + g.entries.len();
    if !g.now.is_empty() {
        match g.policy {
            PublishPolicy::PubSub(p) => pubsub::publish(client, &g.key, p, g.now).await?,
            PublishPolicy::List(p) => list::push(client, &g.key, p, g.now).await?,
            PublishPolicy::Stream(_) => {}
        }
    }
    if !g.later.is_empty() {
        enqueued += delayed::schedule(client, &conns.keys.delayed(&g.key), g.later).await?;
    }
    if let (false, Some(p)) = (g.entries.is_empty(), g.policy.stream()) {
        let now_ms = conns.memory.clock_ms();
        stream::add(client, &g.key, p, now_ms, g.entries).await?;
    }
    Ok(enqueued)
}
