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
/// | [`snooze`](Self::snooze) | back on the queue after the given delay, attempt unchanged, snoozes + 1; past the source's `max_snoozes`, to the dead-letter list with reason `snoozed-too-often` | (already gone) |
/// | [`drop`](Self::drop) | removed, to the dead-letter list with reason `dropped` | (already gone) |
///
/// A handler still running at the subscription's `timeout` is stopped (its future dropped) and
/// its message settled as a [`retry`](Self::retry); once its attempts are spent, it goes to the
/// dead-letter list with reason `timeout`. On a source that cannot redeliver (Pub/Sub), a retry
/// or snooze goes to the dead-letter list with that source's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandlerOutcome(Outcome);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Outcome {
    Ack,
    Retry,
    RetryAfter(Duration),
    Snooze(Duration),
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

    /// Not now, and not a failure: deliver again once `delay` has passed, without spending an
    /// attempt (the next delivery has the same [`attempt`](crate::Context::attempt), and
    /// [`snoozes`](crate::Context::snoozes) one more). A message snoozed more than its source's
    /// `max_snoozes` goes to the dead-letter list with reason `snoozed-too-often`.
    #[must_use]
    pub const fn snooze(delay: Duration) -> Self {
        Self(Outcome::Snooze(delay))
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

    /// Whether this outcome is a [`snooze`](Self::snooze).
    #[must_use]
    pub const fn is_snooze(&self) -> bool {
        matches!(self.0, Outcome::Snooze(_))
    }

    /// The delay [`snooze`](Self::snooze) asked for; `None` for every other outcome.
    #[must_use]
    pub const fn snooze_delay(&self) -> Option<Duration> {
        match self.0 {
            Outcome::Snooze(d) => Some(d),
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
            Outcome::Snooze(d) => write!(f, "snooze({d:?})"),
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
    /// Put the message back for another delivery, after `delay` when there is one: attempt + 1,
    /// or for a snooze, attempt unchanged and snoozes + 1.
    Retry {
        /// How long to wait before the next delivery; `None` puts it back on the queue at once.
        delay: Option<Duration>,
        /// A snooze: the next delivery keeps the attempt and counts one more snooze.
        snooze: bool,
        /// What sent it back and why, for the message's history.
        why: Why,
    },
    /// Remove the message without handling it; keep it in the dead-letter list when there is one.
    Dead {
        /// Why: `dropped`, `max-attempts`, `timeout`, `snoozed-too-often`, `decode: <error>`, `too-large: ..`, ...
        /// (stored as a header).
        reason: String,
    },
    /// Remove the message: it was cancelled (`publisher.cancel(..)`) while it ran. It goes to
    /// no dead-letter list: a cancel is an order, not a failure.
    Cancelled,
}

/// What sent a message back for another delivery, and why: the broker records it in the
/// message's history (the Redis broker's `rs.history` header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Why {
    /// `retry`, `snooze`, `sleep` (a durable sleep) or `wait` (a wait for a signal).
    pub kind: &'static str,
    /// The handler's error, a panic's text, `timeout`, a signal's name; empty when the
    /// handler asked for it without saying why.
    pub reason: String,
}

impl Why {
    /// A retry for `reason`.
    #[must_use]
    pub fn retry(reason: impl Into<String>) -> Self {
        Self {
            kind: "retry",
            reason: reason.into(),
        }
    }

    /// A snooze for `reason`.
    #[must_use]
    pub fn snooze(reason: impl Into<String>) -> Self {
        Self {
            kind: "snooze",
            reason: reason.into(),
        }
    }
}

thread_local! {
    /// The error text of a handler that ended with `Err(e)` (see [`IntoHandlerResult`]), kept
    /// for its retry's [`Why`]. The conversion that notes it runs at the end of the handler's
    /// future, in the poll that completes it, and [`noting_failure`] takes it right after, on
    /// the same thread: nothing runs between the two. So no handler call pays for it on every
    /// poll, as it would for a task-local.
    ///
    /// [`IntoHandlerResult`]: crate::IntoHandlerResult
    static FAILURE: std::cell::Cell<Option<String>> = const { std::cell::Cell::new(None) };
}

/// Notes `text` as the running handler's error.
pub(crate) fn note_failure(text: String) {
    FAILURE.with(|f| f.set(Some(text)));
}

/// Runs `handler` and returns what it returned with the error it noted (`note_failure`). A
/// note left by a handler that did not complete through here is dropped first.
pub(crate) async fn noting_failure<T>(handler: impl Future<Output = T>) -> (T, Option<String>) {
    FAILURE.with(std::cell::Cell::take);
    let out = handler.await;
    (out, FAILURE.with(std::cell::Cell::take))
}
