//! Batch handlers: a handler that receives up to `n` decoded messages at once.
//!
//! Built by hand with `subscriber(source, handler).batch(n).max_wait(d).build()` on a
//! [`HandleBatch`], or with `#[subscriber(source, batch = n, max_wait = d)]` on an
//! `async fn f(items: &[T])`. The dispatch loop claims messages as for any subscriber (the
//! source's `concurrency` still counts messages in flight) and gathers them into batches of `n`,
//! or fewer once `max_wait` has passed since the first of them arrived. Each message is then
//! settled on its own, as the handler's [`BatchOutcome`] says. This module sends no command.

use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Serialize;

use crate::erased::{BatchOptions, ErasedBatchHandler, Handled, Handler, panic_message};
use crate::subscriber::{MessageDoc, SubscriberBuilder};
use crate::{DeliveryInfo, HandlerOutcome, JobWrite, MessageType, Publisher, Source, Subscriber};

/// How long a partial batch waits for more messages when `max_wait` is not set.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_millis(100);

/// A batch handler: takes the decoded messages of one batch, in delivery order, and says what
/// becomes of them, all alike or one by one.
///
/// ```
/// use std::future::{Future, ready};
/// use ruststream_core::{BatchContext, BatchOutcome, HandleBatch, HandlerOutcome};
/// # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
/// # struct Row { id: u64 }
/// # ruststream_core::outgoing!(Row);
///
/// struct Insert;
///
/// impl HandleBatch<Row> for Insert {
///     fn handle_batch(
///         &self,
///         rows: &[Row],
///         _ctx: &mut BatchContext<'_>,
///     ) -> impl Future<Output = BatchOutcome> + Send {
///         // One outcome per row: a row without an id is refused, the others are stored.
///         let each = rows
///             .iter()
///             .map(|r| if r.id == 0 { HandlerOutcome::drop() } else { HandlerOutcome::ack() })
///             .collect::<Vec<_>>();
///         ready(BatchOutcome::each(each))
///     }
/// }
/// ```
///
/// Mount it with `subscriber(source, Insert).batch(100).max_wait(d).build()` (the guide's
/// "Batch handlers" page shows both forms on Redis).
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not handle batches of `{In}` messages",
    note = "implement `HandleBatch<{In}>` for `{Self}`, or write an `async fn(items: &[{In}])` with `#[subscriber(.., batch = n)]`"
)]
pub trait HandleBatch<In>: Send + Sync + 'static {
    /// Handles one batch: `items` are the decoded messages in delivery order, `ctx` has each
    /// one's [`DeliveryInfo`] (same order) and a publisher.
    fn handle_batch(
        &self,
        items: &[In],
        ctx: &mut BatchContext<'_>,
    ) -> impl Future<Output = BatchOutcome> + Send;
}

/// What a batch handler decided: one [`HandlerOutcome`] for the whole batch, or one per item.
///
/// Per item, the outcomes go to the items in the order the handler got them; a list of another
/// length than the batch is a bug in the handler: it is logged as an error and every item is
/// retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOutcome(Outcomes);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcomes {
    All(HandlerOutcome),
    Each(Vec<HandlerOutcome>),
}

impl BatchOutcome {
    /// Every item of the batch settles as `outcome` says.
    #[must_use]
    pub fn all(outcome: HandlerOutcome) -> Self {
        Self(Outcomes::All(outcome))
    }

    /// Every item was handled: acknowledge them all.
    #[must_use]
    pub fn ack() -> Self {
        Self::all(HandlerOutcome::ack())
    }

    /// One outcome per item, in the order the handler got the items.
    #[must_use]
    pub fn each(outcomes: Vec<HandlerOutcome>) -> Self {
        Self(Outcomes::Each(outcomes))
    }

    /// The outcome of each of `n` items; a per-item list of another length retries them all.
    fn per_item(self, n: usize) -> Vec<Handled> {
        match self.0 {
            Outcomes::All(o) => (0..n).map(|_| Handled::Outcome(o)).collect(),
            Outcomes::Each(each) if each.len() == n => {
                each.into_iter().map(Handled::Outcome).collect()
            }
            Outcomes::Each(each) => {
                let why = format!(
                    "the batch handler returned {} outcomes for {n} items (a bug in the handler: return one per item)",
                    each.len()
                );
                (0..n).map(|_| Handled::Broken(why.clone())).collect()
            }
        }
    }
}

impl From<HandlerOutcome> for BatchOutcome {
    fn from(outcome: HandlerOutcome) -> Self {
        Self::all(outcome)
    }
}

impl From<Vec<HandlerOutcome>> for BatchOutcome {
    fn from(outcomes: Vec<HandlerOutcome>) -> Self {
        Self::each(outcomes)
    }
}

/// What a batch `async fn` may return; `#[subscriber(.., batch = n)]` converts it with this trait.
///
/// For the whole batch: `HandlerOutcome`, `()`, `Result<(), E>`, `Result<HandlerOutcome, E>`;
/// per item: `Vec<HandlerOutcome>`, `Result<Vec<HandlerOutcome>, E>`; or a [`BatchOutcome`].
/// An `Err(e)` is logged and every item retried.
#[diagnostic::on_unimplemented(
    message = "a batch subscriber cannot return `{Self}`",
    note = "return `HandlerOutcome`, `()`, `Result<(), E>`, `Vec<HandlerOutcome>` (one per item) or `BatchOutcome`"
)]
pub trait IntoBatchOutcome {
    /// Converts into the outcome a [`HandleBatch`] returns.
    fn into_batch_outcome(self) -> BatchOutcome;
}

impl IntoBatchOutcome for BatchOutcome {
    fn into_batch_outcome(self) -> BatchOutcome {
        self
    }
}

impl IntoBatchOutcome for HandlerOutcome {
    fn into_batch_outcome(self) -> BatchOutcome {
        BatchOutcome::all(self)
    }
}

impl IntoBatchOutcome for () {
    fn into_batch_outcome(self) -> BatchOutcome {
        BatchOutcome::ack()
    }
}

impl IntoBatchOutcome for Vec<HandlerOutcome> {
    fn into_batch_outcome(self) -> BatchOutcome {
        BatchOutcome::each(self)
    }
}

impl<T: IntoBatchOutcome, E: std::fmt::Display> IntoBatchOutcome for Result<T, E> {
    fn into_batch_outcome(self) -> BatchOutcome {
        match self {
            Ok(v) => v.into_batch_outcome(),
            Err(e) => {
                tracing::warn!(error = %e, "batch handler failed; every item will be retried");
                BatchOutcome::all(HandlerOutcome::retry())
            }
        }
    }
}

/// What a batch handler gets besides the items: each item's delivery and a publisher.
#[derive(Debug)]
pub struct BatchContext<'a> {
    infos: &'a [&'a DeliveryInfo],
    publisher: &'a Publisher,
    deadline: Option<tokio::time::Instant>,
}

impl<'a> BatchContext<'a> {
    /// A context over the deliveries of a batch (in the items' order), publishing through
    /// `publisher`.
    pub fn new(infos: &'a [&'a DeliveryInfo], publisher: &'a Publisher) -> Self {
        Self {
            infos,
            publisher,
            deadline: None,
        }
    }

    /// This context with the deadline [`deadline`](Self::deadline) returns.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Option<tokio::time::Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// When the batch handler must be done, as
    /// [`Context::deadline`](crate::Context::deadline) for one message: past it every item is
    /// retried, or dead-lettered `timeout` once its attempts are spent.
    pub fn deadline(&self) -> Option<tokio::time::Instant> {
        self.deadline
    }

    /// How many items the batch has.
    pub fn len(&self) -> usize {
        self.infos.len()
    }

    /// Whether the batch has no item (a handler is never called with one).
    pub fn is_empty(&self) -> bool {
        self.infos.is_empty()
    }

    /// The delivery (id, attempt, source, headers) of item `i`, when there is one.
    pub fn info(&self, i: usize) -> Option<&'a DeliveryInfo> {
        self.infos.get(i).copied()
    }

    /// Each item's delivery, in the items' order.
    pub fn infos(&self) -> impl ExactSizeIterator<Item = &'a DeliveryInfo> + '_ {
        self.infos.iter().copied()
    }

    /// Resolves once item `i`'s message is cancelled, as
    /// [`Context::cancelled`](crate::Context::cancelled) does for one message; never for an
    /// index past the batch or on a source that cannot be cancelled (Pub/Sub). A cancel does not
    /// drop the batch call (the other items' work would go with it): the cancelled items settle
    /// as cancelled whatever the call returns, and the subscription's `timeout` bounds the call.
    pub async fn cancelled(&self, i: usize) {
        let watched = self
            .infos
            .get(i)
            .and_then(|info| info.cancel.0.as_ref().map(|s| (s, &info.message_id)));
        match watched {
            Some((signals, id)) => signals.signalled(id).await,
            None => std::future::pending().await,
        }
    }

    /// Whether item `i`'s message was cancelled while the batch runs, without waiting.
    pub fn is_cancelled(&self, i: usize) -> bool {
        self.infos.get(i).is_some_and(|info| {
            info.cancel
                .0
                .as_ref()
                .is_some_and(|s| s.is_signalled(&info.message_id))
        })
    }

    /// A publisher on the broker the batch came from.
    pub fn publisher(&self) -> &'a Publisher {
        self.publisher
    }

    /// Reports item `i`'s progress, as [`Context::progress`](crate::Context::progress) does for
    /// one message.
    pub async fn progress<P: Serialize + ?Sized>(&self, i: usize, p: &P) -> crate::Result<()> {
        let write = JobWrite::Progress(crate::job::encode(p)?);
        crate::job::write(self.publisher, self.job_id(i)?, write).await
    }

    /// Sets item `i`'s result, as [`Context::set_result`](crate::Context::set_result) does for
    /// one message: what its publisher's `await_result` returns; the first result stays.
    pub async fn set_result<R: Serialize + ?Sized>(&self, i: usize, r: &R) -> crate::Result<()> {
        let write = JobWrite::Result(crate::job::encode(r)?);
        crate::job::write(self.publisher, self.job_id(i)?, write).await
    }

    /// Item `i`'s children, when it is a flow's parent, as
    /// [`Context::children`](crate::Context::children) gives them for one message.
    ///
    /// # Errors
    /// A configuration error when there is no item `i` or when it is no flow's parent; a broker
    /// error of kind [`Other`](crate::ErrorKind::Other) when its flow's record is gone; the
    /// broker's error when the read fails.
    pub async fn children(&self, i: usize) -> crate::Result<Vec<crate::FlowChild>> {
        crate::flow::children_of(self.publisher, self.item(i)?, "ctx.children(i)").await
    }

    fn job_id(&self, i: usize) -> crate::Result<&'a str> {
        self.item(i).map(|info| info.message_id.as_str())
    }

    /// Item `i`'s delivery, or an error naming the batch's size.
    fn item(&self, i: usize) -> crate::Result<&'a DeliveryInfo> {
        self.info(i).ok_or_else(|| {
            crate::ConfigError::new(
                "batch item index",
                format!("no item {i} in a batch of {}", self.len()),
                format!("pass an index below {}", self.len()),
            )
            .into()
        })
    }
}

impl<S: Source, H> SubscriberBuilder<S, H> {
    /// The handler takes up to `size` messages at once (a [`HandleBatch`]): finish with
    /// `.max_wait(d).build()` (see [`crate::batch`]). A batch handler does not reply.
    pub fn batch(self, size: usize) -> BatchBuilder<S, H> {
        BatchBuilder::new(self.source, self.handler, size)
    }
}

struct TypedBatch<H, In> {
    handler: H,
    _types: PhantomData<fn(In)>,
}

impl<H: HandleBatch<In>, In: MessageType> ErasedBatchHandler for TypedBatch<H, In> {
    fn call<'a>(
        &'a self,
        items: &'a [(&'a DeliveryInfo, &'a [u8])],
        publisher: &'a Publisher,
        deadline: Option<tokio::time::Instant>,
    ) -> BoxFuture<'a, Vec<Handled>> {
        Box::pin(async move {
            let mut handled: Vec<Option<Handled>> = items.iter().map(|_| None).collect();
            let mut decoded = Vec::with_capacity(items.len());
            let mut infos = Vec::with_capacity(items.len());
            let mut at = Vec::with_capacity(items.len());
            for (i, (info, payload)) in items.iter().enumerate() {
                match In::decode(payload) {
                    Ok(m) => {
                        decoded.push(m);
                        infos.push(*info);
                        at.push(i);
                    }
                    Err(e) => handled[i] = Some(Handled::Failed(e)),
                }
            }
            if !decoded.is_empty() {
                let mut ctx = BatchContext::new(&infos, publisher).with_deadline(deadline);
                let run = AssertUnwindSafe(self.handler.handle_batch(&decoded, &mut ctx));
                let outcomes = match run.catch_unwind().await {
                    Ok(outcome) => outcome.per_item(decoded.len()),
                    Err(panic) => {
                        let why = format!("handler panicked: {}", panic_message(&*panic));
                        decoded
                            .iter()
                            .map(|_| Handled::Broken(why.clone()))
                            .collect()
                    }
                };
                for (i, h) in at.into_iter().zip(outcomes) {
                    handled[i] = Some(h);
                }
            }
            handled
                .into_iter()
                .map(|h| h.unwrap_or(Handled::Broken("no outcome".into())))
                .collect()
        })
    }
}

/// A batch subscriber being built: `subscriber(source, handler).batch(n)`.
#[must_use = "finish with `.build()`"]
pub struct BatchBuilder<S, H> {
    source: S,
    handler: H,
    options: BatchOptions,
}

impl<S: std::fmt::Debug, H> std::fmt::Debug for BatchBuilder<S, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchBuilder")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl<S: Source, H> BatchBuilder<S, H> {
    pub(crate) fn new(source: S, handler: H, size: usize) -> Self {
        Self {
            source,
            handler,
            options: BatchOptions {
                size,
                max_wait: DEFAULT_MAX_WAIT,
            },
        }
    }

    /// How long a partial batch waits for more messages after its first arrived (default
    /// [`DEFAULT_MAX_WAIT`]); zero hands over whatever was claimed together.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.options.max_wait = max_wait;
        self
    }

    /// Builds the subscriber. A batch subscriber does not reply.
    pub fn build<In: MessageType>(self) -> Subscriber<S::Broker>
    where
        H: HandleBatch<In>,
    {
        let handler = TypedBatch {
            handler: self.handler,
            _types: PhantomData::<fn(In)>,
        };
        Subscriber {
            source: self.source.into_source(),
            handler: Handler::Batch(Arc::new(handler), self.options),
            input: MessageDoc::of::<In>(),
            reply: None,
            uses_steps: false,
        }
    }
}
