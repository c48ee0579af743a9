//! Settling a reliable list: one `settle.lua` call per batch ([`SettleList`]: ack (or
//! cancelled: a cancel's, or any settle of a message in the cancel record) `LREM`, retry
//! `LPUSH` onto the entry's priority level (`back.lua`), retry later `ZADD`+`HSET` into the delayed set, dead `LPUSH K.dead`;
//! an ack or dead letter of a message with steps also `DEL`s its step record;
//! with recovery, each only while its batch's member is still in the recovery set and its index
//! unmarked in the batch's marks (`GET`, then `SET`: `marks.lua`); a batch fully marked leaves
//! the set with `ZREM`).
//!
//! Acks as pipelined `LREM`s would cost the client (fred, per command) twice what the script
//! costs Redis, so they stay in the script.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::{Result, Settlement};

use super::lease::Leases;
use super::source::ListKeys;
use crate::back::Dest;
use crate::dead::{DeadBound, Trims, discarded, logged};
use crate::delayed::DueClock;
use crate::lua::{self, Call};
use crate::options::SourceOptions;
use crate::settle::{Op, Settled};
use crate::transport::{InBatch, Settle, Token};

static SETTLE: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("settle.lua")));

/// The keys a list's settle writes besides its queue.
#[derive(Debug, Clone, PartialEq)]
pub struct SettleKeys {
    /// The processing list.
    pub processing: String,
    /// The dead-letter list (the processing list stands in without one: nothing is pushed).
    pub dead: String,
    /// The delayed set.
    pub delayed: String,
    /// The delayed payload hash.
    pub payloads: String,
    /// The recovery set (with recovery) or the settle-token set (without).
    pub record: String,
    /// The cancel record (`crate::cancel`): a settle of a cancelled message only removes it.
    pub cancels: String,
}

/// One call of `list/settle.lua`: settles claims of one list, retries going back onto `dest`.
#[derive(Debug, Clone, PartialEq)]
pub struct SettleList<'a> {
    /// The keys it writes besides the queue.
    pub keys: &'a SettleKeys,
    /// The queue (its levels), where a retry goes back.
    pub dest: &'a Dest,
    /// Without recovery, the settle's token (a settle sent twice runs once); `None` with.
    pub token: Option<String>,
    /// Per claim: its value in the processing list, its batch in the recovery record (with
    /// recovery), and what to do with it.
    pub entries: Vec<(Bytes, Option<InBatch>, Op)>,
}

impl Call for SettleList<'_> {
    /// How many claims were still owned (-1: the token was settled already), and how many dead
    /// letters the bound trimmed.
    type Reply = Settled;

    fn script(&self) -> &'static Script {
        &SETTLE
    }

    /// KEYS and ARGV: see `list/settle.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let k = self.keys;
        let mut keys = vec![
            k.processing.clone(),
            k.dead.clone(),
            k.delayed.clone(),
            k.payloads.clone(),
            k.record.clone(),
            k.cancels.clone(),
        ];
        let mut args = Vec::with_capacity(8 + self.entries.len() * 2);
        args.push(self.token.as_deref().map_or_else(|| "".into(), Value::from));
        self.dest.push(&mut keys, &mut args);
        // With recovery the entries go in their batches' order, so that runs of consecutive
        // indices name their batch once (the order of one settle's entries means nothing).
        let mut order: Vec<&(Bytes, Option<InBatch>, Op)> = self.entries.iter().collect();
        if self.token.is_none() {
            order.sort_by(|a, b| place_of(a).cmp(&place_of(b)));
        }
        args.push(Value::Bytes(
            order.iter().map(|(_, _, op)| op.code()).collect(),
        ));
        if self.token.is_none() {
            let (runs, members) = batch_runs(&order);
            args.push(Value::Bytes(runs.into()));
            args.push(members.len().to_string().into());
            args.extend(members.into_iter().map(|m| Value::Bytes(m.clone())));
        }
        for (claimed, _, op) in order {
            args.push(Value::Bytes(claimed.clone()));
            op.push_rest(&mut args);
        }
        (keys, args)
    }

    fn parse(&self, reply: Value) -> Settled {
        Settled::parse(&reply)
    }
}

/// An entry's batch member and index, what a settle with recovery orders its entries by (an
/// entry without a batch, which the script refuses, first).
fn place_of(entry: &(Bytes, Option<InBatch>, Op)) -> Option<(&Bytes, usize)> {
    entry.1.as_ref().map(|b| (&b.member, b.index))
}

/// Where the entries' claims are recorded, as `settle.lua` reads it with recovery: the entries
/// (in their batches' order) as runs of consecutive indices in one batch, eight bytes a run (the
/// batch's number among `members`, from 1, two bytes; the run's first index, four bytes; its
/// length, two bytes; all big-endian); and the batches' members, each once. An entry without a
/// batch, or past 65,535 batches, is in a run of batch 0, which the script refuses.
fn batch_runs<'a>(entries: &[&'a (Bytes, Option<InBatch>, Op)]) -> (Vec<u8>, Vec<&'a Bytes>) {
    let mut runs = Vec::new();
    let mut members: Vec<&Bytes> = Vec::new();
    // The run being built: batch number, first index, length.
    let mut run: Option<(u16, u32, u16)> = None;
    let mut push = |r: (u16, u32, u16)| {
        runs.extend_from_slice(&r.0.to_be_bytes());
        runs.extend_from_slice(&r.1.to_be_bytes());
        runs.extend_from_slice(&r.2.to_be_bytes());
    };
    for entry in entries {
        let (number, index) = match &entry.1 {
            Some(b) => {
                if members.last() != Some(&&b.member) {
                    members.push(&b.member);
                }
                (
                    u16::try_from(members.len()).unwrap_or(0),
                    u32::try_from(b.index).unwrap_or(u32::MAX),
                )
            }
            None => (0, 0),
        };
        run = match run {
            Some((n, first, len))
                if n == number
                    && len < u16::MAX
                    && u32::from(len).checked_add(first) == Some(index) =>
            {
                Some((n, first, len + 1))
            }
            Some(done) => {
                push(done);
                Some((number, index, 1))
            }
            None => Some((number, index, 1)),
        };
    }
    if let Some(done) = run {
        push(done);
    }
    (runs, members)
}

/// Settles the entries of one reliable list.
pub(super) struct ReliableSettle {
    pool: Pool,
    keys: SettleKeys,
    /// The queue's levels, where retries go back.
    dest: Dest,
    /// Without recovery, the reader's id: a settle's token is `<reader id>:<its first claim>`,
    /// the same when the settle is sent again, and no other settle's.
    token_prefix: Option<String>,
    has_dead: bool,
    /// The dead-letter list's bound.
    bound: DeadBound,
    /// How long an ack or a dead letter keeps its message's step record (`keep_steps`);
    /// `None`: it deletes it.
    keep_steps: Option<Duration>,
    /// What the bound trimmed.
    trims: Trims,
    /// The reader's due clock, so a delayed retry is not slept through.
    clock: Option<Arc<DueClock>>,
    /// The claims the reader holds: a settled claim is let go.
    leases: Arc<Leases>,
}

impl ReliableSettle {
    pub(super) fn new(
        pool: Pool,
        keys: &ListKeys,
        reader_id: &str,
        options: &SourceOptions,
        clock: Option<Arc<DueClock>>,
        leases: Arc<Leases>,
    ) -> Self {
        let dead = keys.dead.clone().unwrap_or_default();
        let processing = keys.processing.clone().unwrap_or_default();
        let mut levels = vec![keys.queue.clone()];
        levels.extend(keys.levels.iter().cloned());
        Self {
            pool,
            keys: SettleKeys {
                // Without a dead-letter list the script never writes this key.
                dead: keys.dead.clone().unwrap_or_else(|| processing.clone()),
                processing,
                delayed: keys.delayed.set.clone(),
                payloads: keys.delayed.payloads.clone(),
                record: keys
                    .recovery
                    .clone()
                    .or_else(|| keys.settle_tokens.clone())
                    .unwrap_or_default(),
                cancels: keys.cancels.clone(),
            },
            dest: Dest::list(levels),
            token_prefix: keys.recovery.is_none().then(|| reader_id.to_owned()),
            has_dead: keys.dead.is_some(),
            bound: options.dead_bound,
            keep_steps: options.keep_steps,
            trims: Trims::new(&keys.queue, &dead),
            clock,
            leases,
        }
    }

    async fn settle(&self, batch: &[(Token, Settlement)]) -> Result<()> {
        let token = match (
            &self.token_prefix,
            batch.iter().filter_map(|(t, _)| t.claim).min(),
        ) {
            (Some(prefix), Some(first)) => Some(format!("{prefix}:{first}")),
            _ => None,
        };
        let mut earliest: Option<Duration> = None;
        let entries = batch
            .iter()
            .map(|(t, s)| {
                let op = match s {
                    Settlement::Ack => Op::ack(t.steps.as_ref(), self.keep_steps),
                    Settlement::Cancelled => Op::ack(t.steps.as_ref(), None),
                    Settlement::Dead { reason } if !self.has_dead => {
                        discarded(t, reason);
                        Op::ack(t.steps.as_ref(), None)
                    }
                    Settlement::Dead { reason } => Op::dead(
                        t.dead_frame(reason),
                        self.bound,
                        t.steps.as_ref(),
                        self.keep_steps,
                    ),
                    Settlement::Retry {
                        delay: None,
                        snooze,
                        why,
                    } => Op::Retry {
                        frame: t.retry_frame(*snooze, why),
                    },
                    Settlement::Retry {
                        delay: Some(d),
                        snooze,
                        why,
                    } => {
                        earliest = Some(earliest.map_or(*d, |e| e.min(*d)));
                        Op::later(t, *d, *snooze, why)
                    }
                };
                (t.raw.clone(), t.batch.clone(), op)
            })
            .collect();
        let call = SettleList {
            keys: &self.keys,
            dest: &self.dest,
            token,
            entries,
        };
        let settled = call.call(self.pool.next()).await;
        // Sent: the claims are no longer this worker's to keep alive, whatever came of it (a
        // settle that keeps failing leaves them to the sweep).
        self.leases
            .release(batch.iter().filter_map(|(t, _)| t.claim));
        self.trims.record(settled?.trimmed);
        if self.has_dead {
            logged(batch, &self.keys.dead);
        }
        if let (Some(clock), Some(d)) = (&self.clock, earliest) {
            clock.retry_in(d);
        }
        Ok(())
    }
}

impl Settle for ReliableSettle {
    fn settle<'a>(&'a self, batch: &'a [(Token, Settlement)]) -> BoxFuture<'a, Result<()>> {
        Box::pin(ReliableSettle::settle(self, batch))
    }

    fn unsettled(&self) -> String {
        let processing = &self.keys.processing;
        if self.token_prefix.is_none() {
            format!("in `{processing}` and come back after min_idle")
        } else {
            format!(
                "in `{processing}`: this list has no recovery (no_recovery); move them back by hand (LMOVE) once no worker holds them"
            )
        }
    }
}
