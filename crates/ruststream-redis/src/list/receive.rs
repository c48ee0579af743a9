//! Reading a list subscription: one claim script for both modes, `claim.lua` (see
//! `crate::claim`), behind the subscription's gates (the operator's pause, a concurrency cap, a
//! rate limit) and from its priority levels, highest first.
//!
//! - Simple, with no gate but the pause and the cancels and no levels: `RPOP key n`, in a
//!   `MULTI` kept exact against a pause or a cancel by a `WATCH` of their keys
//!   (`crate::claim::native`); `claim.lua` while either is pending. The choice is made once, at
//!   startup, from the options.
//! - Simple otherwise: `claim.lua` pops up to `n` entries, recording nothing.
//! - Reliable: `claim.lua` sweeps stale claims back first (with recovery, and only by the
//!   sweep's deadline in the server's clock, `crate::sweep_clock`: `TIME` before a reader's
//!   first sweep), then claims up to `n` entries into the processing list, recorded in the
//!   recovery set as one batch (a member, and the batch's list of values); `reliable.rs` holds
//!   what only a reliable list does around the claim.
//! - When the queue is empty, `BLMOVE key key RIGHT RIGHT t`, which moves nothing but wakes when
//!   an entry arrives on level 0 (a level above announces its first entry on Pub/Sub, see
//!   `levels.rs`), then `claim.lua` again.
//! - Held back by a rate limit (see `crate::claim::limit`) or a concurrency cap (`crate::claim::cap`),
//!   a reader waits (no command) until the script says the next entry may pass, then claims
//!   again; held back by a pause, it returns nothing and its pause gate (`crate::pause`) waits
//!   for the resume.
//!
//! Before each read the subscription's [`Mover`] moves due delayed entries into the queue.
//!
//! Cancels (`crate::cancel`): the claim's last gate drops entries of cancelled messages, and
//! the reader listens on the queue's signal channel (`SUBSCRIBE K.cancel`) for cancels of
//! running ones, which it hands to the dispatch loop.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::lists::LMoveDirection;
use futures::future::BoxFuture;
use ruststream_core::{Delivery, Result};
use tokio_util::sync::CancellationToken;

use super::levels::Wakes;
use super::source::{ListKeys, Mode, RedisList};
use crate::back::Dest;
use crate::claim::limit::Limiter;
use crate::claim::native::{Native, Read, Watched};
use crate::claim::{self, Claim, Claimed, Record};
use crate::conn::{Connections, ReadConn};
use crate::dead::PushDeadLetters;
use crate::delayed::{Mover, interrupted, read_wait};
use crate::lua::Call;
use crate::memory::BlockingRead;
use crate::pause::{Gate, Hold};
use crate::reply::value_bytes;
use crate::transport::{
    Receive, RedisReceiver, RedisSettler, Token, list_delivery, signal_ids, watch_source,
};

/// The names whose `PUBLISH` wakes a reader waiting on level 0: the levels above it, and a
/// grouped queue's ring (a group joining it announces itself there).
fn wake_keys(keys: &ListKeys) -> Vec<String> {
    keys.levels.iter().chain(&keys.ring).cloned().collect()
}

/// Opens the receiver of `list`: its keys, mover, gauges and settler.
pub(super) async fn open(
    list: &RedisList,
    conns: &std::sync::Arc<Connections>,
    stop: CancellationToken,
) -> Result<RedisReceiver> {
    let keys = list.keys(&conns.keys);
    let pool = conns.pool()?;
    let conn = conns
        .reader(
            BlockingRead::List {
                key: keys.queue.clone(),
            },
            list.options.block,
        )
        .await?;
    let mut levels = vec![keys.queue.clone()];
    levels.extend(keys.levels.iter().cloned());
    let mover = Mover::open_if(
        conns,
        &list.options,
        &keys.delayed,
        keys.dead.as_deref(),
        Dest::list(levels),
    )
    .await?;
    let gate = watch_source(conns, list, &pool, &stop).await?;
    let pause = gate.as_ref().map(Gate::hold);
    let rate = list.queue.limiter(keys.rate.clone());
    let cap = list
        .queue
        .max_in_flight
        .zip(keys.processing.clone())
        .map(|(n, processing)| claim::Gate::cap_list(processing, n));
    let mut gates = claim::gates(pause.as_ref(), cap, rate.as_ref());
    gates.push(claim::Gate::cancels(keys.cancels.clone()));
    if let Some(ring) = &keys.ring {
        let group_cap = list.group_max_in_flight.zip(keys.processing.clone());
        gates.push(super::groups::gate(
            keys.queue.clone(),
            ring.clone(),
            group_cap.map(|(n, processing)| (processing, n)),
        ));
    }
    let signals = Some(conns.signals(&keys.cancel_channel).await?);
    let mut levels = vec![keys.queue.clone()];
    levels.extend(keys.levels.iter().cloned());
    // A simple list whose only gates are the pause and the cancels pops natively.
    let plain = list.mode == Mode::Simple
        && levels.len() == 1
        && rate.is_none()
        && keys.ring.is_none()
        && gates.len() == usize::from(pause.is_some()) + 1;
    let native = (plain && !conn.is_memory()).then(|| {
        let watched = pause.iter().map(|p| p.key().to_owned());
        let watched = watched.chain([keys.cancels.clone()]).collect();
        Watched::new(watched, conn.dial(), conn.command_timeout())
    });
    let reader = Reader {
        conn,
        stop,
        source: list.key.as_str().into(),
        block: list.options.block,
        mover,
        rate,
        pause,
        gates,
        levels,
        native,
        wakes: Wakes::open(conns, &wake_keys(&keys)).await?,
        signals,
    };
    let receiver = match list.mode {
        Mode::Simple => RedisReceiver::new(SimpleList {
            settler: RedisSettler::new(PushDeadLetters::new(
                pool,
                &keys.queue,
                keys.dead.clone(),
                list.options.dead_bound,
            )),
            reader,
        }),
        Mode::Reliable => super::reliable::open_reliable(list, keys, pool, reader),
    };
    Ok(receiver.gated(gate))
}

/// What both modes read with.
pub(super) struct Reader {
    pub(super) conn: ReadConn,
    stop: CancellationToken,
    /// The key as the user named it: each delivery's source.
    pub(super) source: Arc<str>,
    block: Duration,
    pub(super) mover: Option<Mover>,
    rate: Option<Limiter>,
    /// Told when the claim found the subscription paused.
    pause: Option<Hold>,
    /// The claim's gates: the pause, the concurrency cap, then the rate limit.
    gates: Vec<claim::Gate>,
    /// The levels, lowest first: level 0 (the queue) alone without priority levels.
    levels: Vec<String>,
    /// A simple list whose claim needs no script: its native pop's watch.
    native: Option<Watched>,
    /// With priority levels: woken when a level above 0 gets its first entry.
    wakes: Wakes,
    /// The ids cancels signal on the queue's channel, until the dispatch loop takes them.
    pub(super) signals: Option<tokio::sync::broadcast::Receiver<Bytes>>,
}

impl Reader {
    async fn move_due(&self) {
        if let Some(m) = &self.mover {
            m.move_due(self.conn.client()).await;
        }
    }

    /// How long the next blocking read may wait, at most `cap`.
    fn wait(&self, cap: Duration) -> Duration {
        read_wait(self.mover.as_ref(), self.block.min(cap))
    }

    /// Whether a read may wait for entries: not when stopping or hurried.
    fn may_wait(&self, hurry: &CancellationToken) -> bool {
        !self.stop.is_cancelled() && !hurry.is_cancelled()
    }

    /// Resolves on a stop, a hurry, a wake-up of the mover or of a priority level.
    async fn interruption(&self, hurry: &CancellationToken) {
        tokio::select! {
            () = interrupted(&self.stop, hurry, self.mover.as_ref()) => {}
            () = self.wakes.any() => {}
        }
    }

    /// One `claim.lua` call recording `record`, sweeping only by `sweep_by` (server time);
    /// what the gates held back is counted, and a pause closes the reader's pause gate.
    pub(super) async fn claim(
        &self,
        record: &Record,
        max: usize,
        first_seq: u64,
        sweep_by: Option<u64>,
    ) -> Result<Claimed> {
        // A claim with recovery may sweep: it runs when sent or not at all.
        let once = matches!(record, Record::Claims { .. }) && self.conn.sweeps_once();
        let claimed = Claim {
            levels: &self.levels,
            record,
            gates: &self.gates,
            max,
            first_seq,
            once,
            sweep_by,
        }
        .call(self.conn.client())
        .await?;
        let queue = &self.levels[0];
        let (closed, rate) = (claimed.closed.as_deref(), self.rate.is_some());
        claim::report(closed, claimed.held, self.pause.as_ref(), rate, queue);
        if claimed.recovered > 0 {
            let recovered = claimed.recovered;
            metrics::counter!("ruststream_recovered_total", "queue" => self.levels[0].clone())
                .increment(recovered);
            tracing::warn!(source = %self.source, recovered, "claims idle longer than min_idle went back to the queue");
        }
        Ok(claimed)
    }

    /// A simple list's take: `RPOP queue max` when its claim needs no script and neither the
    /// pause nor a cancel is pending (`crate::claim::native`), else `claim.lua`. What a pop that
    /// ran without its `WATCH` took while one was pending goes back to the queue's consuming
    /// end (`RPUSH`, newest first) and is claimed through the script.
    async fn pop(&self, max: usize) -> Result<Claimed> {
        if let Some(w) = &self.native {
            let queue = &self.levels[0];
            let pop = Read::Pop {
                key: queue,
                count: max,
            };
            match w.read(self.conn.client(), pop).await? {
                Native::Read(mut r) => {
                    return Ok(Claimed {
                        values: popped(r.pop()),
                        ..Claimed::default()
                    });
                }
                Native::Unsure(mut r) => {
                    let mut values = popped(r.pop());
                    if !values.is_empty() {
                        values.reverse();
                        let back: i64 = self
                            .conn
                            .client()
                            .rpush(queue, values)
                            .await
                            .map_err(crate::error::core)?;
                        tracing::info!(queue = %queue, entries = back, "a pop that raced a reconnect and a pause or cancel was put back");
                    }
                }
                Native::Script => {}
            }
        }
        self.claim(&Record::Pop, max, 0, None).await
    }

    /// Claims through `claim` (called with the most to take): once, then, when it took nothing
    /// and may wait, after waiting for the rate limit or for an entry (at most `cap`), once more.
    pub(super) async fn receive<F: Future<Output = Result<Claimed>>>(
        &self,
        max: usize,
        cap: Duration,
        hurry: &CancellationToken,
        claim: impl Fn(usize) -> F,
    ) -> Result<Claimed> {
        self.move_due().await;
        let claimed = claim(max).await?;
        if !claimed.values.is_empty() || claimed.paused() || !self.may_wait(hurry) {
            return Ok(claimed);
        }
        if claimed.held.wait.is_zero() {
            self.wait_for_entry(self.wait(cap), hurry).await?;
            self.move_due().await;
        } else {
            // Entries wait, held back by the rate limit: wait for it, not for entries.
            let limit = self
                .rate
                .as_ref()
                .map_or(self.block, |l| l.wait_cap(self.block));
            claimed.held.wait(limit, &self.stop, hurry).await;
        }
        claim(max).await
    }

    /// Waits until level 0 holds an entry, without taking it: `BLMOVE queue queue RIGHT RIGHT
    /// t`, which moves nothing, at most `wait` (a level above wakes the reader on Pub/Sub).
    async fn wait_for_entry(&self, wait: Duration, hurry: &CancellationToken) -> Result<()> {
        let queue = &self.levels[0];
        let waited = self
            .conn
            .blocking(
                wait,
                self.conn.client().blmove(
                    queue,
                    queue,
                    LMoveDirection::Right,
                    LMoveDirection::Right,
                    wait.as_secs_f64(),
                ),
                self.interruption(hurry),
            )
            .await;
        match waited {
            Ok(_) => Ok(()),
            // At maxmemory Redis refuses BLMOVE (it may grow a list), not the claim script
            // (allow-oom): wait here instead, so a full Redis still drains its queues.
            Err(e) if e.kind() == ruststream_core::ErrorKind::OutOfMemory => {
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = self.interruption(hurry) => {}
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    pub(super) fn deliveries(&self, values: Vec<Bytes>) -> Vec<Delivery<Token>> {
        values
            .into_iter()
            .map(|raw| list_delivery(self.source.clone(), raw))
            .collect()
    }
}

/// The values of an `RPOP key n` reply (none for a nil).
fn popped(reply: Option<Value>) -> Vec<Bytes> {
    match reply {
        Some(Value::Array(items)) => items.into_iter().filter_map(value_bytes).collect(),
        Some(v) => value_bytes(v).into_iter().collect(),
        None => Vec::new(),
    }
}

/// A simple list: popped, at most once.
struct SimpleList {
    reader: Reader,
    settler: RedisSettler,
}

impl Receive for SimpleList {
    fn receive<'a>(
        &'a mut self,
        max: usize,
        hurry: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Vec<Delivery<Token>>>> {
        Box::pin(async move {
            self.reader.conn.heal().await?;
            let r = &self.reader;
            let read = r
                .receive(max, Duration::MAX, hurry, |n| r.pop(n))
                .await
                .map(|claimed| r.deliveries(claimed.values));
            r.conn.check(read)
        })
    }

    fn settler(&self) -> RedisSettler {
        self.settler.clone()
    }

    fn probe(&self) -> Option<ruststream_core::Probe> {
        Some(self.reader.conn.probe())
    }

    fn cancel_signals(&mut self) -> Option<futures::stream::BoxStream<'static, String>> {
        self.reader.signals.take().map(signal_ids)
    }
}
