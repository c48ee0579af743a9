//! Handlers with their message types erased, as the dispatch loop calls them: one message at a
//! time ([`ErasedHandler`]) or a batch ([`ErasedBatchHandler`]), and what a call came to
//! ([`Handled`]). The typed wrappers live with their builders (`subscriber`, `batch`).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::{ConfigError, DeliveryInfo, Error, HandlerOutcome, OutMessage, Publisher};

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
            return Err(ConfigError::new(
                "batch",
                "a batch size of 0 takes no message",
                "give it at least 1 (`batch = 1` hands one message at a time)",
            )
            .on(key)
            .into());
        }
        if self.size > concurrency {
            return Err(ConfigError::new(
                "batch",
                format!(
                    "batches of {} cannot fill: its source has at most {concurrency} messages in flight",
                    self.size
                ),
                format!(
                    "lower `batch` to at most {concurrency}, or raise the source's `.concurrency({})`",
                    self.size
                ),
            )
            .on(key)
            .into());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn a_batch_the_subscription_cannot_fill_names_the_option_and_the_subscription() {
        let options = |size| BatchOptions {
            size,
            max_wait: Duration::from_millis(10),
        };
        assert!(options(4).validate("orders", 4).is_ok());
        for (size, fix) in [(0, "at least 1"), (5, "at most 4")] {
            let e = options(size).validate("orders", 4).expect_err("refused");
            assert_eq!(e.kind(), ErrorKind::Configuration);
            let config = e.config_error().expect("a configuration error");
            assert_eq!(config.option, "batch", "{e}");
            assert_eq!(config.subject.as_deref(), Some("orders"), "{e}");
            assert!(config.fix.contains(fix), "{e}");
        }
    }
}
