//! Crash recovery of a stream subscription, in its read loop, on the reader's own connection.
//!
//! - **Own pending entries first.** A consumer that starts under a name it had before (a
//!   restart with `.consumer(name)`) first takes back what its group still has pending on that
//!   name: `XPENDING key group - + n consumer`, then `XCLAIM key group consumer 0 id..`.
//! - **Sweep.** Every `min_idle / 2`, entries pending on any consumer for longer than `min_idle`
//!   are claimed: `XPENDING key group IDLE min_idle - + 128`, then
//!   `XCLAIM key group consumer min_idle id..` (which takes only those still that idle, so two
//!   sweepers never both get one).
//! - **Leases.** Every `min_idle / 3`, the entries this consumer holds (delivered and not yet
//!   settled) get their idle time reset: `XCLAIM key group consumer 0 id.. JUSTID`, which leaves
//!   their delivery count alone. So only a dead consumer's entries are ever swept. After a
//!   reconnect (or a failed renewal) the consumer renews on its reading connection before its
//!   next sweep, and sweeps nothing for a grace (`crate::rejoin`). The sweep's `XCLAIM` runs
//!   when sent or not at all (`lua::once`), none is sent on an `XPENDING` reply that came
//!   after a reconnect, and it runs in `sweep.lua`, which skips it when it reaches Redis past
//!   its deadline in the server's clock (`crate::sweep_clock`; `TIME` once, before the first).
//!
//! - **Gone consumers.** A sweep of a subscription's first reader that finds nothing stale
//!   removes the group's consumers (never its own readers') that
//!   hold nothing and were idle past a bound (`super::consumers`).
//!
//! A claimed entry's attempt is its `rs.attempt` plus the deliveries its group counted before
//! (`XPENDING`'s count), so a message that crashes its consumer every time reaches
//! `max_attempts` and goes to the dead letters like any other. `XAUTOCLAIM` was not used because
//! it does not return those counts.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::Result;
use tokio::time::Instant;

use super::entries::entry_frames;
use crate::conn::ReadConn;
use crate::error::core;
use crate::frame::{Frame, FrameError};
use crate::lua::{self, Call};
use crate::rejoin::Rejoin;
use crate::reply::{Reply, frame_bytes, frame_items, value_bytes, value_frame};
use crate::sweep_clock::SweepClock;
use fred::types::scripts::Script;

/// Most entries one sweep claims.
const SWEEP_BATCH: usize = 128;

/// Most ids one lease renewal sends in a command.
const LEASE_BATCH: usize = 1024;

/// The ids of the entries a consumer holds.
#[derive(Debug, Default)]
pub(super) struct Held(Mutex<HashSet<Bytes>>);

impl Held {
    pub(super) fn hold(&self, ids: impl IntoIterator<Item = Bytes>) {
        self.ids().extend(ids);
    }

    pub(super) fn release<'a>(&self, ids: impl IntoIterator<Item = &'a Bytes>) {
        let mut held = self.ids();
        for id in ids {
            held.remove(id);
        }
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, HashSet<Bytes>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Where a consumer's pending entries are.
pub(super) struct Group {
    pub(super) key: String,
    pub(super) group: String,
    pub(super) consumer: String,
}

/// One consumer's recovery state.
pub(super) struct Recovery {
    min_idle: Duration,
    /// How long a consumer with nothing pending may be idle before a sweep forgets it.
    forget_after: Duration,
    /// The first reader of a subscription: how many readers it has (its sweeps forget idle
    /// consumers, never these); `None` for the others, which forget none.
    readers: Option<usize>,
    /// Whether the consumer's own pending entries were all taken back.
    own_done: bool,
    next_sweep: Instant,
    pub(super) held: Arc<Held>,
    /// After a reconnect: renew before sweeping.
    pub(super) rejoin: Arc<Rejoin>,
    /// The server time each sweep must run by.
    clock: SweepClock,
}

/// An entry claimed back: its id, frame (attempt counted), and what could not be read of it.
pub(super) type Claimed = (Bytes, Frame, Option<FrameError>);

impl Recovery {
    pub(super) fn new(min_idle: Duration, block: Duration, readers: Option<usize>) -> Self {
        Self {
            min_idle,
            forget_after: super::consumers::forget_after(min_idle, block),
            readers,
            own_done: false,
            next_sweep: Instant::now(),
            held: Arc::default(),
            rejoin: Rejoin::new(renewal_period(min_idle)),
            clock: SweepClock::new(renewal_period(min_idle)),
        }
    }

    /// Entries to deliver before reading new ones: this consumer's own pending entries at
    /// start, then, when a sweep is due, entries idle longer than `min_idle` on any consumer.
    pub(super) async fn claim(
        &mut self,
        conn: &ReadConn,
        g: &Group,
        max: usize,
    ) -> Result<Vec<Claimed>> {
        let client = conn.client();
        if !self.own_done {
            let own = pending(client, g, None, max, Some(&g.consumer)).await?;
            if own.len() < max {
                self.own_done = true;
            }
            if !own.is_empty() {
                tracing::info!(consumer = %g.consumer, entries = own.len(),
                    "taking back this consumer's pending entries");
                return xclaim(client, g, own).await;
            }
        }
        self.rejoin.mark_if_back(conn);
        if self.rejoin.take()
            && let Err(e) = renew(client, g, &self.held).await
        {
            self.rejoin.mark();
            tracing::warn!(stream = %g.key, error = %crate::error::redact(e.details()),
                "pending entries not renewed after the reconnect; not sweeping until they are");
            return Ok(Vec::new());
        }
        if Instant::now() < self.next_sweep || !self.rejoin.may_sweep() {
            return Ok(Vec::new());
        }
        self.next_sweep = Instant::now() + self.min_idle / 2;
        // The deadline covers the sweep from here: an `XPENDING` reply that came late is no
        // ground to claim on either.
        let by = self.clock.deadline(client).await?;
        let stale = pending(client, g, Some(self.min_idle), max.min(SWEEP_BATCH), None).await?;
        if stale.is_empty() {
            if let Some(readers) = self.readers {
                forget_consumers(client, g, readers, self.forget_after).await;
            }
            return Ok(Vec::new());
        }
        // fred sends a read again after a reconnect: the ids are then no ground to claim on
        // before the leases are renewed.
        if self.rejoin.mark_if_back(conn) {
            return Ok(Vec::new());
        }
        let sweep = Sweep {
            g,
            min_idle: self.min_idle,
            by,
            entries: stale,
            once: conn.sweeps_once(),
        };
        let (ran, claimed) = sweep.call(client).await?;
        self.clock.ran(ran, Some(by), Some(&self.rejoin), &g.key);
        if !claimed.is_empty() {
            metrics::counter!("ruststream_recovered_total", "queue" => g.key.clone())
                .increment(claimed.len() as u64);
            tracing::warn!(stream = %g.key, group = %g.group, recovered = claimed.len(),
                "entries pending longer than min_idle were claimed from their consumers");
        }
        // A full batch: more may be waiting; sweep again on the next read.
        if claimed.len() >= SWEEP_BATCH {
            self.next_sweep = Instant::now();
        }
        Ok(claimed)
    }

    /// Renews the leases of the entries this consumer holds every `min_idle / 3`, until the
    /// reader and its settler are gone.
    pub(super) fn spawn_renewal(&self, pool: Pool, g: Group) {
        let held: Weak<Held> = Arc::downgrade(&self.held);
        let every = renewal_period(self.min_idle);
        let rejoin = self.rejoin.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(h) = held.upgrade() else { break };
                if let Err(e) = renew(pool.next(), &g, &h).await {
                    rejoin.mark();
                    tracing::warn!(stream = %g.key, error = %crate::error::redact(e.details()),
                        "pending entries not renewed; another consumer may claim them if this goes on past min_idle");
                }
            }
        });
    }
}

/// Forgets the group's consumers that hold nothing and were idle longer than `idle` (see
/// `super::consumers`); a failure is logged, the next sweep tries again.
async fn forget_consumers(client: &Client, g: &Group, readers: usize, idle: Duration) {
    let call = super::consumers::ForgetConsumers {
        stream: &g.key,
        group: &g.group,
        consumer: &g.consumer,
        readers,
        idle,
        most: super::consumers::FORGET_BATCH,
    };
    match call.call(client).await {
        Ok(0) => {}
        Ok(n) => tracing::debug!(stream = %g.key, group = %g.group, forgotten = n,
            "consumers with nothing pending, idle past the bound, removed from the group"),
        Err(e) => tracing::debug!(stream = %g.key, error = %e, "idle consumers not removed"),
    }
}

/// How often leases are renewed: `min_idle / 3`.
fn renewal_period(min_idle: Duration) -> Duration {
    (min_idle / 3).max(Duration::from_millis(10))
}

/// Resets the idle time of every entry `held` holds: `XCLAIM key group consumer 0 id.. JUSTID`.
async fn renew(client: &Client, g: &Group, held: &Held) -> Result<(), fred::error::Error> {
    let ids: Vec<Bytes> = held.ids().iter().cloned().collect();
    for chunk in ids.chunks(LEASE_BATCH) {
        let mut args: Vec<Value> = vec![
            g.key.as_str().into(),
            g.group.as_str().into(),
            g.consumer.as_str().into(),
            "0".into(),
        ];
        args.extend(chunk.iter().cloned().map(Value::Bytes));
        args.push("JUSTID".into());
        let _ids: Value = client.custom(fred::cmd!("XCLAIM"), args).await?;
    }
    Ok(())
}

/// `(id, deliveries so far)` of up to `count` pending entries of the group: idle at least
/// `idle`, of `consumer` only when given.
async fn pending(
    client: &Client,
    g: &Group,
    idle: Option<Duration>,
    count: usize,
    consumer: Option<&str>,
) -> Result<Vec<(Bytes, u64)>> {
    let mut args: Vec<Value> = vec![g.key.as_str().into(), g.group.as_str().into()];
    if let Some(idle) = idle {
        args.extend(["IDLE".into(), millis(idle).into()]);
    }
    args.extend([
        "-".into(),
        "+".into(),
        Value::Integer(i64::try_from(count).unwrap_or(i64::MAX)),
    ]);
    args.extend(consumer.map(Value::from));
    let reply: Value = client
        .custom(fred::cmd!("XPENDING"), args)
        .await
        .map_err(core)?;
    let Value::Array(rows) = reply else {
        return Ok(Vec::new());
    };
    Ok(rows
        .into_iter()
        .filter_map(|row| {
            let Value::Array(mut row) = row else {
                return None;
            };
            let count = row.get(3).and_then(Value::as_u64).unwrap_or(1);
            let id = value_bytes(row.swap_remove(0))?;
            Some((id, count))
        })
        .collect())
}

/// Claims this consumer's own pending `entries` (`(id, deliveries so far)`) back:
/// `XCLAIM key group consumer 0 id..`.
async fn xclaim(client: &Client, g: &Group, entries: Vec<(Bytes, u64)>) -> Result<Vec<Claimed>> {
    let mut args: Vec<Value> = vec![
        g.key.as_str().into(),
        g.group.as_str().into(),
        g.consumer.as_str().into(),
        "0".into(),
    ];
    args.extend(entries.iter().map(|(id, _)| Value::Bytes(id.clone())));
    let reply: Value = client
        .custom(fred::cmd!("XCLAIM"), args)
        .await
        .map_err(core)?;
    Ok(counted(value_frame(reply), &entries))
}

/// The entries of an `XCLAIM` reply, each one's attempt counting the deliveries before this one
/// (`entries`' counts, `(id, deliveries so far)`).
fn counted(reply: Reply, entries: &[(Bytes, u64)]) -> Vec<Claimed> {
    let counts: std::collections::HashMap<&Bytes, u64> =
        entries.iter().map(|(id, n)| (id, *n)).collect();
    entry_frames(reply)
        .into_iter()
        .map(|(id, (mut frame, error))| {
            let before = counts.get(&id).copied().unwrap_or(1);
            let before = u32::try_from(before).unwrap_or(u32::MAX);
            frame.attempt = frame.attempt.saturating_add(before);
            (id, frame, error)
        })
        .collect()
}

static SWEEP: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("sweep.lua")));

/// One sweep's claim (`sweep.lua`): `XCLAIM key group consumer min_idle id..` of the stale
/// `entries` (`(id, deliveries so far)`), unless the server's time is past `by`.
struct Sweep<'a> {
    g: &'a Group,
    min_idle: Duration,
    /// The server time (ms) past which it claims nothing.
    by: u64,
    entries: Vec<(Bytes, u64)>,
    /// Whether it runs when sent or not at all (`lua::once`): on a real connection.
    once: bool,
}

impl Call for Sweep<'_> {
    /// The server time (ms) it ran at, and what it claimed.
    type Reply = (u64, Vec<Claimed>);

    fn script(&self) -> &'static Script {
        &SWEEP
    }

    /// KEYS and ARGV: see `sweep.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut args: Vec<Value> = vec![
            self.g.group.as_str().into(),
            self.g.consumer.as_str().into(),
            millis(self.min_idle).into(),
            self.by.to_string().into(),
        ];
        args.extend(self.entries.iter().map(|(id, _)| Value::Bytes(id.clone())));
        (vec![self.g.key.clone()], args)
    }

    fn parse(&self, reply: Value) -> (u64, Vec<Claimed>) {
        self.read(value_frame(reply))
    }

    // The trait's `call` with fred's options and the reply read as a frame; an `async fn` here
    // cannot name the trait's lifetimes (its future must be `Send` for every `&self`).
    #[expect(clippy::manual_async_fn, reason = "see the comment above")]
    fn call(
        &self,
        client: &Client,
    ) -> impl std::future::Future<Output = Result<Self::Reply>> + Send {
        async move { Ok(self.read(lua::call_frame(self, client, self.once).await?)) }
    }
}

impl Sweep<'_> {
    /// Reads the reply `server time ms, XCLAIM reply`.
    fn read(&self, reply: Reply) -> (u64, Vec<Claimed>) {
        let mut items = frame_items(reply).unwrap_or_default().into_iter();
        let ran = items
            .next()
            .and_then(frame_bytes)
            .and_then(|b| std::str::from_utf8(&b).ok()?.parse().ok())
            .unwrap_or(0);
        (
            ran,
            items
                .next()
                .map_or_else(Vec::new, |r| counted(r, &self.entries)),
        )
    }
}

fn millis(d: Duration) -> String {
    d.as_millis().to_string()
}
