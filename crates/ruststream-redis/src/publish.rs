//! Publishing: groups a batch of messages by destination and policy, and hands each group to its
//! transport (`LPUSH` or `push_ttl.lua` for lists, pipelined `XADD` (with `MAXLEN`/`MINID ~`
//! when the policy bounds the stream) for streams, pipelined `PUBLISH` or `SPUBLISH` for
//! channels) or, for delayed messages, to the delayed set (`schedule.lua`). Groups for different
//! keys go out concurrently on the pool, which pipelines them.
//!
//! A destination spread over partitions (`crate::partition`) gets each message on the partition
//! its partition key picks, or the next one round robin; a unique message without a partition key
//! goes to the partition its id picks, so its window holds across partitions. A message with a
//! priority goes onto its level of a list with priority levels (`list::place`).
//!
//! A message for a list with fair groups goes onto its group's sub-queue (`list::groups`).
//!
//! Messages with a unique window (`crate::unique`) go out through `unique/publish.lua`, or
//! `schedule.lua` when delayed, which enqueue only those whose id holds no window yet.
//!
//! A durable group (`.durable(..)` or its route's) ends with `WAIT` on the client that wrote
//! it (`crate::durable`).
//!
//! Each destination's default policy comes from [`Routes`]: what the app's subscriptions read
//! (a stream is `XADD`ed to, a channel `PUBLISH`ed on, a sharded channel `SPUBLISH`ed on), what
//! `RedisBroker::route` set, else a list.

use fred::prelude::*;
use futures::future::try_join_all;
use ruststream_core::{OutMessage, Result};

use crate::back::Dest;
use crate::conn::Connections;
use crate::error::PubSubError;
use crate::frame::{encode_parts, new_id};
use crate::lua::Call;
use crate::policy::{PublishPolicy, Routes};
use crate::unique::{self, PublishUnique};
use crate::{delayed, list, pubsub, stream};

/// Messages for one key with one policy.
struct Group {
    key: String,
    /// The destination (or partition) before a priority level: unique windows are its.
    base: String,
    policy: PublishPolicy,
    /// List values or channel messages to send now.
    now: Vec<Value>,
    /// Delayed messages.
    later: Vec<delayed::Later>,
    /// Stream entries' fields.
    entries: Vec<Vec<Value>>,
    /// Messages due now with a unique window.
    unique: unique::Batch,
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
        policy.check(&m.destination)?;
        if matches!(policy, PublishPolicy::PubSub(_)) && m.due.is_some() {
            return Err(PubSubError::CannotDelay {
                channel: m.destination,
            }
            .into());
        }
        if matches!(policy, PublishPolicy::PubSub(_)) && m.durable.is_some() {
            return Err(PubSubError::CannotBeDurable {
                channel: m.destination,
            }
            .into());
        }
        let policy = policy.with_durable(m.durable);
        if matches!(policy, PublishPolicy::PubSub(_)) && m.unique_for.is_some() {
            return Err(PubSubError::CannotBeUnique {
                channel: m.destination,
            }
            .into());
        }
        let key = match policy.partitions() {
            Some(n) => {
                let by = m.partition_key.as_deref().or(match m.unique_for {
                    Some(_) => m.id.as_deref(),
                    None => None,
                });
                let i = crate::partition::pick(n, by, routes.round_robin());
                conns.keys.key(&crate::partition::key(&m.destination, i))
            }
            None => conns.keys.key(&m.destination),
        };
        if let Some(group) = m.headers.get(list::groups::HEADER) {
            list::groups::check(&m.destination, group)?;
        }
        // A message's unique window is its destination's (or partition's), whatever its level.
        let base = key.clone();
        let (key, policy) = list::place(&conns.keys, key, policy, &mut m)?;
        let i = match groups
            .iter()
            .position(|g| g.key == key && g.policy == policy)
        {
            Some(i) => i,
            None => {
                groups.push(Group {
                    key,
                    base,
                    policy,
                    now: Vec::new(),
                    later: Vec::new(),
                    entries: Vec::new(),
                    unique: unique::Batch::default(),
                });
                groups.len() - 1
            }
        };
        add(&mut groups[i], &conns.keys, m);
    }
    // One token per publish call that has unique messages: a call sent again after its reply
    // was lost recognises its own windows.
    let token = if groups
        .iter()
        .any(|g| !g.unique.is_empty() || g.later.iter().any(|l| l.unique.is_some()))
    {
        new_id()
    } else {
        String::new()
    };
    let sent = try_join_all(
        groups
            .into_iter()
            .map(|g| send(&pool, conns, g, token.as_str())),
    )
    .await?;
    Ok(sent.into_iter().sum())
}

fn add(g: &mut Group, keys: &crate::keys::KeySpace, m: OutMessage) {
    let id = m.id.unwrap_or_else(new_id);
    let unique = m.unique_for.map(|w| (unique::key(keys, &g.base, &id), w));
    if let Some(due) = m.due {
        // Waits in the delayed set as a frame; the mover turns it into its destination's form.
        g.later.push(delayed::Later {
            due,
            frame: encode_parts(&id, 1, &m.headers, &m.payload),
            id,
            unique,
        });
        return;
    }
    if let Some((key, window)) = unique {
        // A stream gets the frame's fields from `back.lua`.
        g.unique.frame(
            key,
            window,
            Value::Bytes(encode_parts(&id, 1, &m.headers, &m.payload)),
        );
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

/// Takes out of `g` the writes that can share the `WAIT`'s pipeline: a group of only plain
/// `LPUSH`es (no ttl, level 0) or only `XADD`s; nothing when it has scripts to run.
fn durable_lead(g: &mut Group, conns: &Connections) -> Vec<crate::durable::Write> {
    if !g.unique.is_empty() || !g.later.is_empty() {
        return Vec::new();
    }
    match g.policy {
        PublishPolicy::List(p)
            if p.ttl.is_none() && p.level == 0 && !p.layout.groups && g.entries.is_empty() =>
        {
            if g.now.is_empty() {
                return Vec::new();
            }
            let mut args = Vec::with_capacity(g.now.len() + 1);
            args.push(Value::from(g.key.as_str()));
            args.append(&mut g.now);
            vec![("LPUSH", args)]
        }
        PublishPolicy::Stream(p) if g.now.is_empty() => {
            let entries = std::mem::take(&mut g.entries);
            stream::xadds(&g.key, p, conns.memory.clock_ms(), entries)
                .map(|args| ("XADD", args))
                .collect()
        }
        _ => Vec::new(),
    }
}

/// Sends one group; returns how many of its messages were enqueued.
async fn send(pool: &Pool, conns: &Connections, g: Group, token: &str) -> Result<usize> {
    let client = pool.next();
    // `WAIT` counts the writes of its connection: taken on the client that writes (see
    // `crate::durable`).
    let durable = g
        .policy
        .durable()
        .map(|d| (d, crate::durable::connections(client)));
    let key = g.key.clone();
    let mut enqueued = g.now.len() + g.entries.len();
    // A durable group of plain pushes or adds goes out in the pipeline of its `WAIT`: one
    // round trip.
    let mut g = g;
    let lead = match &durable {
        Some(_) => durable_lead(&mut g, conns),
        None => Vec::new(),
    };
    if !g.now.is_empty() {
        match g.policy {
            PublishPolicy::PubSub(p) => pubsub::publish(client, &g.key, p, g.now).await?,
            PublishPolicy::List(p) if p.layout.groups => {
                let ring = list::groups::ring(&conns.keys, &g.key);
                list::groups::GroupPush {
                    queue: &g.key,
                    ring: &ring,
                    ttl: p.ttl,
                    values: &g.now,
                }
                .call(client)
                .await?;
            }
            PublishPolicy::List(p) => list::push(client, &g.key, p, g.now).await?,
            PublishPolicy::Stream(_) => {}
        }
    }
    if !g.unique.is_empty() {
        // Pub/Sub has no unique messages: `publish` refused them.
        if let Some(dest) = queue_dest(&conns.keys, &g.key, &g.base, g.policy) {
            let call = PublishUnique {
                dest: &dest,
                token,
                batch: &g.unique,
            };
            enqueued += call.call(client).await?;
        }
    }
    if !g.later.is_empty() {
        let delayed = conns.keys.delayed(&g.key);
        enqueued += delayed::ScheduleLater {
            set: &delayed.set,
            payloads: &delayed.payloads,
            token,
            entries: &g.later,
        }
        .call(client)
        .await?;
    }
    if let (false, Some(p)) = (g.entries.is_empty(), g.policy.stream()) {
        let now_ms = conns.memory.clock_ms();
        stream::add(client, &g.key, p, now_ms, g.entries).await?;
    }
    if let Some((d, before)) = durable {
        crate::durable::confirm(client, conns, &key, d, (enqueued > 0, lead), &before).await?;
    }
    Ok(enqueued)
}

/// The queue a message placed at `key` (its level, on a list with levels) of the destination or
/// partition `base` goes onto through `back.lua`; `None` for a channel.
pub(crate) fn queue_dest(
    keys: &crate::keys::KeySpace,
    key: &str,
    base: &str,
    policy: PublishPolicy,
) -> Option<Dest> {
    match policy {
        PublishPolicy::Stream(p) => Some(Dest::Stream {
            key: key.to_owned(),
            bound: p.script_arg(),
        }),
        // The levels up to the message's own: `back.lua` puts each onto the level its header
        // names, and announces a level above 0 that was empty.
        PublishPolicy::List(p) => Some(Dest::List {
            levels: std::iter::once(base.to_owned())
                .chain((1..=p.level).map(|i| keys.level(base, i)))
                .collect(),
            ttl_ms: p.ttl.map_or(0, list::ttl_ms),
        }),
        PublishPolicy::PubSub(_) => None,
    }
}
