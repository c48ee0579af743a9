//! Dead letters as the library writes them: each with a `reason` header and a `dead-at` header
//! (the server's ms since the epoch, set by the script that pushes it), every dead-letter list
//! trimmed to its [`DeadBound`] by that same script (`trim.lua`, a part every script that pushes
//! one needs), the trims counted in `ruststream_dead_letters_trimmed_total{queue}`
//! ([`Trims`]), and the settle of transports that have nothing to acknowledge (`push`). Sends
//! no command itself.

pub(crate) mod push;

use ruststream_core::Settlement;

use crate::transport::Token;

pub use crate::dead_bound::{DEFAULT_DEAD_LETTER_MAX_AGE, DEFAULT_DEAD_LETTER_MAX_LEN, DeadBound};
pub(crate) use push::PushDeadLetters;

/// The header a dead letter's time of death is stored under (ms since the epoch, on the
/// server's clock).
pub const DEAD_AT_HEADER: &str = "dead-at";

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
