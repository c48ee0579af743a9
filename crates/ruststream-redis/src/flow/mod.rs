//! Flows (`ruststream_core::flow`): a parent message enqueued once all its children are over.
//!
//! Each flow has one record, a hash in the *parent queue's* slot: `<parent key>.flow:<id>`
//! (`{reports}.flow:f1`; a partitioned parent's partition is picked by its partition key or,
//! without one, its id). It holds the parent's frame, the policy, how many children are left,
//! and per child its state and its result or dead reason (the fields are listed in
//! `flow/start.lua`). Every child carries two headers: [`CHILD_HEADER`] naming the record and
//! [`TO_HEADER`] the parent's queue as `back.lua` takes it. So the one script that records a
//! child's end and enqueues the parent (`flow/done.lua`) touches only the parent's slot,
//! wherever the child lived; the parent goes onto its queue through `back.lua`, the one way
//! back to a queue (levels, stream, ttl).
//!
//! Publishing ([`publish_flow`]): `flow/start.lua` writes the record first (once: a resent
//! publish finds it and learns which children are still unpublished), with the flow's plan
//! (`plan.rs`: every child and its publish policy) and an entry in the parent queue's
//! publishing set (`<parent key>.flows.publishing`); then the children are published like any
//! message (so levels, partitions, delays compose), a nested flow through this same function,
//! then `flow/sent.lua` marks them published and, once none is left, deletes the plan and the
//! entry. A crash or a lost reply anywhere in between is finished by the readers of the parent's
//! queue: their mover (`crate::delayed`) takes entries older than the grace, and [`repair`]
//! publishes what is unsent from the plan through this same function (or by publishing the same
//! flow id again); a child pushed but not yet marked is pushed again then (it is recorded once,
//! whatever runs twice).
//!
//! A child's end ([`child_done`], from the dispatch loop before the child's settle): its
//! result is read from its job record (`HGET`), then `flow/done.lua` records it.
//!
//! Commands: `EVALSHA` of `flow/start.lua` (`TYPE`, `EXISTS`, `HSET`, `HGET`, `PEXPIRE`, `TIME`,
//! `ZADD`, `PTTL`), `flow/sent.lua` (`HGET`, `HSET`, `HMGET`, `HDEL`, `ZREM`), `flow/done.lua` (`HGET`, `HSET`, `PEXPIRE`, and
//! `back.lua`'s push); `HGET` of a child's job record; `HGETALL` of a record (`state.rs`); a
//! repair's `HGET` of the plan and `ZREM` (`repair.rs`).

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::flow::{CHILD_HEADER, ChildOutcome, OutChild, OutFlow, RECORD_HEADER};
use ruststream_core::{ConfigError, Error, Headers, OutMessage, Result};

use crate::back::Dest;
use crate::conn::Connections;
use crate::error::core;
use crate::frame::encode_parts;
use crate::lua::{self, Call};
use crate::policy::{PublishPolicy, Routes};

mod plan;
mod repair;
mod state;
pub(crate) use repair::repair_boxed;
pub(crate) use state::{read, record_key};

/// The header naming, on a child, the queue its parent goes onto (`Dest::encode`).
pub(crate) const TO_HEADER: &str = "rs.flow.to";

/// Most children one flow has.
pub(crate) const MOST_CHILDREN: usize = 1000;

static START: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("start.lua")));
static SENT: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("sent.lua")));
static DONE: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("done.lua")));

/// One call of `flow/start.lua`: writes a flow's record unless it exists.
#[derive(Debug, Clone, PartialEq)]
pub struct StartFlow<'a> {
    /// The record's key.
    pub record: &'a str,
    /// The parent queue's publishing set.
    pub publishing: &'a str,
    /// The flow's id.
    pub id: &'a str,
    /// The parent's frame, as it will be enqueued.
    pub parent: Bytes,
    /// `fail` or `continue`.
    pub policy: &'a str,
    /// The flow's max age.
    pub max_age: Duration,
    /// The flow's plan (`flow/plan.rs`); empty for a repair, which never makes a record.
    pub plan: Bytes,
    /// The children's ids, in order.
    pub children: Vec<String>,
}

impl Call for StartFlow<'_> {
    /// The ids of the children still to be published.
    type Reply = Vec<String>;

    fn script(&self) -> &'static Script {
        &START
    }

    /// KEYS and ARGV: see `flow/start.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut args = vec![
            Value::from(self.id),
            Value::Bytes(self.parent.clone()),
            Value::from(self.policy),
            Value::Integer(crate::list::ttl_ms(self.max_age)),
            Value::Bytes(self.plan.clone()),
        ];
        args.extend(self.children.iter().map(|c| Value::from(c.as_str())));
        let keys = vec![self.record.to_owned(), self.publishing.to_owned()];
        (keys, args)
    }

    fn parse(&self, reply: Value) -> Vec<String> {
        match reply {
            Value::Array(ids) => ids.into_iter().filter_map(|v| v.into_string()).collect(),
            _ => Vec::new(),
        }
    }
}

/// One call of `flow/sent.lua`: marks children published.
#[derive(Debug, Clone, PartialEq)]
pub struct MarkSent<'a> {
    /// The record's key.
    pub record: &'a str,
    /// The parent queue's publishing set.
    pub publishing: &'a str,
    /// The children published.
    pub children: &'a [String],
}

impl Call for MarkSent<'_> {
    /// How many were marked.
    type Reply = u64;

    fn script(&self) -> &'static Script {
        &SENT
    }

    /// KEYS and ARGV: see `flow/sent.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let args = self.children.iter().map(|c| Value::from(c.as_str()));
        let keys = vec![self.record.to_owned(), self.publishing.to_owned()];
        (keys, args.collect())
    }

    fn parse(&self, reply: Value) -> u64 {
        lua::reply_u64(&reply)
    }
}

/// One call of `flow/done.lua`: records a child's end, enqueuing the parent when it ends the
/// flow.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildDone<'a> {
    /// The record's key.
    pub record: &'a str,
    /// Where the parent goes.
    pub dest: &'a Dest,
    /// The child's id.
    pub child: &'a str,
    /// How it ended.
    pub outcome: &'a ChildOutcome,
    /// Its result (acked), when it set one.
    pub result: Option<Bytes>,
    /// How long the record lives once the parent is enqueued.
    pub ttl: Duration,
}

impl Call for ChildDone<'_> {
    /// 0: nothing changed, 1: recorded, 2: recorded and the parent enqueued.
    type Reply = u64;

    fn script(&self) -> &'static Script {
        &DONE
    }

    /// KEYS and ARGV: see `flow/done.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let (code, value) = match self.outcome {
            ChildOutcome::Dead { reason } => ("x", Value::from(reason.as_str())),
            ChildOutcome::Acked | ChildOutcome::Pending => (
                "a",
                self.result
                    .clone()
                    .map_or_else(|| Value::from_static_str(""), Value::Bytes),
            ),
            _ => ("d", Value::from_static_str("")),
        };
        let mut keys = vec![self.record.to_owned()];
        let mut args = vec![
            Value::from(self.child),
            Value::from_static_str(code),
            value,
            Value::Integer(crate::list::ttl_ms(self.ttl)),
        ];
        self.dest.push(&mut keys, &mut args);
        (keys, args)
    }

    fn parse(&self, reply: Value) -> u64 {
        lua::reply_u64(&reply)
    }
}

/// Where a message for `m.destination` goes: its queue (as `back.lua` takes it) and the key
/// its unique windows and flow records derive from (the destination or its partition).
fn parent_queue(
    conns: &Connections,
    routes: &Routes,
    m: &mut OutMessage,
) -> Result<(Dest, String)> {
    let policy = routes.get(&m.destination).unwrap_or_default();
    policy.check(&m.destination)?;
    if matches!(policy, PublishPolicy::PubSub(_)) || m.due.is_some() {
        return Err(ConfigError::new(
            "flow",
            "a flow's parent must go to a list or a stream, published without a delay",
            "send the parent to a list queue or a stream, without `.delay(..)` or `.at(..)`",
        )
        .on(&m.destination)
        .into());
    }
    let base = match policy.partitions() {
        Some(n) => {
            let by = m.partition_key.as_deref().or(m.id.as_deref());
            let i = crate::partition::pick(n, by, routes.round_robin());
            conns.keys.key(&crate::partition::key(&m.destination, i))
        }
        None => conns.keys.key(&m.destination),
    };
    let (key, policy) = crate::list::place(&conns.keys, base.clone(), policy, m)?;
    let dest = crate::publish::queue_dest(&conns.keys, &key, &base, policy).ok_or_else(|| {
        ConfigError::new(
            "flow",
            "a flow's parent cannot go to a Pub/Sub channel",
            "send the parent to a list queue or a stream",
        )
        .on(&m.destination)
    })?;
    Ok((dest, base))
}

/// A flow whose record is written ([`start`]): what is left to publish of it.
struct Started {
    record: String,
    publishing: String,
    /// The ids of the children not yet published.
    unsent: Vec<String>,
    /// Those children that are messages, with the headers that make them this flow's.
    messages: Vec<OutMessage>,
    /// Those that are flows, with the headers that make their parents this flow's children.
    flows: Vec<(OutFlow, Headers)>,
}

/// Publishes `flow` (see the module docs); `outer` are the headers that make its parent a child
/// of an enclosing flow. A `repair` (`repair.rs`) publishes only what a record left unsent,
/// and nothing when the record is gone.
pub(crate) fn publish_flow<'a>(
    conns: &'a Connections,
    routes: &'a Routes,
    flow: OutFlow,
    outer: Headers,
    repair: bool,
) -> BoxFuture<'a, Result<()>> {
    Box::pin(async move {
        let started = start(conns, routes, flow, outer, repair).await?;
        for (sub, outer) in started.flows {
            publish_flow(conns, routes, sub, outer, false).await?;
        }
        crate::publish::publish(conns, routes, started.messages, None).await?;
        MarkSent {
            record: &started.record,
            publishing: &started.publishing,
            children: &started.unsent,
        }
        .call(conns.pool()?.next())
        .await?;
        Ok(())
    })
}

/// Writes `flow`'s record with its plan (`flow/start.lua`; a `repair` only reads it) and
/// returns what is left to publish.
async fn start(
    conns: &Connections,
    routes: &Routes,
    mut flow: OutFlow,
    outer: Headers,
    repair: bool,
) -> Result<Started> {
    if flow.children.len() > MOST_CHILDREN {
        return Err(ConfigError::new(
            ".child(..)",
            format!(
                "{} children, more than the {MOST_CHILDREN} one flow may have",
                flow.children.len()
            ),
            "nest flows",
        )
        .into());
    }
    let parent = &mut flow.parent;
    let id = parent.id.clone().unwrap_or_default();
    let (dest, base) = parent_queue(conns, routes, parent)?;
    let record = record_key(&conns.keys, &base, &id);
    let publishing = conns.keys.publishing(&base);
    parent.headers.extend(outer);
    parent
        .headers
        .insert(RECORD_HEADER.to_owned(), record.clone());
    let unsent = StartFlow {
        record: &record,
        publishing: &publishing,
        id: &id,
        parent: encode_parts(&id, 1, &parent.headers, &parent.payload),
        plan: if repair {
            Bytes::new()
        } else {
            plan::encode(&flow, routes)?
        },
        policy: flow.on_child_failure.as_str(),
        max_age: flow.max_age,
        children: flow
            .children
            .iter()
            .filter_map(|c| c.id().map(str::to_owned))
            .collect(),
    }
    .call(conns.pool()?.next())
    .await?;
    let mine: Headers = [
        (CHILD_HEADER.to_owned(), record.clone()),
        (TO_HEADER.to_owned(), dest.encode()),
    ]
    .into_iter()
    .collect();
    let (mut messages, mut flows) = (Vec::new(), Vec::new());
    for child in flow.children {
        if !child.id().is_some_and(|c| unsent.iter().any(|u| u == c)) {
            continue;
        }
        match child {
            OutChild::Message(mut m) => {
                m.headers.extend(mine.clone());
                messages.push(m);
            }
            OutChild::Flow(sub) => flows.push((*sub, mine.clone())),
            _ => {}
        }
    }
    Ok(Started {
        record,
        publishing,
        unsent,
        messages,
        flows,
    })
}

/// Publishes `flow` as a publisher that stops halfway: its record, then only its first
/// `children` message children (none of its nested flows), and no mark. For the tests of the
/// repair.
#[cfg(feature = "testing")]
pub(crate) async fn publish_halfway(
    conns: &Connections,
    routes: &Routes,
    flow: OutFlow,
    children: usize,
) -> Result<()> {
    let mut started = start(conns, routes, flow, Headers::new(), false).await?;
    started.messages.truncate(children);
    crate::publish::publish(conns, routes, started.messages, None).await?;
    Ok(())
}

/// Records a flow child's end (see the module docs): reads its result, then `flow/done.lua`.
pub(crate) async fn child_done(
    conns: &Connections,
    headers: &Headers,
    child: &str,
    outcome: ChildOutcome,
) -> Result<()> {
    let (Some(record), Some(dest)) = (
        headers.get(CHILD_HEADER),
        headers.get(TO_HEADER).and_then(|d| Dest::decode(d)),
    ) else {
        return Err(Error::Decode(format!(
            "flow child `{child}` has a malformed `{CHILD_HEADER}` or `{TO_HEADER}` header"
        )));
    };
    let pool = conns.pool()?;
    let result = match outcome {
        ChildOutcome::Acked => pool
            .next()
            .hget::<Option<Bytes>, _, _>(crate::keys::job_key(conns.keys.prefix(), child), "result")
            .await
            .map_err(core)?,
        _ => None,
    };
    ChildDone {
        record,
        dest: &dest,
        child,
        outcome: &outcome,
        result,
        ttl: conns.settings.result_ttl,
    }
    .call(pool.next())
    .await?;
    Ok(())
}
