//! The metrics of one subscription (`ruststream_handled_total`, `ruststream_in_flight`,
//! `ruststream_handler_duration_seconds`, `ruststream_dead_lettered_total`,
//! `ruststream_timeouts_total`, `ruststream_cancelled_total`), registered once so
//! the hot path only increments. Sends no command.

use metrics::{Counter, Gauge, Histogram};

use crate::{Retries, Settlement};

/// The metrics of one subscription, registered once so the hot path only increments.
pub(super) struct Meters {
    pub(super) acked: Counter,
    retried: Counter,
    pub(super) ignored: Counter,
    dead: Counter,
    cancelled: Counter,
    pub(super) duration: Histogram,
    pub(super) in_flight: Gauge,
    /// `ruststream_timeouts_total`: messages whose handler call was stopped at its deadline.
    pub(super) timeouts: Counter,
    /// `ruststream_dead_lettered_total` of this subscription, one per [`REASONS`] label.
    dead_lettered: [Counter; REASONS.len()],
}

/// The bounded labels of a dead-letter reason; `decode: <error>` counts as `decode`.
const REASONS: [&str; 8] = [
    "max-attempts",
    "timeout",
    "snoozed-too-often",
    "dropped",
    "decode",
    "too-large",
    "no-redelivery",
    "other",
];

impl Meters {
    pub(super) fn new(subscription: &str) -> Self {
        let handled = |outcome: &'static str| metrics::counter!("ruststream_handled_total", "subscription" => subscription.to_owned(), "outcome" => outcome);
        Self {
            acked: handled("ack"),
            retried: handled("retry"),
            ignored: handled("ignored"),
            dead: handled("dead"),
            cancelled: metrics::counter!("ruststream_cancelled_total", "subscription" => subscription.to_owned()),
            duration: metrics::histogram!("ruststream_handler_duration_seconds", "subscription" => subscription.to_owned()),
            in_flight: metrics::gauge!("ruststream_in_flight", "subscription" => subscription.to_owned()),
            timeouts: metrics::counter!("ruststream_timeouts_total", "subscription" => subscription.to_owned()),
            dead_lettered: REASONS.map(|reason| metrics::counter!("ruststream_dead_lettered_total", "subscription" => subscription.to_owned(), "reason" => reason)),
        }
    }

    pub(super) fn record(&self, settlement: &Settlement, retries: Retries) {
        match settlement {
            Settlement::Retry { .. } if retries == Retries::Ignored => {}
            Settlement::Ack => self.acked.increment(1),
            Settlement::Retry { .. } => self.retried.increment(1),
            Settlement::Cancelled => self.cancelled.increment(1),
            Settlement::Dead { reason } => {
                self.dead.increment(1);
                self.dead_lettered[reason_index(reason)].increment(1);
            }
        }
    }
}

/// The index in [`REASONS`] of a dead-letter reason's label (`decode: <error>` is `decode`).
fn reason_index(reason: &str) -> usize {
    let head = reason.split(':').next().unwrap_or_default();
    REASONS
        .iter()
        .position(|r| *r == head)
        .unwrap_or(REASONS.len() - 1)
}
