//! Dead letters as the library writes them: each with a `reason` header and a `dead-at` header
//! (the server's ms since the epoch, set by the script that pushes it), every dead-letter list
//! trimmed to its [`DeadBound`] by that same script (`trim.lua`, a part every script that pushes
//! one needs), the trims counted in `ruststream_dead_letters_trimmed_total{queue}`
//! ([`Trims`]), and the settle of transports that have nothing to acknowledge (`push`). Sends
//! no command itself.

pub(crate) mod push;

use std::time::Duration;

use fred::prelude::*;
use ruststream_core::{Error, Result, Settlement};

use crate::transport::Token;

pub(crate) use push::PushDeadLetters;

/// The header a dead letter's time of death is stored under (ms since the epoch, on the
/// server's clock).
pub const DEAD_AT_HEADER: &str = "dead-at";

/// Most dead letters a dead-letter list keeps, unless `.dead_letter_max_len(..)` says otherwise.
pub const DEFAULT_DEAD_LETTER_MAX_LEN: u64 = 10_000;

/// How long a dead letter is kept, unless `.dead_letter_max_age(..)` says otherwise: 30 days.
pub const DEFAULT_DEAD_LETTER_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// A dead-letter list's bound: the script that pushes a dead letter then trims the oldest past
/// `max_len` (exactly) and those that died more than `max_age` ago (a few a call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadBound {
    /// Most dead letters kept.
    pub max_len: u64,
    /// How long one is kept.
    pub max_age: Duration,
}

impl Default for DeadBound {
    /// [`DEFAULT_DEAD_LETTER_MAX_LEN`], [`DEFAULT_DEAD_LETTER_MAX_AGE`].
    fn default() -> Self {
        Self {
            max_len: DEFAULT_DEAD_LETTER_MAX_LEN,
            max_age: DEFAULT_DEAD_LETTER_MAX_AGE,
        }
    }
}

impl DeadBound {
    /// The bound as `trim.lua` takes it: `<max_len>:<max_age_ms>`.
    pub(crate) fn arg(&self) -> Value {
        Value::from(format!("{}:{}", self.max_len, self.max_age.as_millis()))
    }

    /// Refuses a zero bound; `what` names the subscription (`list \`jobs\``).
    pub(crate) fn validate(&self, what: &str) -> Result<()> {
        if self.max_len == 0 {
            return Err(Error::config(format!(
                "{what}: dead_letter_max_len must be at least 1 (0 would keep no dead letter); \
                 the default is 10,000; for a larger bound give it, e.g. `.dead_letter_max_len(1_000_000)`, \
                 or `.no_dead_letter()` to keep none"
            )));
        }
        if self.max_age.as_millis() == 0 {
            return Err(Error::config(format!(
                "{what}: dead_letter_max_age must be at least 1 ms (zero would drop every dead letter at once); \
                 the default is 30 days; for a longer one give it, e.g. \
                 `.dead_letter_max_age(Duration::from_secs(365 * 24 * 3600))`"
            )));
        }
        Ok(())
    }
}

/// `ruststream_dead_letters_trimmed_total{queue}` of one dead-letter list: how many its bound
/// removed; each trim also logged at debug.
#[derive(Debug, Clone)]
pub(crate) struct Trims {
    counter: metrics::Counter,
    dead: String,
}

impl Trims {
    /// The counter of the dead-letter list `dead` of the queue (or channel) `queue`.
    pub(crate) fn new(queue: &str, dead: &str) -> Self {
        Self {
            counter: metrics::counter!("ruststream_dead_letters_trimmed_total", "queue" => queue.to_owned()),
            dead: dead.to_owned(),
        }
    }

    /// Counts `n` dead letters a script trimmed.
    pub(crate) fn record(&self, n: u64) {
        if n > 0 {
            self.counter.increment(n);
            tracing::debug!(dead_letter = %self.dead, trimmed = n,
                "oldest dead letters trimmed to the list's bound");
        }
    }
}

/// Logs each dead letter of `batch`, once its settle pushed it onto `dead` (the full key).
pub(crate) fn logged(batch: &[(Token, Settlement)], dead: &str) {
    for (t, s) in batch {
        if let Settlement::Dead { reason } = s {
            tracing::warn!(message_id = %t.frame.id, attempt = t.frame.attempt, reason = %reason,
                dead_letter = %dead, "message dead-lettered");
        }
    }
}

/// Logs a dead letter that a subscription without a dead-letter list discards.
pub(crate) fn discarded(t: &Token, reason: &str) {
    tracing::warn!(message_id = %t.frame.id, attempt = t.frame.attempt, reason,
        "no dead-letter list (no_dead_letter): the message is discarded");
}
