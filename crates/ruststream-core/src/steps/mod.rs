//! Durable steps: a handler's work in named parts whose results are recorded, so a redelivery of
//! the message (a retry, a crash recovery, an operator's requeue) replays them instead of doing
//! them again ([`Context::step`](crate::Context::step)), durable sleeps that put the message
//! back delayed instead of holding a worker ([`Context::sleep`](crate::Context::sleep)), waits
//! that park the message until another process signals it
//! ([`Context::wait_for`](crate::Context::wait_for),
//! [`Publisher::signal`](crate::Publisher::signal)), and checkpoints of a long loop
//! ([`Context::checkpoint`](crate::Context::checkpoint)).
//!
//! The core keeps nothing itself: a broker stores one record per message, through a
//! [`StepStore`] (its [`PublishBackend::steps`](crate::PublishBackend::steps)). A handler reads
//! the record once, at its first step, and writes one step's result and its timing (when it
//! began, how long it took: [`timing_field`]) in one call. The settle that acknowledges or
//! dead-letters the message removes the record in the same atomic call, or keeps it a while
//! when the source says so (the Redis broker's `keep_steps`); the dispatch loop tells the
//! broker's settler which messages have one:
//! [`Settler::steps_recorded`](crate::Settler::steps_recorded).
//!
//! The promise: a step whose result was recorded never runs again for that message. A step runs
//! again only when its process died (or its record's write failed) between its effect and its
//! record; an external call made in a step passes
//! [`Context::step_key`](crate::Context::step_key) as its idempotency key to close that window.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::{ConfigError, Error, HandlerOutcome, Result};

/// How long a message's step record lives after its last write: 7 days. A retry or recovery
/// within that replays its steps; a sleep keeps the record until its end and this long after.
pub const STEPS_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most steps (sleeps included) one message may record: 1,000.
pub const MAX_STEPS: u32 = 1_000;

/// The most fields one message's record holds: 2,000, so that [`MAX_STEPS`] steps fit with
/// their timing (`t:<name>`, [`timing_field`]). A failed step's error, a wait and a signal take
/// a field each too, so a message that has them records fewer steps.
pub const MAX_STEP_FIELDS: u32 = 2 * MAX_STEPS;

/// The largest result one step may record, as JSON: 1 MiB.
pub const MAX_STEP_BYTES: usize = 1 << 20;

/// One write to a message's step record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepWrite {
    /// A step's result (JSON), kept [`STEPS_TTL`].
    Result(Bytes),
    /// A sleep of this long from the server's now: the record stores the wake-up time (ms since
    /// the epoch, on the server's clock) and lives until it, then [`STEPS_TTL`] more. Its timing
    /// (`t:<name>`) is when it began and this length.
    Sleep(Duration),
    /// A step's result or error (JSON) and how long its closure ran, kept [`STEPS_TTL`]. The
    /// same write records the step's timing in the field [`timing_field`]`(step)`: when the
    /// run began (the server's now less `took`) and `took`.
    Timed {
        /// The result or error, as JSON.
        value: Bytes,
        /// The step's name (a failure is written to `failed:<step>`, its timing to `t:<step>`).
        step: String,
        /// How long its closure ran.
        took: Duration,
    },
}

/// A message's step record as read at its handler's first step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepRecord {
    /// The server's time of the read, ms since the epoch: what a sleep's end is compared with.
    pub now_ms: u64,
    /// Each recorded step's name and value (JSON; a sleep's is its wake-up time in ms).
    pub steps: HashMap<String, Bytes>,
}

impl StepRecord {
    /// A record read at `now_ms` holding `steps`.
    pub fn new(now_ms: u64, steps: HashMap<String, Bytes>) -> Self {
        Self { now_ms, steps }
    }
}

/// Where a broker keeps step records: one per message, named by the key it was read from
/// (`source`) and its id. The Redis broker keeps each in a hash with a ttl, in the queue's slot.
pub trait StepStore: Send + Sync {
    /// The record of message `id` of `source`; empty when there is none.
    fn read_steps<'a>(&'a self, source: &'a str, id: &'a str) -> BoxFuture<'a, Result<StepRecord>>;

    /// Records step `name` of message `id` of `source`; answers the value recorded (a sleep's
    /// wake-up time, for a sleep).
    fn write_step<'a>(
        &'a self,
        source: &'a str,
        id: &'a str,
        name: &'a str,
        write: StepWrite,
    ) -> BoxFuture<'a, Result<Bytes>>;

    /// Begins message `id`'s wait for the signal `name`, atomically: the signal's payload when
    /// it was sent already, else the wait recorded with its deadline, `timeout` from the
    /// server's now. The default refuses: the store keeps no signals.
    fn begin_wait<'a>(
        &'a self,
        source: &'a str,
        id: &'a str,
        name: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Waited>> {
        let _ = (source, id, name, timeout);
        Box::pin(async { Err(unsupported()) })
    }

    /// The name of the record of message `id` of `source`, as the broker's settler removes it.
    fn steps_key(&self, source: &str, id: &str) -> String;
}

/// What beginning a wait for a signal found ([`StepStore::begin_wait`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Waited {
    /// The signal was sent already: its payload (JSON).
    Signalled(Bytes),
    /// No signal yet: the wait is recorded, until this time (ms since the epoch, on the
    /// server's clock).
    Parked(u64),
}

/// What [`Publisher::signal`](crate::Publisher::signal) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Signalled {
    /// The message was parked waiting for this signal: the payload is recorded and the
    /// message is due now, back on its queue within the mover's next move.
    Woken,
    /// The payload is recorded for the message's wait to read: the message has not reached
    /// its wait yet, is running, or is not known (a finished message, a wrong id). A record
    /// nothing reads expires with the step record's ttl.
    Kept,
    /// The message's wait for this signal timed out before it came: nothing recorded (the
    /// handler took the timeout).
    Late,
    /// A signal of this name was recorded for the message before (maybe this one, sent again
    /// after a lost reply): nothing changed, the first payload stands.
    Already,
}

/// The field of a message's step record that holds its last checkpoint's cursor
/// ([`Context::checkpoint`](crate::Context::checkpoint)).
pub const CURSOR: &str = "cursor";

/// Whether `name` is a field the record keeps for itself, not a step's.
pub(crate) fn reserved(name: &str) -> bool {
    name == CURSOR
        || ["sleep:", "wait:", "signal:", "failed:", "t:"]
            .iter()
            .any(|p| name.starts_with(p))
}

/// The field of a message's step record that holds the last error of its step `name`, for the
/// operator.
pub fn failed_field(name: &str) -> String {
    format!("failed:{name}")
}

/// The field of a message's step record that holds the timing of its step (or sleep) `name`:
/// `<began, ms since the epoch on the server's clock>,<took, ms>` (a sleep's: its length).
pub fn timing_field(name: &str) -> String {
    format!("t:{name}")
}

/// A step's timing as its field holds it ([`timing_field`]): when it began (ms since the epoch)
/// and how long it took (ms). `None` when the value is not two numbers.
pub fn parse_timing(value: &str) -> Option<(u64, u64)> {
    let (began, took) = value.split_once(',')?;
    Some((began.parse().ok()?, took.parse().ok()?))
}

/// The field of a message's step record that holds the signal `name`'s payload.
pub fn signal_field(name: &str) -> String {
    format!("signal:{name}")
}

/// The field of a message's step record that holds its wait for the signal `name` (its
/// deadline).
pub fn wait_field(name: &str) -> String {
    format!("wait:{name}")
}

/// What [`Context::wait_for`](crate::Context::wait_for) answers when its timeout passed before
/// the signal came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the wait for the signal timed out")]
pub struct WaitTimedOut;

/// The error of a broker that keeps no step records.
pub(crate) fn unsupported() -> Error {
    ConfigError::new(
        "broker",
        "this broker keeps no step records",
        "use a broker that does (RedisBroker)",
    )
    .into()
}

/// What [`Context::step`](crate::Context::step) and [`Context::sleep`](crate::Context::sleep)
/// return instead of a value. A handler ends on it with `?`: it converts to the
/// [`HandlerOutcome`] that settles the message as it should.
#[derive(Debug, thiserror::Error)]
pub enum StepError<E = std::convert::Infallible> {
    /// The step's closure failed (nothing recorded): the message is retried.
    #[error("step failed: {0}")]
    Failed(E),
    /// The record could not be read or written, or the step cannot run here (a name used twice,
    /// a source that cannot redeliver): the message is retried.
    #[error("step record: {0}")]
    Record(#[source] Error),
    /// A durable sleep began: the handler must end now (with `?`) so that the message goes back
    /// delayed for this long and frees its worker.
    #[error("sleeping for {0:?}")]
    Sleeping(Duration),
    /// A wait for a signal began: the handler must end now (with `?`) so that the message is
    /// parked until the signal comes, or for at most this long, and frees its worker.
    #[error("waiting for a signal for at most {0:?}")]
    Waiting(Duration),
}

impl<E> From<StepError<E>> for HandlerOutcome {
    fn from(e: StepError<E>) -> Self {
        match e {
            StepError::Sleeping(d) | StepError::Waiting(d) => HandlerOutcome::snooze(d),
            StepError::Failed(_) | StepError::Record(_) => HandlerOutcome::retry(),
        }
    }
}

/// What the dispatch loop and the handler's context share about one delivery's steps: whether
/// the source can redeliver (steps and sleeps need it), and whether the message has a step
/// record the settle must remove.
#[derive(Debug, Default)]
pub(crate) struct StepsMark {
    used: AtomicBool,
    /// The sleep the handler began, in ms (at least 1); 0 when none.
    sleep_ms: AtomicU64,
    /// The signal the handler parked the message for, when it did (`wait_for`).
    wait: std::sync::OnceLock<String>,
    pub(crate) redelivers: bool,
}

impl StepsMark {
    /// Notes that the message has (or may have) a step record.
    pub(crate) fn mark(&self) {
        self.used.store(true, Ordering::Relaxed);
    }

    /// Whether the message has (or may have) a step record.
    pub(crate) fn used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }

    /// Notes that the handler began a durable sleep of `d`.
    pub(crate) fn sleep(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        self.sleep_ms.store(ms, Ordering::Relaxed);
    }

    /// Notes that the handler parked the message for the signal `name`, for at most `d`.
    pub(crate) fn park(&self, name: &str, d: Duration) {
        let _ = self.wait.set(name.to_owned());
        self.sleep(d);
    }

    /// The signal the handler parked the message for, if it did.
    pub(crate) fn waiting(&self) -> Option<&str> {
        self.wait.get().map(String::as_str)
    }

    /// The durable sleep the handler began, if it did: its message goes back delayed that
    /// long, whatever error the handler ended with (the dispatch loop's rule, so that a handler
    /// whose error type turns every error into a retry still sleeps).
    pub(crate) fn sleeping(&self) -> Option<Duration> {
        match self.sleep_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }
}

impl Clone for StepsMark {
    fn clone(&self) -> Self {
        Self {
            used: AtomicBool::new(self.used()),
            sleep_ms: AtomicU64::new(self.sleep_ms.load(Ordering::Relaxed)),
            wait: self.wait.clone(),
            redelivers: self.redelivers,
        }
    }
}

impl PartialEq for StepsMark {
    /// Every mark is equal: it is the dispatch loop's note, not part of what was delivered.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for StepsMark {}

/// The settlement of a delivery whose handler began a durable sleep and then ended with
/// `decided` (anything but an ack or a drop): back after the sleep, no attempt spent, no limit.
/// `None` when it began no sleep, or acknowledged or dropped the message.
pub(crate) fn asleep(
    info: &crate::DeliveryInfo,
    decided: Option<HandlerOutcome>,
) -> Option<crate::Settlement> {
    let delay = info.steps.sleeping()?;
    match decided {
        Some(o) if o.is_ack() || o.is_drop() => None,
        _ => Some(crate::Settlement::Retry {
            delay: Some(delay),
            snooze: true,
            why: match info.steps.waiting() {
                Some(signal) => crate::Why {
                    kind: "wait",
                    reason: signal.to_owned(),
                },
                None => crate::Why {
                    kind: "sleep",
                    reason: String::new(),
                },
            },
        }),
    }
}

/// What the settle of a handled delivery must know of its steps: its record's name (which an
/// ack or a dead letter removes) and the signal it parked for (a park finding the signal
/// recorded makes the message due at once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepsNote {
    /// The step record's name.
    pub record: String,
    /// The signal the message is parked for (its record's field, `signal:<name>`).
    pub signal: Option<String>,
    /// Whether the handler began a durable sleep (not a wait): its retry later is a sleep, which
    /// the broker may count.
    pub sleeping: bool,
}

/// What the settle of a handled delivery must know of its steps, when it may have a record. It
/// may when this run used a step, and when an earlier delivery may have written one: a
/// redelivery (attempt past 1: a retry, a recovery, a requeue) or a message back from a sleep or
/// a wait. Such a run need not reach a step (it fails before its first, or it is past its last
/// attempt and dead-lettered without a handler), and its record must still go. A first delivery
/// that used no step has none, so its settle sends nothing more.
pub(crate) fn record_of(
    publisher: &crate::Publisher,
    info: &crate::DeliveryInfo,
) -> Option<StepsNote> {
    let earlier = info.steps.redelivers && (info.attempt > 1 || info.snoozes > 0);
    if !info.steps.used() && !earlier {
        return None;
    }
    let store = publisher.step_store().ok()?;
    Some(StepsNote {
        record: store.steps_key(&info.source, &info.message_id),
        signal: info.steps.waiting().map(signal_field),
        sleeping: info.steps.sleeping().is_some() && info.steps.waiting().is_none(),
    })
}

/// One handler run's view of its message's steps: the record as read at the first step, and the
/// names used so far.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    /// The record, once read.
    pub(crate) record: Option<(StepRecord, tokio::time::Instant)>,
    /// The step names this run used.
    pub(crate) seen: HashSet<String>,
    /// How many sleeps this run reached (a sleep's step name is `sleep:<n>`).
    pub(crate) sleeps: u32,
}

mod context;
mod meters;
mod patience;
mod source;

pub(crate) use self::source::check_source;
