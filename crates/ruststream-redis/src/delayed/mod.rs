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
//!   then through `back.lua` `RPUSH` (list; onto each entry's priority level, when it has
//!   levels) or `XADD` (stream, then `XTRIM` when its route bounds it), `HDEL`, `ZREM`, at most the move batch a call.
//!   Any number of readers may move at once: the script is atomic, so nothing is delivered twice
//!   and no lock is taken. The same call takes the flows of the destination's publishing set
//!   older than the flow repair's grace (`ZRANGEBYSCORE`, `ZADD XX` to now), and the mover
//!   repairs them (`crate::flow::repair`): a reader finishes a flow whose publisher stopped,
//!   each repair counted in `ruststream_flow_repairs_total{queue,outcome}`.
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

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::{Due, Result};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::back::Dest;
use crate::conn::Connections;
use crate::dead::{DeadBound, Trims};
use crate::keys::Delayed;
use crate::lua::{self, Call};
use crate::options::{Schedule, SourceOptions};

/// The shortest blocking wait: a wait for the next due entry is cut to the millisecond, the
/// clock's grain on both sides (Redis's `TIME` in ms, tokio's timer), and never 0, which a
/// blocking command takes for "for ever". A floor of 5 ms would alone make an entry due within
/// 5 ms of the last move up to 5 ms late (see `docs/decisions.md`, "The mover sleeps until the
/// next due entry").
const MIN_WAIT: Duration = Duration::from_millis(1);

/// The argument `schedule_retry` takes for a retry of message `id` due `after` from the server's
/// now: `delay_ms:id`.
pub(crate) fn retry_arg(after: Duration, id: &str) -> Value {
    Value::from(format!("{}:{id}", after.as_millis()))
}

static MOVE_DUE: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("move_due.lua")));

static SCHEDULE: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("schedule.lua")));

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

/// One call of `move_due.lua`: moves up to `most` due entries of a delayed set onto `dest`.
#[derive(Debug, Clone, PartialEq)]
pub struct MoveDue<'a> {
    /// The delayed set.
    pub set: &'a str,
    /// The delayed payload hash.
    pub payloads: &'a str,
    /// The dead-letter list, for entries that cannot be moved (`None`: they are dropped).
    pub dead: Option<&'a str>,
    /// The dead-letter list's bound.
    pub bound: DeadBound,
    /// The destination's publishing set of flows (`crate::flow`).
    pub publishing: &'a str,
    /// How long a flow may be publishing before the call takes it for repair.
    pub grace: Duration,
    /// Where the entries go.
    pub dest: &'a Dest,
    /// Most entries to move.
    pub most: u32,
}

/// What a `move_due.lua` call did, on the server's clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Moved {
    /// Entries moved.
    pub moved: i64,
    /// The server's now, in ms since the epoch.
    pub now_ms: i64,
    /// When the next entry is due, in ms since the epoch (-1: none waits).
    pub next_due_ms: i64,
    /// Entries that could not be moved and went to the dead letters.
    pub dead: i64,
    /// Dead letters the dead-letter list's bound trimmed.
    pub trimmed: u64,
    /// The records of the flows taken for repair (`crate::flow`'s repair).
    pub repair: Vec<String>,
    /// How late each moved entry was, in ms.
    pub lateness_ms: Vec<i64>,
}

impl Call for MoveDue<'_> {
    type Reply = Moved;

    fn script(&self) -> &'static Script {
        &MOVE_DUE
    }

    /// KEYS and ARGV: see `move_due.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let stand_in = self.dest.key().unwrap_or(self.set);
        let mut keys = vec![
            self.set.to_owned(),
            self.payloads.to_owned(),
            self.dead.unwrap_or(stand_in).to_owned(),
            self.publishing.to_owned(),
        ];
        let grace = i64::try_from(self.grace.as_millis()).unwrap_or(i64::MAX);
        let mut args = vec![Value::from(self.most), Value::Integer(grace.max(1))];
        self.dest.push(&mut keys, &mut args);
        args.push(if self.dead.is_some() {
            self.bound.arg()
        } else {
            Value::from_static_str("")
        });
        (keys, args)
    }

    fn parse(&self, reply: Value) -> Moved {
        let Value::Array(items) = reply else {
            return Moved {
                next_due_ms: -1,
                ..Moved::default()
            };
        };
        let at = |i: usize, or: i64| items.get(i).map_or(or, lua::reply_i64);
        Moved {
            moved: at(0, 0),
            now_ms: at(1, 0),
            next_due_ms: at(2, -1),
            dead: at(3, 0),
            trimmed: items.get(4).map_or(0, lua::reply_u64),
            repair: match items.get(5) {
                Some(Value::Array(records)) => {
                    records.iter().filter_map(|r| r.as_string()).collect()
                }
                _ => Vec::new(),
            },
            lateness_ms: items.iter().skip(6).map(lua::reply_i64).collect(),
        }
    }
}

/// Moves one subscription's due entries from its delayed set into its queue.
pub(crate) struct Mover {
    set: String,
    payloads: String,
    dead: Option<String>,
    /// The dead-letter list's bound, and what it trimmed.
    bound: DeadBound,
    trims: Trims,
    dest: Dest,
    /// The destination's key, for logs and metrics.
    queue: String,
    clock: Arc<DueClock>,
    lateness: metrics::Histogram,
    schedule: Schedule,
    /// The destination's publishing set of flows, and the broker that repairs them.
    publishing: String,
    conns: Arc<Connections>,
}

impl Mover {
    /// The mover onto `dest` whose delayed set is `delayed` and dead-letter list `dead`,
    /// subscribed to its wake-ups.
    async fn open(
        conns: &Arc<Connections>,
        delayed: &Delayed,
        dead: Option<&str>,
        bound: DeadBound,
        dest: Dest,
        schedule: Schedule,
    ) -> Result<Self> {
        let queue = dest.key().unwrap_or_default().to_owned();
        Ok(Self {
            set: delayed.set.clone(),
            payloads: delayed.payloads.clone(),
            dead: dead.map(str::to_owned),
            bound,
            trims: Trims::new(&queue, dead.unwrap_or_default()),
            dest,
            clock: Arc::new(DueClock {
                next: Mutex::new(Instant::now()),
                wake: conns.notifier(&delayed.set).await?,
            }),
            lateness: metrics::histogram!("ruststream_delivery_lateness_seconds", "queue" => queue.clone()),
            schedule,
            queue,
            publishing: delayed.publishing.clone(),
            conns: conns.clone(),
        })
    }

    /// The mover of a subscription whose broker and source both schedule (`scheduling`, on by
    /// default), on the broker's schedule overridden by the source's `options`; `None` when
    /// either turned scheduling off.
    pub(crate) async fn open_if(
        conns: &Arc<Connections>,
        options: &SourceOptions,
        delayed: &Delayed,
        dead: Option<&str>,
        dest: Dest,
    ) -> Result<Option<Self>> {
        if !(conns.settings.scheduling && options.scheduling) {
            return Ok(None);
        }
        let schedule = conns.settings.schedule.with(options);
        Self::open(conns, delayed, dead, options.dead_bound, dest, schedule)
            .await
            .map(Some)
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
                tracing::warn!(queue = %self.queue, error = %e,
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
        let m = MoveDue {
            set: &self.set,
            payloads: &self.payloads,
            dead: self.dead.as_deref(),
            bound: self.bound,
            publishing: &self.publishing,
            grace: self.conns.settings.flow_grace,
            dest: &self.dest,
            most: self.schedule.batch,
        }
        .call(client)
        .await?;
        self.trims.record(m.trimmed);
        for record in &m.repair {
            let repair = self.conns.repair_flow;
            let outcome = match repair(&self.conns, &self.publishing, record).await {
                Ok(label) => label,
                Err(e) => {
                    tracing::warn!(queue = %self.queue, record, error = %e,
                        "flow not repaired; a reader tries again after the grace");
                    "failed"
                }
            };
            metrics::counter!("ruststream_flow_repairs_total", "queue" => self.queue.clone(),
                "outcome" => outcome)
            .increment(1);
        }
        let (moved, now, due, dead) = (m.moved, m.now_ms, m.next_due_ms, m.dead);
        if dead > 0 {
            tracing::warn!(queue = %self.queue, dead, dead_letters = ?self.dead,
                "due entries that cannot be moved went to the dead-letter list (reason too-many-headers)");
        }
        for late in m.lateness_ms {
            #[allow(clippy::cast_precision_loss)]
            self.lateness.record(late as f64 / 1000.0);
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

/// One delayed message as `schedule.lua` takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Later {
    /// When it is due.
    pub due: Due,
    /// Its message id, its field in the payload hash.
    pub id: String,
    /// Its frame.
    pub frame: Bytes,
    /// Its unique key and window (`.unique_for(..)`), if it has one.
    pub unique: Option<(String, Duration)>,
}

/// One call of `schedule.lua`: schedules `entries` in a delayed set for the publish `token`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleLater<'a> {
    /// The delayed set.
    pub set: &'a str,
    /// Its payload hash.
    pub payloads: &'a str,
    /// The publish's token: a publish sent again finds its own unique windows.
    pub token: &'a str,
    /// The messages.
    pub entries: &'a [Later],
}

impl Call for ScheduleLater<'_> {
    /// How many were scheduled (ids already waiting and duplicates within a window do not
    /// count).
    type Reply = usize;

    fn script(&self) -> &'static Script {
        &SCHEDULE
    }

    /// KEYS and ARGV: see `schedule.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut keys = vec![self.set.to_owned(), self.payloads.to_owned()];
        keys.extend(
            self.entries
                .iter()
                .filter_map(|e| e.unique.as_ref().map(|(k, _)| k.clone())),
        );
        let mut args = Vec::with_capacity(1 + self.entries.len() * 5);
        args.push(Value::from(self.token));
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        for e in self.entries {
            let (kind, at) = match e.due {
                Due::In(d) => ("in", ms(d)),
                Due::At(t) => ("at", t.duration_since(std::time::UNIX_EPOCH).map_or(0, ms)),
            };
            args.extend([
                Value::from_static_str(kind),
                Value::Integer(at),
                Value::from(e.id.as_str()),
                Value::Bytes(e.frame.clone()),
                Value::Integer(
                    e.unique
                        .as_ref()
                        .map_or(0, |(_, w)| crate::unique::window_ms(*w)),
                ),
            ]);
        }
        (keys, args)
    }

    fn parse(&self, reply: Value) -> usize {
        usize::try_from(lua::reply_u64(&reply)).unwrap_or(0)
    }
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
