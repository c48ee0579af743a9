//! Cancelling a message of a list queue or a stream by id (`publisher.cancel(destination, id)`,
//! the operator's `cancel`): [`CancelList`], the typed call of `cancel.lua`, [`CancelStream`]
//! (`stream.rs`, `stream.lua`: a stream read by groups), and [`cancel`], which runs one of them
//! on each partition of a destination.
//!
//! The queue's cancel record `K.cancels` (a hash, message id → what the cancel did, in the
//! queue's slot) is what makes a cancel exact under every race, and a resent cancel a no-op:
//!
//! - `cancel.lua` removes a delayed entry (`removed`), or finds a claimed one in the processing
//!   list and `PUBLISH`es its id on `K.cancel` (`signalled`), or, with entries in the queue,
//!   only records the id (`marked`; a list cannot be searched for an id in one step), and
//!   records what it did, once.
//! - The claim consults the record (`claim/cancels.lua`, a gate that sifts what was taken): an
//!   entry of a recorded id is dropped there, never delivered. One `EXISTS` per claim. A reader
//!   that reads natively (`crate::claim::native`) watches the record: while it exists, or once
//!   a cancel writes it, the reader claims through the script.
//! - A stream's read consults it (`stream/read.lua`, or the native read's watch as above): an
//!   entry read whose `rs.id` is recorded is acked there, never delivered; `stream/settle.lua` only acks a recorded message.
//! - The settle consults it (`list/settle.lua`): a settle of a recorded id only removes the
//!   entry, whatever the handler decided. So a cancel and an ack race atomically: the script
//!   that runs first wins.
//!
//! The record holds at most [`MOST`] ids and expires [`TTL`] after the last cancel: a message
//! queued longer than that after its cancel runs after all.
//!
//! A stream's record is the stream's, not a group's: a cancel cancels the message for every group
//! reading the stream.
//!
//! Commands: `EVALSHA` of `cancel.lua` (`HGET`, `ZSCORE`, `LRANGE`, `LLEN`, `HLEN`, `ZREM`,
//! `HDEL`, `HSET`, `PEXPIRE`, `PUBLISH`).

use std::sync::LazyLock;
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::{CancelOutcome, ConfigError, Error, ErrorKind, Result};

use crate::conn::Connections;
use crate::keys::KeySpace;
use crate::lua::{self, Call};

mod stream;
pub use stream::{CancelStream, StreamCancelKeys};

/// Most ids a queue's cancel record holds; a cancel past it is refused (`RSFULL`).
pub(crate) const MOST: usize = 10_000;

/// How long a queue's cancel record lives after its last cancel.
pub(crate) const TTL: Duration = Duration::from_secs(24 * 3600);

static CANCEL: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("cancel.lua")));

/// The keys a cancel of one list queue (or partition) touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelKeys {
    /// The cancel record (`K.cancels`).
    pub record: String,
    /// The Pub/Sub channel of the signal (`K.cancel`).
    pub channel: String,
    /// The delayed set.
    pub delayed: String,
    /// The delayed payload hash.
    pub payloads: String,
    /// The levels, lowest first (the queue alone without priority levels).
    pub levels: Vec<String>,
    /// The processing list, when the queue may have one.
    pub processing: Option<String>,
    /// What a message's step record is named, but for its id (`K.steps:`, `crate::steps`).
    pub steps: String,
}

impl CancelKeys {
    /// The keys of the full list key `queue` with `priorities` levels, with the processing
    /// list `processing` when it is in the queue's slot (an untagged simple list on a cluster
    /// has none there).
    pub(crate) fn of(
        space: &KeySpace,
        queue: &str,
        priorities: Option<u8>,
        processing: String,
    ) -> Self {
        let mut levels = vec![queue.to_owned()];
        levels.extend((1..priorities.unwrap_or(0)).map(|i| space.level(queue, i)));
        let delayed = space.delayed(queue);
        let same_slot = !space.is_cluster()
            || fred::util::redis_keyslot(processing.as_bytes())
                == fred::util::redis_keyslot(queue.as_bytes());
        Self {
            record: space.cancels(queue),
            channel: space.cancel_channel(queue),
            delayed: delayed.set,
            payloads: delayed.payloads,
            levels,
            processing: same_slot.then_some(processing),
            steps: space.steps(queue, ""),
        }
    }
}

/// One call of `cancel.lua`: cancels message `id` of one list queue.
#[derive(Debug, Clone, PartialEq)]
pub struct CancelList<'a> {
    /// The queue's keys.
    pub keys: &'a CancelKeys,
    /// The message id.
    pub id: &'a str,
}

impl Call for CancelList<'_> {
    /// What the cancel did (`missing` is [`CancelOutcome::NotFound`]); `None` for a reply the
    /// script does not give.
    type Reply = Option<CancelOutcome>;

    fn script(&self) -> &'static Script {
        &CANCEL
    }

    /// KEYS and ARGV: see `cancel.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let k = self.keys;
        let mut keys = vec![k.record.clone(), k.delayed.clone(), k.payloads.clone()];
        keys.extend(k.levels.iter().cloned());
        keys.extend(k.processing.clone());
        let args = vec![
            Value::from(self.id),
            Value::from(k.channel.as_str()),
            lua::int(MOST),
            lua::int(usize::try_from(TTL.as_millis()).unwrap_or(usize::MAX)),
            lua::int(k.levels.len()),
            Value::from(format!("{}{}", k.steps, self.id)),
        ];
        (keys, args)
    }

    fn parse(&self, reply: Value) -> Option<CancelOutcome> {
        outcome(reply)
    }
}

/// A cancel script's reply read as what it did; `None` for a reply the scripts do not give.
fn outcome(reply: Value) -> Option<CancelOutcome> {
    let b = crate::reply::value_bytes(reply)?;
    Some(match &b[..] {
        b"removed" => CancelOutcome::Removed,
        b"signalled" => CancelOutcome::Signalled,
        b"marked" => CancelOutcome::Marked,
        b"missing" => CancelOutcome::NotFound,
        _ => return None,
    })
}

/// Cancels message `id` of the list `destination` (as the user names it), on each of its
/// partitions until one finds it: the first `removed` or `signalled`, else `marked` if any
/// partition marked it, else not found.
pub(crate) async fn cancel(
    conns: &Connections,
    destination: &str,
    id: &str,
) -> Result<CancelOutcome> {
    let pool = conns.pool()?;
    let route = conns.routes.get(destination).unwrap_or_default();
    let (priorities, partitions, groups) = match &route {
        crate::PublishPolicy::List(p) => {
            (p.layout.priorities, p.layout.partitions, p.layout.groups)
        }
        crate::PublishPolicy::Stream(p) => {
            let mut names = crate::partition::keys(destination, p.partitions);
            if names.is_empty() {
                names.push(destination.to_owned());
            }
            let streams: Vec<StreamCancelKeys> = names
                .iter()
                .map(|name| StreamCancelKeys::of(&conns.keys, &conns.keys.key(name)))
                .collect();
            return on_each(
                &pool,
                streams
                    .iter()
                    .map(|keys| CancelStream { keys, id })
                    .collect(),
            )
            .await;
        }
        crate::PublishPolicy::PubSub(_) => {
            return Err(ConfigError::new(
                "cancel",
                "it is published on Pub/Sub, which stores nothing: only list queues and streams can be cancelled from",
                "cancel messages of a list queue or a stream",
            )
            .on(destination)
            .into());
        }
    };
    let names = match partitions {
        Some(_) => crate::partition::keys(destination, partitions),
        None => vec![destination.to_owned()],
    };
    let queues: Vec<CancelKeys> = names
        .iter()
        .map(|name| {
            let queue = conns.keys.key(name);
            let processing = conns.keys.processing(name, None);
            let mut keys = CancelKeys::of(&conns.keys, &queue, priorities, processing);
            // A grouped queue's entries wait in its groups: its ring is non-empty while any does.
            if groups {
                keys.levels
                    .push(crate::list::groups::ring(&conns.keys, &queue));
            }
            keys
        })
        .collect();
    on_each(
        &pool,
        queues.iter().map(|keys| CancelList { keys, id }).collect(),
    )
    .await
}

/// Runs each cancel of `calls` (one per queue or stream) until one finds the message: the first
/// `removed` or `signalled`, else `marked` if any marked it, else not found.
pub(crate) async fn on_each<C: Call<Reply = Option<CancelOutcome>> + Sync>(
    pool: &Pool,
    calls: Vec<C>,
) -> Result<CancelOutcome> {
    let mut marked = false;
    for call in calls {
        let outcome = call.call(pool.next()).await?.ok_or_else(|| {
            Error::broker(
                ErrorKind::UnexpectedReply,
                "the cancel script answered something else than removed, signalled, marked or missing",
            )
        })?;
        match outcome {
            CancelOutcome::Removed | CancelOutcome::Signalled => return Ok(outcome),
            CancelOutcome::Marked => marked = true,
            _ => {}
        }
    }
    Ok(if marked {
        CancelOutcome::Marked
    } else {
        CancelOutcome::NotFound
    })
}
