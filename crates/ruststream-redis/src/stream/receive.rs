//! Reading a stream subscription: `read.lua` (see `crate::claim`), `XREADGROUP GROUP g consumer
//! COUNT n STREAMS key >` without `BLOCK` behind the claim's gates (the operator's pause, a
//! concurrency cap, a rate limit), on the subscription's own connection, after its [`Mover`]
//! moved due delayed entries in. A group with no cap and no rate limit reads natively: the same
//! `XREADGROUP` and an `XREVRANGE key + - COUNT 1` in a `MULTI` kept exact against a pause or a
//! cancel by a `WATCH` of their keys (`crate::claim::native`), `read.lua` while either is
//! pending; chosen once, at startup. When it read nothing, the reader waits: for the limit or the
//! cap, as long as the script says; for new entries, with `XREAD BLOCK ms STREAMS key <last
//! id>`, which delivers nothing to the group, then reads once more. Paused, it returns nothing and its pause gate waits.
//!
//! Cancels (`crate::cancel`): `read.lua` acks the entries of cancelled messages instead of
//! returning them, and the reader listens on the stream's signal channel (`SUBSCRIBE
//! K.cancel`) for cancels of running ones, which it hands to the dispatch loop.
//!
//! When its connection comes back (fred reconnected it, or it was replaced after a failed read),
//! the reader creates its group again before it next reads (`XGROUP CREATE key group 0
//! MKSTREAM`, an existing group kept): what came back may be a server that lost the group (a
//! restart without persistence, a failover to a replica that missed it), and every read would
//! fail with `NOGROUP` until the process restarted. A group created again reads from the
//! stream's start, as at startup: what the stream still holds is delivered again (at least once).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::keys::slot_of;
use bytes::Bytes;
use fred::prelude::*;
use futures::future::BoxFuture;
use ruststream_core::{Delivery, Result};
use tokio_util::sync::CancellationToken;

use super::entries::{StreamEntry, entries};
use super::recover::{Claimed, Group, Recovery};
use super::settle::StreamSettle;
use super::source::RedisStream;
use crate::back::Dest;
use crate::claim::limit::Limiter;
use crate::claim::native::Watched;
use crate::claim::{self, StreamClaimed, StreamRead};
use crate::conn::{Connections, ReadConn};
use crate::delayed::{Mover, interrupted, read_wait};
use crate::frame::{Frame, FrameError};
use crate::lua::Call;
use crate::memory::BlockingRead;
use crate::pause::{Gate, Hold};
use crate::reply::Reply;
use crate::transport::{
    Receive, RedisReceiver, RedisSettler, Token, delivery, pause_gate, signal_ids, unreadable,
    watch_source,
};

/// Opens the receiver of `stream`, and its other readers as its siblings (one consumer of the
/// group each, see [`RedisStream::readers`]).
pub(super) async fn open(
    stream: &RedisStream,
    conns: &std::sync::Arc<Connections>,
    stop: CancellationToken,
) -> Result<RedisReceiver> {
    let consumer = stream.consumer.clone().unwrap_or_else(consumer_name);
    let first = open_one(stream, conns, stop.clone(), consumer.clone(), true).await?;
    let mut siblings = Vec::new();
    for i in 2..=stream.reader_count() {
        let name = format!("{consumer}-{i}");
        siblings.push(open_one(stream, conns, stop.clone(), name, false).await?);
    }
    Ok(first.with_siblings(siblings))
}

/// Opens one reader of `stream` as the group's consumer `consumer`: its keys, mover and
/// settler; the `first` one also samples the gauges, hears cancel signals and trims.
async fn open_one(
    stream: &RedisStream,
    conns: &std::sync::Arc<Connections>,
    stop: CancellationToken,
    consumer: String,
    first: bool,
) -> Result<RedisReceiver> {
    let keys = stream.keys(&conns.keys);
    let group = stream.group_name().to_owned();
    let pool = conns.pool()?;
    let mut conn = conns
        .reader(
            BlockingRead::Stream {
                key: keys.stream.clone(),
                group: group.clone(),
            },
            stream.options.block,
        )
        .await?;
    // The stream's route (`RedisBroker::route`, else the subscription's plain XADD) bounds what
    // this subscription re-adds to it; a partition follows its stream's route.
    let bound = conns
        .routes
        .get(stream.partition_of.as_deref().unwrap_or(&stream.key))
        .and_then(|p| p.stream())
        .unwrap_or_default();
    let mover = Mover::open_if(
        conns,
        &stream.options,
        &keys.delayed,
        keys.dead.as_deref(),
        Dest::Stream {
            key: keys.stream.clone(),
            bound: bound.script_arg(),
        },
    )
    .await?;
    let gate = if first {
        watch_source(conns, stream, &pool, &stop).await?
    } else {
        pause_gate(conns, stream, &pool, &stop).await?
    };
    let pause = gate.as_ref().map(Gate::hold);
    let rate = stream.queue.limiter(keys.rate.clone());
    let cap = stream
        .queue
        .max_in_flight
        .map(|n| claim::Gate::cap_group(keys.stream.clone(), &group, n));
    let gates = claim::gates(pause.as_ref(), cap, rate.as_ref());
    // A group whose only gate is the pause reads natively.
    let native = (gates.len() == usize::from(pause.is_some()) && !conn.is_memory()).then(|| {
        let watched = pause.iter().map(|p| p.key().to_owned());
        let watched = watched.chain([keys.cancels.clone()]).collect();
        Watched::new(watched, conn.dial(), conn.command_timeout())
    });
    let signals = if first {
        Some(conns.signals(&keys.cancel_channel).await?)
    } else {
        None
    };
    let regroup = Arc::new(AtomicBool::new(false));
    let mark = regroup.clone();
    conn.on_reconnect(move || mark.store(true, Ordering::Release));
    let recovery = (!stream.queue.no_recovery).then(|| {
        let r = Recovery::new(
            stream.queue.idle(),
            stream.options.block,
            first.then(|| stream.reader_count()),
        );
        r.rejoin.watch(&mut conn);
        r.spawn_renewal(
            pool.clone(),
            Group {
                key: keys.stream.clone(),
                group: group.clone(),
                consumer: consumer.clone(),
            },
        );
        r
    });
    if let Some(every) = stream.trim_acked.filter(|_| first) {
        super::trim::spawn(pool.clone(), keys.stream.clone(), every, stop.clone());
    }
    let held = recovery.as_ref().map(|r| r.held.clone());
    let clock = mover.as_ref().map(Mover::clock);
    let settler = StreamSettle::new(
        pool.clone(),
        &keys,
        group.clone(),
        bound.script_arg(),
        &stream.options,
        clock,
        held,
    );
    let receiver = RedisReceiver::new(StreamReceiver {
        conn,
        stop,
        source: stream.key.as_str().into(),
        group: Group {
            key: keys.stream,
            group,
            consumer,
        },
        cancels: keys.cancels,
        signals,
        block: stream.options.block,
        mover,
        recovery,
        rate,
        pause,
        gates,
        native,
        held_back: Vec::new(),
        regroup,
        settler: RedisSettler::new(settler),
    });
    Ok(receiver.gated(gate))
}

struct StreamReceiver {
    conn: ReadConn,
    stop: CancellationToken,
    /// The key as the user named it: each delivery's source.
    source: Arc<str>,
    group: Group,
    /// The stream's cancel record: the read acks entries of the messages it holds.
    cancels: String,
    /// The ids cancels signal on the stream's channel, until the dispatch loop takes them.
    signals: Option<tokio::sync::broadcast::Receiver<Bytes>>,
    block: Duration,
    mover: Option<Mover>,
    recovery: Option<Recovery>,
    rate: Option<Limiter>,
    /// Told when the read found the subscription paused.
    pause: Option<Hold>,
    /// The read's gates: the pause, the concurrency cap, then the rate limit.
    gates: Vec<claim::Gate>,
    /// A group whose read needs no script: its native read's watch.
    native: Option<Watched>,
    /// Entries a native read got while a pause or a cancel was pending (it ran without its
    /// `WATCH`, after a reconnect), cancelled ones taken out: pending on this consumer,
    /// delivered by the next read that finds the subscription not paused.
    held_back: Vec<StreamEntry>,
    /// Set when the connection came back: create the group again before the next read.
    regroup: Arc<AtomicBool>,
    settler: RedisSettler,
}

impl StreamReceiver {
    /// The claimed entries whose messages were not cancelled. A cancelled one (its consumer was
    /// signalled, then died before its settle) is acked here, as the read acks a cancelled
    /// entry, and not delivered again: `HMGET` of the cancel record, then `XACK`. Only a sweep
    /// or a restart's own pending entries come here, so the read's hot path pays nothing.
    async fn uncancelled(&self, claimed: Vec<Claimed>) -> Result<Vec<Claimed>> {
        let ids: Vec<&str> = claimed.iter().map(|(_, f, _)| f.id.as_str()).collect();
        if claimed.is_empty() || ids.iter().all(|id| id.is_empty()) {
            return Ok(claimed);
        }
        let client = self.conn.client();
        let recorded: Vec<Option<Bytes>> = client
            .hmget(&self.cancels, ids)
            .await
            .map_err(crate::error::core)?;
        if recorded.iter().all(Option::is_none) {
            return Ok(claimed);
        }
        let (cancelled, kept): (Vec<_>, Vec<_>) = claimed
            .into_iter()
            .zip(recorded)
            .partition(|((_, f, _), r)| r.is_some() && !f.id.is_empty());
        let acked: Vec<Bytes> = cancelled.into_iter().map(|((id, _, _), _)| id).collect();
        let mut args: Vec<Value> = vec![
            self.group.key.as_str().into(),
            self.group.group.as_str().into(),
        ];
        args.extend(acked.iter().cloned().map(Value::Bytes));
        let _: i64 = client
            .custom(fred::cmd!("XACK"), args)
            .await
            .map_err(crate::error::core)?;
        if let Some(r) = &self.recovery {
            r.held.release(&acked);
        }
        tracing::info!(stream = %self.group.key, group = %self.group.group, entries = acked.len(),
            "claimed entries of cancelled messages acked, not delivered");
        Ok(kept.into_iter().map(|(c, _)| c).collect())
    }

    async fn receive(
        &mut self,
        max: usize,
        hurry: &CancellationToken,
    ) -> Result<Vec<Delivery<Token>>> {
        if let Some(m) = &self.mover {
            m.move_due(self.conn.client()).await;
        }
        self.regroup().await?;
        if !self.held_back.is_empty() {
            if self.paused_now().await? {
                return Ok(Vec::new());
            }
            let held = std::mem::take(&mut self.held_back);
            return Ok(self.deliver(held));
        }
        if let Some(r) = &mut self.recovery {
            let claimed = r.claim(&self.conn, &self.group, max).await?;
            let claimed = self.uncancelled(claimed).await?;
            if !claimed.is_empty() {
                return Ok(self.deliver(
                    claimed
                        .into_iter()
                        .map(|(id, frame, error)| (id, (frame, error))),
                ));
            }
        }
        let first = self.read(max).await?;
        if !matches!(first.reply, crate::reply::Reply::Null)
            || first.paused()
            || self.stop.is_cancelled()
            || hurry.is_cancelled()
        {
            return Ok(self.deliver(entries(first.reply)));
        }
        match first.last {
            Some(last) => {
                let wait = read_wait(self.mover.as_ref(), self.block);
                let block_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
                let args: Vec<Value> = vec![
                    "BLOCK".into(),
                    Value::Integer(block_ms),
                    "STREAMS".into(),
                    self.group.key.as_str().into(),
                    Value::from(last),
                ];
                let read = self.conn.client().custom(
                    fred::cmd!("XREAD", hash: slot_of(&self.group.key), blocking: true),
                    args,
                );
                let interrupt = interrupted(&self.stop, hurry, self.mover.as_ref());
                self.conn.blocking(wait, read, interrupt).await?;
                if let Some(m) = &self.mover {
                    m.move_due(self.conn.client()).await;
                }
            }
            None => {
                let cap = self
                    .rate
                    .as_ref()
                    .map_or(self.block, |l| l.wait_cap(self.block));
                first.held.wait(cap, &self.stop, hurry).await;
            }
        }
        let again = self.read(max).await?;
        Ok(self.deliver(entries(again.reply)))
    }

    /// Creates the group again if the connection came back since the last time (see the
    /// module docs); before the group's entries are claimed or read.
    async fn regroup(&self) -> Result<()> {
        // fred reconnected without a failed read: seen exactly here, since the reconnect's
        // listener may run after the read. The leases are renewed too.
        if self.conn.came_back() {
            self.regroup.store(true, Ordering::Release);
            if let Some(r) = &self.recovery {
                r.rejoin.mark();
            }
        }
        if !self.regroup.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let g = &self.group;
        match super::transport::create_group(self.conn.client(), &g.key, &g.group).await {
            Ok(true) => tracing::warn!(stream = %g.key, group = %g.group,
                "the consumer group was missing when the connection came back; created it again, reading from the stream's start"),
            Ok(false) => {}
            Err(e) => {
                self.regroup.store(true, Ordering::Release);
                return Err(e);
            }
        }
        Ok(())
    }

    /// One read: natively when the group's read needs no script (`crate::claim::native`:
    /// `XREADGROUP`, and `XREVRANGE key + - COUNT 1` for the id to wait from when it got
    /// nothing), else `read.lua`. What the read got, what the gates held back (counted), and
    /// the stream's last id when it read nothing though the gates let it; a pause closes the
    /// pause gate.
    async fn read(&mut self, max: usize) -> Result<StreamClaimed> {
        self.regroup().await?;
        if let Some(read) = self.read_native(max).await? {
            return Ok(read);
        }
        let g = &self.group;
        let read = StreamRead {
            stream: &g.key,
            group: &g.group,
            consumer: &g.consumer,
            cancels: &self.cancels,
            gates: &self.gates,
            max,
        }
        .call(self.conn.client())
        .await?;
        let (closed, rate) = (read.closed.as_deref(), self.rate.is_some());
        claim::report(closed, read.held, self.pause.as_ref(), rate, &g.key);
        Ok(read)
    }

    /// The native read (see [`Self::read`], `native.rs`); `None` when the script must read. A
    /// read that ran without its `WATCH` while a pause or a cancel was pending is sifted as the
    /// script would: cancelled messages acked, the rest held back for the next read.
    async fn read_native(&mut self, max: usize) -> Result<Option<StreamClaimed>> {
        let Some(w) = &self.native else {
            return Ok(None);
        };
        let Some((mut read, unsure)) = super::native::read(w, &self.conn, &self.group, max).await?
        else {
            return Ok(None);
        };
        if unsure && !matches!(read.reply, Reply::Null) {
            self.sift(std::mem::replace(&mut read.reply, Reply::Null))
                .await?;
        }
        Ok(Some(read))
    }

    /// The entries of `reply`, read while a pause or a cancel may have been pending: the
    /// cancelled ones acked, the rest held back for the first read after the resume.
    async fn sift(&mut self, reply: crate::reply::Reply) -> Result<()> {
        let claimed: Vec<Claimed> = entries(reply)
            .into_iter()
            .map(|(id, (frame, error))| (id, frame, error))
            .collect();
        let kept = self.uncancelled(claimed).await?;
        tracing::info!(stream = %self.group.key, entries = kept.len(),
            "a read that raced a reconnect and a pause or cancel: its entries wait for the next read");
        self.held_back.extend(
            kept.into_iter()
                .map(|(id, frame, error)| (id, (frame, error))),
        );
        Ok(())
    }

    /// Whether the pause key exists now (`EXISTS`); if so the pause gate closes.
    async fn paused_now(&self) -> Result<bool> {
        let Some(p) = &self.pause else {
            return Ok(false);
        };
        let n: i64 = self
            .conn
            .client()
            .exists(p.key())
            .await
            .map_err(crate::error::core)?;
        if n > 0 {
            p.closed();
        }
        Ok(n > 0)
    }

    /// The deliveries of `entries`, held (for their leases) until settled.
    fn deliver(
        &self,
        entries: impl IntoIterator<Item = (Bytes, (Frame, Option<FrameError>))>,
    ) -> Vec<Delivery<Token>> {
        let out: Vec<Delivery<Token>> = entries
            .into_iter()
            .map(|(id, (frame, error))| {
                let d = delivery(self.source.clone(), id, frame);
                match error {
                    Some(e) => unreadable(d, &e),
                    None => d,
                }
            })
            .collect();
        if let Some(r) = &self.recovery {
            r.held.hold(out.iter().map(|d| d.token.raw.clone()));
        }
        out
    }
}

impl Receive for StreamReceiver {
    fn receive<'a>(
        &'a mut self,
        max: usize,
        hurry: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Vec<Delivery<Token>>>> {
        Box::pin(async move {
            self.conn.heal().await?;
            let read = StreamReceiver::receive(self, max, hurry).await;
            self.conn.check(read)
        })
    }

    fn settler(&self) -> RedisSettler {
        self.settler.clone()
    }
    fn probe(&self) -> Option<ruststream_core::Probe> {
        Some(self.conn.probe())
    }

    fn cancel_signals(&mut self) -> Option<futures::stream::BoxStream<'static, String>> {
        self.signals.take().map(signal_ids)
    }
}

/// `<host>-<pid>-<random>`: unique per process, readable in `XINFO CONSUMERS`.
fn consumer_name() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_owned());
    let id = uuid::Uuid::now_v7().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &id[24..])
}
