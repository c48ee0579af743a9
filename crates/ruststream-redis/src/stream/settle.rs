//! Settling a stream subscription, one round trip per batch: plain acks are one
//! `XACK key group id..` (cheaper than the script on both sides); acks of messages with a step
//! record (`crate::steps`, deleted in the same script), retries and dead letters go
//! through `settle.lua` ([`SettleStream`]: `XACK`, then `XADD` and an `XTRIM` when the stream's
//! route bounds it (`back.lua`),
//! the delayed set, or `LPUSH` to the dead letters), sent at the same time.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::{Result, Settlement};

use super::recover::Held;
use super::source::StreamKeys;
use crate::back::Dest;
use crate::dead::{DeadBound, Trims, discarded, logged};
use crate::delayed::DueClock;
use crate::error::core;
use crate::lua::{self, Call};
use crate::options::SourceOptions;
use crate::settle::{Op, Settled};
use crate::transport::{Settle, Token};

/// Most field/value items a retried entry may have: `settle.lua` hands them to one `XADD` with
/// `unpack`, which Lua bounds (see `guard.lua`'s `MAX_UNPACK`; `back.lua` refuses more).
const MAX_XADD_FIELDS: usize = 7800;

static SETTLE: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("settle.lua")));

/// One call of `stream/settle.lua`: settles entries of one consumer group (not plain acks:
/// those are one `XACK`).
#[derive(Debug, Clone, PartialEq)]
pub struct SettleStream<'a> {
    /// The stream and its bound, where a retry goes back.
    pub dest: &'a Dest,
    /// The consumer group.
    pub group: &'a str,
    /// The dead-letter list (the stream stands in without one: nothing is pushed).
    pub dead: &'a str,
    /// The delayed set.
    pub delayed: &'a str,
    /// The delayed payload hash.
    pub payloads: &'a str,
    /// The stream's cancel record (`K.cancels`): a message it holds is only acked.
    pub cancels: &'a str,
    /// Per entry: its id, and what to do with it.
    pub entries: Vec<(Bytes, Op)>,
}

impl Call for SettleStream<'_> {
    /// How many entries were still pending, and how many dead letters the bound trimmed.
    type Reply = Settled;

    fn script(&self) -> &'static Script {
        &SETTLE
    }

    /// KEYS and ARGV: see `stream/settle.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut keys = vec![
            self.dead.to_owned(),
            self.delayed.to_owned(),
            self.payloads.to_owned(),
            self.cancels.to_owned(),
        ];
        let mut args = Vec::with_capacity(4 + self.entries.len() * 2);
        args.push(Value::from(self.group));
        self.dest.push(&mut keys, &mut args);
        for (id, op) in &self.entries {
            args.push(Value::Bytes(id.clone()));
            op.push(&mut args);
        }
        (keys, args)
    }

    fn parse(&self, reply: Value) -> Settled {
        Settled::parse(&reply)
    }
}

/// Settles the entries of one stream subscription.
pub(super) struct StreamSettle {
    pool: Pool,
    /// The stream and its bound (`bound.lua`), where retries go back.
    dest: Dest,
    stream: String,
    dead: String,
    delayed: String,
    payloads: String,
    cancels: String,
    group: String,
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
    /// The entries the reader holds: a settled entry is let go.
    held: Option<Arc<Held>>,
}

impl StreamSettle {
    pub(super) fn new(
        pool: Pool,
        keys: &StreamKeys,
        group: String,
        bound: String,
        options: &SourceOptions,
        clock: Option<Arc<DueClock>>,
        held: Option<Arc<Held>>,
    ) -> Self {
        Self {
            pool,
            dest: Dest::Stream {
                key: keys.stream.clone(),
                bound,
            },
            stream: keys.stream.clone(),
            // Without a dead-letter list the script never writes this key: the stream stands in.
            dead: keys.dead.clone().unwrap_or_else(|| keys.stream.clone()),
            delayed: keys.delayed.set.clone(),
            payloads: keys.delayed.payloads.clone(),
            cancels: keys.cancels.clone(),
            group,
            has_dead: keys.dead.is_some(),
            bound: options.dead_bound,
            keep_steps: options.keep_steps,
            trims: Trims::new(&keys.stream, keys.dead.as_deref().unwrap_or_default()),
            clock,
            held,
        }
    }

    async fn settle(&self, batch: &[(Token, Settlement)]) -> Result<()> {
        let client = self.pool.next();
        let mut entries = Vec::new();
        let mut acks: Vec<Value> = vec![self.stream.as_str().into(), self.group.as_str().into()];
        let mut earliest: Option<Duration> = None;
        for (t, s) in batch {
            let unfit = match s {
                Settlement::Retry { delay: None, .. } => unfit(t),
                _ => None,
            };
            let dead = match (s, &unfit) {
                (_, Some(reason)) => Some(reason.as_str()),
                (Settlement::Dead { reason }, _) => Some(reason.as_str()),
                _ => None,
            };
            let op = match (s, dead) {
                (_, Some(reason)) if self.has_dead => Op::dead(
                    t.dead_frame(reason),
                    self.bound,
                    t.steps.as_ref(),
                    self.keep_steps,
                ),
                (_, Some(reason)) => {
                    discarded(t, reason);
                    match &t.steps {
                        // The record goes with the ack, in the script.
                        Some(steps) => Op::AckSteps {
                            steps: steps.clone(),
                        },
                        None => {
                            acks.push(Value::Bytes(t.raw.clone()));
                            continue;
                        }
                    }
                }
                (
                    Settlement::Retry {
                        delay: Some(d),
                        snooze,
                        why,
                    },
                    None,
                ) => {
                    earliest = Some(earliest.map_or(*d, |e| e.min(*d)));
                    Op::later(t, *d, *snooze, why)
                }
                (
                    Settlement::Retry {
                        delay: None,
                        snooze,
                        why,
                    },
                    None,
                ) => Op::Retry {
                    frame: t.retry_frame(*snooze, why),
                },
                _ => match &t.steps {
                    Some(steps) if matches!(s, Settlement::Ack) => {
                        Op::ack(Some(steps), self.keep_steps)
                    }
                    Some(steps) => Op::AckSteps {
                        steps: steps.clone(),
                    },
                    None => {
                        acks.push(Value::Bytes(t.raw.clone()));
                        continue;
                    }
                },
            };
            entries.push((t.raw.clone(), op));
        }
        let call = SettleStream {
            dest: &self.dest,
            group: &self.group,
            dead: &self.dead,
            delayed: &self.delayed,
            payloads: &self.payloads,
            cancels: &self.cancels,
            entries,
        };
        let script = async {
            if call.entries.is_empty() {
                return Ok(());
            }
            call.call(client)
                .await
                .map(|s| self.trims.record(s.trimmed))
        };
        let xack = async {
            if acks.len() == 2 {
                return Ok(());
            }
            let _: i64 = client
                .custom(fred::cmd!("XACK"), acks)
                .await
                .map_err(core)?;
            Ok(())
        };
        let (script, xack) = tokio::join!(script, xack);
        // Sent: the entries are no longer this consumer's to keep alive, whatever came of it.
        if let Some(held) = &self.held {
            held.release(batch.iter().map(|(t, _)| &t.raw));
        }
        script.and(xack)?;
        if self.has_dead {
            logged(batch, &self.dead);
        }
        if let (Some(clock), Some(d)) = (&self.clock, earliest) {
            clock.retry_in(d);
        }
        Ok(())
    }
}

/// Why the entry a retry re-adds cannot be re-added, if it cannot: its frame becomes a stream
/// entry of `rs.id`, `rs.attempt`, its headers and `payload` (`frame.lua`'s `frame_fields`), and
/// a script cannot pass that many values to one XADD.
fn unfit(t: &Token) -> Option<String> {
    let fields = 6 + 2 * t.frame.headers.len();
    if fields <= MAX_XADD_FIELDS {
        return None;
    }
    let reason = format!(
        "too-many-headers: {fields} stream fields, more than one XADD can take ({MAX_XADD_FIELDS})"
    );
    tracing::warn!(message_id = %t.frame.id, %reason, "retry not possible: to the dead-letter list");
    Some(reason)
}

impl Settle for StreamSettle {
    fn settle<'a>(&'a self, batch: &'a [(Token, Settlement)]) -> BoxFuture<'a, Result<()>> {
        Box::pin(StreamSettle::settle(self, batch))
    }

    fn unsettled(&self) -> String {
        let (stream, group) = (&self.stream, &self.group);
        if self.held.is_some() {
            format!("pending in group `{group}` of `{stream}` and come back after min_idle")
        } else {
            format!(
                "pending in group `{group}` of `{stream}`: this stream has no recovery (no_recovery); claim them by hand (XCLAIM)"
            )
        }
    }
}
