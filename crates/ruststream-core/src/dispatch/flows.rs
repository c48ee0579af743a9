//! The dispatch loop's part in flows (see [`crate::flow`]): a flow child's end is reported to
//! the broker before the child is settled (so a crash between the two runs the child again,
//! whose second report changes nothing), and a parent whose flow failed is dead-lettered
//! without running. The commands are the broker's (`PublishBackend::flow_child`).

use std::time::Duration;

use crate::flow::{FAILED_HEADER, child_outcome, is_child};
use crate::{DeliveryInfo, Publisher, Retries, Settlement};

/// How long a child whose end could not be reported waits before it runs again (and reports
/// again).
const REPORT_AGAIN: Duration = Duration::from_secs(1);

/// The dead letter of a parent whose flow failed (a child was dead-lettered under
/// `ChildFailure::FailParent`): its reason names the child.
pub(super) fn failed_parent(info: &DeliveryInfo) -> Option<Settlement> {
    info.headers
        .get(FAILED_HEADER)
        .map(|reason| Settlement::Dead {
            reason: reason.clone(),
        })
}

/// Reports a flow child's end (nothing for any other message, or a retry to come). A report
/// that fails turns the settlement into a retry, when the source redelivers, so the child's end
/// is not lost: the child runs again and reports again.
pub(super) async fn report(
    publisher: &Publisher,
    info: &DeliveryInfo,
    settlement: &mut Settlement,
    retries: Retries,
) {
    if !is_child(&info.headers) {
        return;
    }
    let redelivers = matches!(retries, Retries::Redeliver);
    let Some(outcome) = child_outcome(settlement, !matches!(retries, Retries::Ignored)) else {
        return;
    };
    let reported = publisher
        .backend()
        .flow_child(&info.headers, &info.message_id, outcome)
        .await;
    if let Err(e) = reported {
        if redelivers {
            tracing::warn!(message_id = %info.message_id, error = %e,
                "a flow child's end was not recorded: it runs again");
            *settlement = Settlement::Retry {
                delay: Some(REPORT_AGAIN),
                snooze: true,
                why: crate::Why::snooze(format!("flow child's end not recorded: {e}")),
            };
        } else {
            tracing::error!(message_id = %info.message_id, error = %e,
                "a flow child's end was not recorded, and its source cannot redeliver it: its parent waits until the flow's max age");
        }
    }
}
