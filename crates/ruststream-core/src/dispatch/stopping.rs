//! What a stop does to the messages being handled. A message whose handler used steps in this
//! run goes back to its queue at once, with no attempt spent, when its handler returns a retry
//! once the stop began or is cut off when `shutdown_timeout` is over. The step record stays, so
//! the next worker resumes at the last checkpoint without waiting for `min_idle`. The way back
//! is a snooze without a delay: the attempt stays, and `max_snoozes` bounds how many stops a
//! message sits through. Any other handler's retry is an ordinary retry. Sends no command.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use tokio_util::sync::CancellationToken;

use crate::erased::Handled;
use crate::steps::StepsMark;

/// The cut-off of a subscription's running handlers, `shutdown_timeout` after its stop.
#[derive(Debug, Default)]
pub(super) struct Cut {
    /// Set at the cut-off: read on every poll of a handler, so an atomic, not the token.
    done: AtomicBool,
    /// Cancelled at the cut-off: wakes the batch runners, which poll their handlers again.
    signal: CancellationToken,
}

impl Cut {
    /// Cuts the running handlers off.
    pub(super) fn cut(&self) {
        self.done.store(true, Ordering::Release);
        self.signal.cancel();
    }

    /// Whether the handlers are cut off.
    fn is_cut(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Resolves at the cut-off.
    pub(super) fn cutting(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.signal.cancelled()
    }
}

/// `run` (what the handler did, with the error it noted), or [`Handled::CutOff`] once `cut` is
/// done and the handler has used steps. A handler without steps runs on until its batch is
/// dropped, and its message is left to recovery.
pub(super) async fn cut_off(
    run: impl Future<Output = (Handled, Option<String>)>,
    cut: &Cut,
    steps: &StepsMark,
) -> (Handled, Option<String>) {
    let mut run = std::pin::pin!(run);
    std::future::poll_fn(|cx| {
        if cut.is_cut() && steps.used() {
            return Poll::Ready((Handled::CutOff, None));
        }
        run.as_mut().poll(cx)
    })
    .await
}

/// Whether the handler's `outcome` puts its message back at once: a cut-off, or a retry decided
/// once the stop began by a handler that used steps. The stop is looked at only for a retry, so
/// an ack costs nothing more.
pub(super) fn stopped(outcome: &Handled, stop: &CancellationToken, steps: &StepsMark) -> bool {
    match outcome {
        Handled::Outcome(o) => o.is_retry() && steps.used() && stop.is_cancelled(),
        Handled::CutOff => true,
        _ => false,
    }
}
