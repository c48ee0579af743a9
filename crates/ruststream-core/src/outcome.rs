//! What a handler decides about the message it was given, and how that becomes a settlement.

use std::time::Duration;

/// A handler's verdict on one message.
///
/// A hand-written [`Handle`](crate::Handle) returns `Ok(value)` to acknowledge (and reply with the
/// value), or `Err(outcome)` to settle the message otherwise; a `#[subscriber]` function may return
/// a `HandlerOutcome` directly.
///
/// | outcome | reliable list / stream | simple list |
/// |---|---|---|
/// | [`ack`](Self::ack) | removed | (already gone) |
/// | [`retry`](Self::retry) | back on the queue after the subscription's backoff, attempt + 1 | (already gone) |
/// | [`retry_after`](Self::retry_after) | back on the queue after the given delay, attempt + 1 | (already gone) |
/// | [`drop`](Self::drop) | removed, to the dead-letter list with reason `dropped` | (already gone) |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandlerOutcome(Outcome);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Outcome {
    Ack,
    Retry,
    RetryAfter(Duration),
    Drop,
}

impl HandlerOutcome {
    /// The message was handled: remove it.
    #[must_use]
    pub const fn ack() -> Self {
        Self(Outcome::Ack)
    }

    /// Handling failed and may succeed later: deliver again after the subscription's backoff.
    #[must_use]
    pub const fn retry() -> Self {
        Self(Outcome::Retry)
    }

    /// Handling failed: deliver again once `delay` has passed.
    #[must_use]
    pub const fn retry_after(delay: Duration) -> Self {
        Self(Outcome::RetryAfter(delay))
    }

    /// The message must not be handled again: remove it (to the dead-letter list, when there is one).
    #[must_use]
    pub const fn drop() -> Self {
        Self(Outcome::Drop)
    }

    /// Whether this outcome acknowledges the message.
    #[must_use]
    pub const fn is_ack(&self) -> bool {
        matches!(self.0, Outcome::Ack)
    }

    /// Whether this outcome asks for another delivery ([`retry`](Self::retry) or
    /// [`retry_after`](Self::retry_after)).
    #[must_use]
    pub const fn is_retry(&self) -> bool {
        matches!(self.0, Outcome::Retry | Outcome::RetryAfter(_))
    }

    /// The delay [`retry_after`](Self::retry_after) asked for; `None` for every other outcome
    /// (a plain [`retry`](Self::retry) waits the subscription's backoff).
    #[must_use]
    pub const fn retry_after_delay(&self) -> Option<Duration> {
        match self.0 {
            Outcome::RetryAfter(d) => Some(d),
            _ => None,
        }
    }

    /// Whether this outcome drops the message.
    #[must_use]
    pub const fn is_drop(&self) -> bool {
        matches!(self.0, Outcome::Drop)
    }
}

impl std::fmt::Display for HandlerOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Outcome::Ack => f.write_str("ack"),
            Outcome::Retry => f.write_str("retry"),
            Outcome::RetryAfter(d) => write!(f, "retry_after({d:?})"),
            Outcome::Drop => f.write_str("drop"),
        }
    }
}

/// What the broker does with a delivered message once its handler is done.
///
/// The core turns a [`HandlerOutcome`] (and the subscription's retry policy and attempt limit)
/// into one of these; a broker only carries them out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// Remove the message: it was handled.
    Ack,
    /// Put the message back for another attempt (attempt + 1), after `delay` when there is one.
    Retry {
        /// How long to wait before the next attempt; `None` puts it back on the queue at once.
        delay: Option<Duration>,
    },
    /// Remove the message without handling it; keep it in the dead-letter list when there is one.
    Dead {
        /// Why: `dropped`, `max-attempts`, `decode: <error>`, ... (stored as a header).
        reason: String,
    },
    /// Remove the message: it was cancelled (`publisher.cancel(..)`) while it ran. It goes to
    /// no dead-letter list: a cancel is an order, not a failure.
    Cancelled,
}
