//! Handlers with their message types erased, as the dispatch loop calls them: one message at a
//! time ([`ErasedHandler`]) or a batch ([`ErasedBatchHandler`]), and what a call came to
//! ([`Handled`]). The typed wrappers live with their builders (`subscriber`, `batch`).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::{DeliveryInfo, Error, HandlerOutcome, OutMessage, Publisher};

/// What running a handler on one payload came to.
#[derive(Debug)]
pub(crate) enum Handled {
    /// Acknowledge, publishing the reply first when there is one.
    Ack(Option<OutMessage>),
    /// The handler settled otherwise.
    Outcome(HandlerOutcome),
    /// The payload could not be decoded, or the reply could not be encoded.
    Failed(Error),
    /// The handler panicked or broke its contract (says why): the message is retried.
    Broken(String),
    /// The handler was still running at its deadline and was stopped: the message is retried,
    /// or dead-lettered `timeout` once its attempts are spent.
    TimedOut,
    /// The handler, which used steps, was still running when the app's `shutdown_timeout` was
    /// over, and was stopped: the message goes back to its queue at once.
    CutOff,
}

impl Handled {
    /// What the handler decided, when it did.
    pub(crate) fn decided(&self) -> Option<HandlerOutcome> {
        match self {
            Self::Ack(_) => Some(HandlerOutcome::ack()),
            Self::Outcome(o) => Some(*o),
            Self::Failed(_) | Self::Broken(_) | Self::TimedOut | Self::CutOff => None,
        }
    }
}

/// What a subscriber runs: a handler of one message at a time, or of batches.
pub(crate) enum Handler {
    One(Arc<dyn ErasedHandler>),
    Batch(Arc<dyn ErasedBatchHandler>, BatchOptions),
}

/// The text a panic was raised with, when it was a string.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(ToString::to_string)
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// A handler with its message types erased: decode, handle, encode the reply. `deadline` is what
/// its context's `deadline()` says (the dispatch loop enforces it); `stop` is what its
/// `stopping()` waits for.
pub(crate) trait ErasedHandler: Send + Sync + 'static {
    fn call<'a>(
        &'a self,
        info: &'a DeliveryInfo,
        payload: &'a [u8],
        publisher: &'a Publisher,
        deadline: Option<tokio::time::Instant>,
        stop: &'a tokio_util::sync::CancellationToken,
    ) -> BoxFuture<'a, Handled>;
}

/// The size and wait of a batch subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchOptions {
    pub(crate) size: usize,
    pub(crate) max_wait: Duration,
}

impl BatchOptions {
    /// Refuses a batch size the subscription cannot fill: 0, or more than its `concurrency`.
    pub(crate) fn validate(&self, key: &str, concurrency: usize) -> crate::Result<()> {
        if self.size == 0 {
            return Err(Error::config(format!(
                "the batch subscriber of `{key}` has batch size 0: give it at least 1 (`batch = 1` hands one message at a time)"
            )));
        }
        if self.size > concurrency {
            return Err(Error::config(format!(
                "the batch subscriber of `{key}` takes batches of {} but its source has at most {concurrency} messages in flight: lower `batch` to at most {concurrency}, or raise the source's `.concurrency({})`",
                self.size, self.size
            )));
        }
        Ok(())
    }
}

/// A batch handler with its message type erased: decode each item, run the handler on those
/// that decode, one [`Handled`] per item given.
pub(crate) trait ErasedBatchHandler: Send + Sync + 'static {
    fn call<'a>(
        &'a self,
        items: &'a [(&'a DeliveryInfo, &'a [u8])],
        publisher: &'a Publisher,
        deadline: Option<tokio::time::Instant>,
    ) -> BoxFuture<'a, Vec<Handled>>;
}
