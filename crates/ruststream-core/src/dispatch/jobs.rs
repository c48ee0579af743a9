//! The dispatch loop's part in job results (see [`crate::job`]): a message whose publisher
//! awaits its result and that ends in the dead-letter list (or, on a source that cannot
//! redeliver, is retried and so gone) gets its failure written to its job's record, so the
//! awaiter fails at once with the reason. The commands are the broker's `JobStore`'s.

use crate::job::RESULT_HEADER;
use crate::{DeliveryInfo, JobWrite, Publisher, Retries, Settlement};

/// Why an awaited job failed with this settlement; `None` when nobody awaits it or it is not
/// over (acked, or a retry to come).
pub(super) fn failure(
    info: &DeliveryInfo,
    settlement: &Settlement,
    retries: Retries,
) -> Option<String> {
    if !info.headers.contains_key(RESULT_HEADER) {
        return None;
    }
    match (settlement, retries) {
        (Settlement::Dead { reason }, _) => Some(reason.clone()),
        (Settlement::Cancelled, _) => Some(crate::cancel::CANCELLED.to_owned()),
        (Settlement::Retry { .. }, Retries::Ignored) => Some(
            "retried on a source that cannot redeliver (a simple list): the message is gone"
                .to_owned(),
        ),
        _ => None,
    }
}

/// Writes `reason` as the job's error. A failed write is logged: the awaiter then times out.
pub(super) async fn record_failure(publisher: &Publisher, info: &DeliveryInfo, reason: String) {
    let written = crate::job::write(publisher, &info.message_id, JobWrite::Failed(reason)).await;
    if let Err(e) = written {
        tracing::warn!(message_id = %info.message_id, error = %e,
            "the job's failure was not recorded: its awaiter will time out");
    }
}
