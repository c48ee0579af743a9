//! Delayed delivery: delayed publishes and retries wait in a destination's delayed set
//! (`K.delayed`, message id → due ms, and `K.delayed.payloads`, id → frame) until a reader's
//! [`Mover`] moves them to `K` when due.
//!
//! Scripts (each a `.lua` file beside this one):
//! - `schedule.lua` (the publisher's `.delay(..)`/`.at(..)`): `HSETNX` + `ZADD` (and the unique
//!   window's `SET NX PX` of `.unique_for(..)`), so an id already
//!   waiting keeps its first schedule; a new earliest entry `PUBLISH`es on the delayed set's name
//!   to wake the readers of the destination.
//! - `move_due.lua` (before each read, unless scheduling is off): `ZRANGEBYSCORE`, `HMGET`,
//!   `RPUSH` (list; onto each entry's priority level, when it has levels) or `XADD` (stream,
//!   then `XTRIM` when its route bounds it), `HDEL`, `ZREM`, at most the move batch a call.
//!   Any number of readers may move at once: the script is atomic, so nothing is delivered twice
//!   and no lock is taken.
//! - `schedule_retry.lua`: the part of the settle scripts that schedules a retry (`ZADD`, `HSET`).
//!
//! A reader never waits past the next due entry: the mover keeps that time ([`DueClock`]), the
//! settle of a delayed retry moves it earlier, and a wake-up `PUBLISH` sets it to now. When no
//! wake-up comes (a lost `PUBLISH`), an idle reader still looks every schedule interval.
//!
//! The two knobs ([`Schedule`]), set broker-wide on `RedisBroker` and per subscription (which
//! wins), trade lateness against Redis load:
//! - the *schedule interval* ([`DEFAULT_SCHEDULE_INTERVAL`], 5 s) bounds how late an entry is moved when no wake-up
//!   comes for it (a `PUBLISH` lost with a dropped connection, an entry written by another
//!   tool); shorter means less lateness then, and more `move_due.lua` calls from idle readers
//!   (one per interval per reader);
//! - the *move batch* ([`DEFAULT_MOVE_BATCH`], 128; at most [`MAX_MOVE_BATCH`], 1,000) is how many due entries one call moves:
//!   larger means fewer round trips when many are due at once, and longer scripts, during which
//!   Redis serves no other client.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::Result;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::conn::Connections;
use crate::error::core;
use crate::keys::Delayed;
use crate::lua;
use crate::options::{Schedule, SourceOptions};
use crate::policy::StreamPublish;

/// The shortest blocking wait sent to Redis.
const MIN_WAIT: Duration = Duration::from_millis(5);

/// The Lua of the settle scripts that schedules a retry (`schedule_retry(zset, hash, arg, frame)`).
pub(crate) const SCHEDULE_RETRY: &str = include_str!("schedule_retry.lua");

/// The argument `schedule_retry` takes for a retry of message `id` due `after` from the server's
/// now: `delay_ms:id`.
pub(crate) fn retry_arg(after: Duration, id: &str) -> Value {
    Value::from(format!("{}:{id}", after.as_millis()))
}

static MOVE_DUE: LazyLock<Script> = LazyLock::new(|| {
    lua::script(
        include_str!("move_due.lua"),
        &[lua::GUARD, crate::frame::LUA, lua::BOUND, lua::LEVELS],
    )
});

static SCHEDULE: LazyLock<Script> = LazyLock::new(|| {
    lua::script(
        include_str!("schedule.lua"),
        &[lua::GUARD, crate::unique::LUA],
    )
});

/// When the next due entry of a delayed set may be, shared by a subscription's reader (which
/// waits for it) and its settler (which schedules retries into it).
#[derive(Debug)]
pub(crate) struct DueClock {
    next: Mutex<Instant>,
    /// Woken when an entry becomes due earlier than the reader is waiting for.
    wake: Arc<Notify>,
}

impl DueClock {
    /// A retry was scheduled `after` from now: wake the reader if that is before its wait ends.
    pub(crate) fn retry_in(&self, after: Duration) {
        let at = Instant::now() + after;
        let mut next = lock(&self.next);
        if at < *next {
            *next = at;
            self.wake.notify_one();
        }
    }

    fn get(&self) -> Instant {
        *lock(&self.next)
    }
}

/// What a destination's delayed entries move into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Destination {
    List,
    /// A stream, trimmed after the move as its publish policy says.
    Stream(StreamPublish),
}

/// Moves one subscription's due entries from its delayed set into its queue.
pub(crate) struct Mover {
    /// Delayed set, payload hash, destination: `move_due.lua`'s KEYS.
    keys: Vec<String>,
    dest: Destination,
    clock: Arc<DueClock>,
    lateness: metrics::Histogram,
    schedule: Schedule,
}

impl Mover {
    /// The mover of the full key `queue` whose delayed set is `delayed` and dead-letter list
    /// `dead`, subscribed to its wake-ups.
    async fn open(
        conns: &Connections,
        queue: &str,
        delayed: &Delayed,
        dead: Option<&str>,
        dest: Destination,
        schedule: Schedule,
    ) -> Result<Self> {
        Ok(Self {
            keys: vec![
                delayed.set.clone(),
                delayed.payloads.clone(),
                queue.to_owned(),
                // Without a dead-letter list the destination stands in; nothing is pushed there.
                dead.unwrap_or(queue).to_owned(),
            ],
            dest,
            clock: Arc::new(DueClock {
                next: Mutex::new(Instant::now()),
                wake: conns.notifier(&delayed.set).await?,
            }),
            lateness: metrics::histogram!("ruststream_delivery_lateness_seconds", "queue" => queue.to_owned()),
            schedule,
        })
    }

    /// The mover of a subscription whose broker and source both schedule (`scheduling`, on by
    /// default), on the broker's schedule overridden by the source's `options`; `None` when
    /// either turned scheduling off.
    pub(crate) async fn open_if(
        conns: &Connections,
        options: &SourceOptions,
        queue: &str,
        delayed: &Delayed,
        dead: Option<&str>,
        dest: Destination,
    ) -> Result<Option<Self>> {
        if !(conns.settings.scheduling && options.scheduling) {
            return Ok(None);
        }
        let schedule = conns.settings.schedule.with(options);
        Self::open(conns, queue, delayed, dead, dest, schedule)
            .await
            .map(Some)
    }

    /// Moves due entries of a list with priority levels onto each one's level: `levels` are
    /// the full keys of levels 1 … n-1.
    pub(crate) fn with_levels(mut self, levels: &[String]) -> Self {
        self.keys.extend_from_slice(levels);
        self
    }

    /// The clock a settler moves earlier when it schedules a retry.
    pub(crate) fn clock(&self) -> Arc<DueClock> {
        self.clock.clone()
    }

    /// Resolves when a wake-up says an entry is due (then it is due now).
    pub(crate) async fn woken(&self) {
        self.clock.wake.notified().await;
        *lock(&self.clock.next) = Instant::now();
    }

    /// Moves due entries to the destination when one may be due. A failure is logged and
    /// tried again after the schedule interval: it never stops the subscription from reading what is
    /// already in its queue.
    pub(crate) async fn move_due(&self, client: &Client) {
        if self.clock.get() > Instant::now() {
            return;
        }
        let next = match self.move_batch(client).await {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(queue = %self.keys[2], error = %e,
                    "delayed entries not moved; trying again later");
                Instant::now() + self.schedule.interval
            }
        };
        let mut next_due = lock(&self.clock.next);
        // A retry scheduled by the settler meanwhile may be earlier.
        if next < *next_due || *next_due <= Instant::now() {
            *next_due = next;
        }
    }

    /// One `move_due.lua` call; returns when the next entry may be due.
    async fn move_batch(&self, client: &Client) -> Result<Instant> {
        let (dest, bound) = match self.dest {
            Destination::List => ("list", String::new()),
            Destination::Stream(p) => ("stream", p.script_arg()),
        };
        let r: Vec<i64> = MOVE_DUE
            .evalsha_with_reload(
                client,
                self.keys.clone(),
                vec![
                    Value::from(self.schedule.batch),
                    Value::from_static_str(dest),
                    Value::from(bound),
                ],
            )
            .await
            .map_err(core)?;
        let at = |i: usize, or: i64| r.get(i).copied().unwrap_or(or);
        let (moved, now, due, dead) = (at(0, 0), at(1, 0), at(2, -1), at(3, 0));
        if dead > 0 {
            tracing::warn!(queue = %self.keys[2], dead, dead_letters = %self.keys[3],
                "due entries that cannot be moved went to the dead-letter list (reason too-many-headers)");
        }
        for late in r.iter().skip(4) {
            #[allow(clippy::cast_precision_loss)]
            self.lateness.record(*late as f64 / 1000.0);
        }
        let poll = self.schedule.interval;
        Ok(if moved + dead >= i64::from(self.schedule.batch) {
            Instant::now()
        } else if due >= 0 {
            let wait = Duration::from_millis(u64::try_from(due - now).unwrap_or(0));
            Instant::now() + wait.min(poll)
        } else {
            Instant::now() + poll
        })
    }
}

/// Schedules entries in the delayed set `delayed` with `schedule.lua` for the publish `token`;
/// `groups` are its groups of five (`in`|`at`, ms, id, frame, unique window ms or 0), `unique`
/// the unique keys of those with a window, in order. Returns how many were scheduled.
pub(crate) async fn schedule(
    client: &Client,
    delayed: &Delayed,
    token: &str,
    groups: Vec<Value>,
    unique: Vec<String>,
) -> Result<usize> {
    let mut keys = Vec::with_capacity(unique.len() + 2);
    keys.extend([delayed.set.clone(), delayed.payloads.clone()]);
    keys.extend(unique);
    let mut args = Vec::with_capacity(groups.len() + 1);
    args.push(Value::from(token));
    args.extend(groups);
    let added: i64 = SCHEDULE
        .evalsha_with_reload(client, keys, args)
        .await
        .map_err(core)?;
    Ok(usize::try_from(added).unwrap_or(0))
}

/// How long a blocking read may wait: `block`, cut short by the next due entry of `mover`.
pub(crate) fn read_wait(mover: Option<&Mover>, block: Duration) -> Duration {
    let until_due = mover.map_or(block, |m| {
        m.clock.get().saturating_duration_since(Instant::now())
    });
    block.min(until_due).max(MIN_WAIT)
}

/// Resolves when a reader's blocking read should end early: on `stop`, on `hurry`, or when
/// `mover` is woken.
pub(crate) async fn interrupted(
    stop: &tokio_util::sync::CancellationToken,
    hurry: &tokio_util::sync::CancellationToken,
    mover: Option<&Mover>,
) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = hurry.cancelled() => {}
        () = woken(mover) => {}
    }
}

/// Resolves when `mover` is woken; never without one.
pub(crate) async fn woken(mover: Option<&Mover>) {
    match mover {
        Some(m) => m.woken().await,
        None => std::future::pending().await,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
