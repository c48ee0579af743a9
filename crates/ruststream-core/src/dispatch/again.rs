//! A message sent back, as its settlement: a retry or a snooze, or the dead-letter list once the
//! limit it counts against is reached. Sends nothing.

use std::time::Duration;

use crate::{DeliveryInfo, Settlement, SubscribeOptions, Why};

/// A retry for `reason`, or the dead-letter list once the attempts are used up.
pub(super) fn retry(
    info: &DeliveryInfo,
    delay: Option<Duration>,
    opts: &SubscribeOptions,
    reason: String,
) -> Settlement {
    again(info, delay, Why::retry(reason), opts)
}

/// A snooze: back after `delay` with the attempt unchanged, or the dead-letter list once the
/// message was snoozed `max_snoozes` times.
pub(super) fn snooze(
    info: &DeliveryInfo,
    delay: Duration,
    opts: &SubscribeOptions,
    reason: String,
) -> Settlement {
    again(info, Some(delay), Why::snooze(reason), opts)
}

/// Another delivery (a retry, or a snooze), or the dead-letter list once the limit it counts
/// against (`max_attempts`, `max_snoozes`) is reached. A retry without a delay of its own waits
/// the subscription's backoff.
fn again(
    info: &DeliveryInfo,
    delay: Option<Duration>,
    why: Why,
    opts: &SubscribeOptions,
) -> Settlement {
    let snooze = why.kind == "snooze";
    let (used, most, reason) = if snooze {
        (info.snoozes, opts.max_snoozes, "snoozed-too-often")
    } else {
        (info.attempt, opts.max_attempts, "max-attempts")
    };
    if used >= most {
        tracing::warn!(
            message_id = %info.message_id,
            attempts = info.attempt,
            snoozes = info.snoozes,
            source = %info.source,
            reason,
            "no attempts left: to the dead-letter list"
        );
        return Settlement::Dead {
            reason: reason.into(),
        };
    }
    let delay = delay.unwrap_or_else(|| opts.retry.delay(info.attempt));
    Settlement::Retry {
        delay: (!delay.is_zero()).then_some(delay),
        snooze,
        why,
    }
}
