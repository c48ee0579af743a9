//! The options every Redis subscription has, whatever its transport, and their setters: one
//! [`SourceOptions`] that [`RedisList`](crate::RedisList), [`RedisStream`](crate::RedisStream)
//! and [`RedisChannel`](crate::RedisChannel) each hold, and one macro that writes the setters on
//! each of them (inherent methods, so no trait needs importing). Sends no command.

use std::time::Duration;

use ruststream_core::{ConfigError, Result, SubscribeOptions};

use crate::dead_bound::DeadBound;
pub(crate) use crate::defaults::Schedule;
pub use crate::defaults::{
    DEFAULT_FLOW_REPAIR_GRACE, DEFAULT_MIN_IDLE, DEFAULT_MOVE_BATCH, DEFAULT_RESULT_TTL,
    DEFAULT_SCHEDULE_INTERVAL,
};
use crate::keys::DeadLetter;

/// What every subscription can set.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SourceOptions {
    pub(crate) dead_letter: DeadLetter,
    /// The dead-letter list's bound.
    pub(crate) dead_bound: DeadBound,
    /// How long one blocking read waits.
    pub(crate) block: Duration,
    /// Whether the subscription moves due entries of its delayed set.
    pub(crate) scheduling: bool,
    /// The mover's interval, when the source sets its own (else the broker's).
    pub(crate) schedule_interval: Option<Duration>,
    /// The mover's batch, when the source sets its own (else the broker's).
    pub(crate) move_batch: Option<u32>,
    /// How long an ack or a dead letter keeps its message's step record (`keep_steps`);
    /// `None` (the default): it deletes it.
    pub(crate) keep_steps: Option<Duration>,
    /// Concurrency, attempts, backoff: what the core's dispatch loop reads.
    pub(crate) core: SubscribeOptions,
}

impl Default for SourceOptions {
    fn default() -> Self {
        Self {
            dead_letter: DeadLetter::Default,
            dead_bound: DeadBound::default(),
            block: Duration::from_secs(5),
            scheduling: true,
            schedule_interval: None,
            move_batch: None,
            keep_steps: None,
            core: SubscribeOptions::default(),
        }
    }
}

impl SourceOptions {
    /// Checks what every transport needs; `key` names the subscription.
    pub(crate) fn validate(&self, key: &str) -> Result<()> {
        if self.core.concurrency == 0 {
            return Err(ConfigError::new(
                "concurrency",
                "must be at least 1",
                "set it to 1 or more, how many messages are handled at once",
            )
            .on(key)
            .into());
        }
        if self.core.max_attempts == 0 {
            return Err(ConfigError::new(
                "max_attempts",
                "must be at least 1",
                "set it to 1 or more (1 handles each message once, without retries)",
            )
            .on(key)
            .into());
        }
        if self.core.timeout.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::new(
                "timeout",
                "must be longer than zero (every handler would be stopped at once)",
                "give the longest a handler may run, e.g. `.timeout(Duration::from_secs(30))`, \
                 or leave it unset for no limit",
            )
            .on(key)
            .into());
        }
        if self.core.max_payload_bytes == Some(0) {
            return Err(ConfigError::new(
                "max_payload_bytes",
                "must be at least 1 (0 would dead-letter every message)",
                "give the largest payload a handler should read, e.g. `.max_payload_bytes(1 << 20)`, \
                 or leave it unset for no limit",
            )
            .on(key)
            .into());
        }
        if self.block.is_zero() {
            return Err(ConfigError::new(
                "block",
                "must be longer than zero (it would block forever)",
                "give how long a read waits for messages, e.g. `.block(Duration::from_secs(5))`",
            )
            .on(key)
            .into());
        }
        if self.keep_steps.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::new(
                "keep_steps",
                "must be longer than zero (the record would be gone at once)",
                "give how long an operator may inspect or requeue a finished message, \
                 e.g. `.keep_steps(Duration::from_secs(24 * 3600))`, or leave it unset",
            )
            .on(key)
            .into());
        }
        self.dead_bound.validate(key)?;
        validate_schedule(Some(key), self.schedule_interval, self.move_batch)
    }
}

/// The largest move batch: `move_due.lua` moves at most this many a call whatever it is asked.
pub const MAX_MOVE_BATCH: u32 = 1000;

/// Refuses a zero interval and a batch outside 1..=[`MAX_MOVE_BATCH`]; `subscription` names
/// whose setting it is, `None` for the broker's own.
pub(crate) fn validate_schedule(
    subscription: Option<&str>,
    interval: Option<Duration>,
    batch: Option<u32>,
) -> Result<()> {
    let refuse = |option: &str, problem: String, fix: &'static str| -> Result<()> {
        let e = match subscription {
            Some(key) => ConfigError::new(option.to_owned(), problem, fix).on(key),
            None => ConfigError::new(format!("RedisBroker::{option}"), problem, fix),
        };
        Err(e.into())
    };
    if interval.is_some_and(|d| d.is_zero()) {
        return refuse(
            "schedule_interval",
            "must be longer than zero (idle readers would call Redis without pause)".to_owned(),
            "a few seconds suits most services, e.g. `.schedule_interval(Duration::from_secs(1))`, \
             or `.scheduling(false)` to leave moving to other nodes",
        );
    }
    match batch {
        Some(n) if n == 0 || n > MAX_MOVE_BATCH => refuse(
            "move_batch",
            format!("must be between 1 and {MAX_MOVE_BATCH} (it is {n})"),
            "the default is 128, e.g. `.move_batch(128)`",
        ),
        _ => Ok(()),
    }
}

impl Schedule {
    /// The broker's schedule with what `options` set of its own.
    pub(crate) fn with(self, options: &SourceOptions) -> Self {
        Self {
            interval: options.schedule_interval.unwrap_or(self.interval),
            batch: options.move_batch.unwrap_or(self.batch),
        }
    }
}

/// Writes the setters of [`SourceOptions`] on a source type with a field `options`:
/// `base` for every transport, `queue` for those that redeliver (lists, streams), with those of
/// their [`QueueOptions`](crate::queue_options::QueueOptions) (a field `queue`).
macro_rules! source_setters {
    (base: $ty:ty) => {
        impl $ty {
            /// Names the dead-letter list (default `<key>.dead`): dropped, undecodable and
            /// exhausted messages land there with a `reason` header.
            pub fn dead_letter(mut self, key: impl Into<String>) -> Self {
                self.options.dead_letter = $crate::keys::DeadLetter::Named(key.into());
                self
            }

            /// Most dead letters the dead-letter list keeps (default 10,000): the script that
            /// pushes one trims the oldest past it. 0 is refused at startup; for a larger bound
            /// give a larger number.
            pub fn dead_letter_max_len(mut self, n: u64) -> Self {
                self.options.dead_bound.max_len = n;
                self
            }

            /// How long a dead letter is kept (default 30 days): the script that pushes one
            /// also removes a few of those that died longer ago (oldest first). Zero is refused
            /// at startup; for a longer age give a longer duration.
            pub fn dead_letter_max_age(mut self, age: ::std::time::Duration) -> Self {
                self.options.dead_bound.max_age = age;
                self
            }

            /// No dead-letter list: such messages are discarded, with an error log.
            pub fn no_dead_letter(mut self) -> Self {
                self.options.dead_letter = $crate::keys::DeadLetter::Off;
                self
            }

            /// How long one blocking read waits before the reader looks around (default 5 s).
            pub fn block(mut self, timeout: ::std::time::Duration) -> Self {
                self.options.block = timeout;
                self
            }

            /// Most handlers running at once (default 128); claims never run ahead of them.
            pub fn concurrency(mut self, n: usize) -> Self {
                self.options.core.concurrency = n;
                self
            }

            /// How long one handler call may run (default: no limit). Past it the call is
            /// stopped (its future dropped, which releases its permit and ends its lease) and
            /// the message is settled as a retry, after the subscription's backoff; once its
            /// attempts are spent, it goes to the dead-letter list with reason `timeout`. The
            /// handler reads its deadline with `ctx.deadline()`. Zero is refused at startup.
            pub fn timeout(mut self, timeout: ::std::time::Duration) -> Self {
                self.options.core.timeout = Some(timeout);
                self
            }

            /// The largest payload, in bytes, the handler is given (default: no limit). A
            /// larger one goes to the dead-letter list with reason `too-large`, without being
            /// decoded. 0 is refused at startup.
            pub fn max_payload_bytes(mut self, n: usize) -> Self {
                self.options.core.max_payload_bytes = Some(n);
                self
            }
        }
    };
    (queue: $ty:ty) => {
        $crate::options::source_setters!(base: $ty);
        $crate::queue_options::queue_setters!($ty);

        impl $ty {
            /// Deliveries a message gets before it goes to the dead-letter list (default 10).
            pub fn max_attempts(mut self, n: u32) -> Self {
                self.options.core.max_attempts = n;
                self
            }

            /// Most snoozes (`HandlerOutcome::snooze`) a message gets (default 25): the one
            /// after goes to the dead-letter list with reason `snoozed-too-often`. A snooze
            /// spends no attempt, so this bounds how long a message can be put off.
            pub fn max_snoozes(mut self, n: u32) -> Self {
                self.options.core.max_snoozes = n;
                self
            }

            /// Delay before each retry (default: exponential from 1 s, capped at 1024 s, ±20 %).
            pub fn retry(mut self, backoff: ::ruststream_core::Backoff) -> Self {
                self.options.core.retry = backoff;
                self
            }

            /// How long a handler has to finish once its message is cancelled
            /// (`publisher.cancel(..)`: `ctx.cancelled()` resolves) before its future is
            /// dropped and the message settles as cancelled (default 5 s).
            pub fn cancel_grace(mut self, grace: ::std::time::Duration) -> Self {
                self.options.core.cancel_grace = grace;
                self
            }

            /// Whether this subscription moves due entries of its delayed set (default on).
            /// Off makes the node a pure handler: other nodes move them.
            pub fn scheduling(mut self, on: bool) -> Self {
                self.options.scheduling = on;
                self
            }

            /// How often this subscription's idle reader looks for due delayed entries when no
            /// wake-up came (overrides the broker's
            /// [`schedule_interval`](crate::RedisBroker::schedule_interval); default 5 s).
            /// It bounds how late an entry is moved when its wake-up `PUBLISH` was lost: shorter
            /// means less lateness then and more idle calls to Redis (one per interval per
            /// reader). Zero is refused at startup.
            pub fn schedule_interval(mut self, interval: ::std::time::Duration) -> Self {
                self.options.schedule_interval = Some(interval);
                self
            }

            /// Most due delayed entries one mover call moves (overrides the broker's
            /// [`move_batch`](crate::RedisBroker::move_batch); default 128, 1 to 1,000).
            /// Larger means fewer round trips when many are due at once, and longer scripts,
            /// during which Redis serves no other client.
            pub fn move_batch(mut self, n: u32) -> Self {
                self.options.move_batch = Some(n);
                self
            }

            /// Keeps a finished message's step record (`ctx.step`) for `keep` after its ack or
            /// its dead letter, instead of deleting it (the default). An operator then sees
            /// the steps of a finished message (`job show`, the dashboard), and a dead letter
            /// requeued within `keep` replays its recorded steps instead of running them again.
            /// Zero is refused at startup.
            pub fn keep_steps(mut self, keep: ::std::time::Duration) -> Self {
                self.options.keep_steps = Some(keep);
                self
            }
        }
    };
}

pub(crate) use source_setters;
