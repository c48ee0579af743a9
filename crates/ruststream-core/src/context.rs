//! The per-message [`Context`] a handler receives: who the message is (attempt, snoozes), when
//! the handler must be done ([`Context::deadline`]), a way to publish, and the job's progress and
//! result (see [`crate::job`]), and its durable steps and sleeps (see [`crate::steps`]).

use std::sync::Arc;

use serde::Serialize;
use tokio::time::Instant;

use crate::{Headers, JobWrite, Publisher, Result};

/// What a broker knows about one delivered message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryInfo {
    /// The message id (made by the publisher; for a raw value, made on first delivery).
    pub message_id: String,
    /// 1 on the first delivery, 2 on the first retry, and so on.
    pub attempt: u32,
    /// The key the message was read from, without the broker's prefix.
    pub source: Arc<str>,
    /// The headers the publisher set.
    pub headers: Headers,
    /// How many times the message was snoozed ([`HandlerOutcome::snooze`](crate::HandlerOutcome::snooze))
    /// before this delivery; 0 by default.
    pub snoozes: u32,
    /// The cancel signals of the delivery's subscription (set by the dispatch loop).
    pub(crate) cancel: crate::cancel::Watch,
    /// Whether steps may run and whether the message has a step record (`crate::steps`).
    pub(crate) steps: crate::steps::StepsMark,
}

impl DeliveryInfo {
    /// Info for a message with an id and attempt number, read from `source`.
    pub fn new(message_id: String, attempt: u32, source: Arc<str>, headers: Headers) -> Self {
        Self {
            message_id,
            attempt,
            source,
            headers,
            snoozes: 0,
            cancel: crate::cancel::Watch::default(),
            steps: crate::steps::StepsMark::default(),
        }
    }
}

/// Per-message context passed to a handler.
#[derive(Debug)]
pub struct Context<'a> {
    pub(crate) info: &'a DeliveryInfo,
    publisher: &'a Publisher,
    deadline: Option<Instant>,
    /// The subscription's stop, when the dispatch loop runs the handler.
    stop: Option<&'a tokio_util::sync::CancellationToken>,
    /// This run's steps (`crate::steps`).
    pub(crate) steps: std::sync::Mutex<crate::steps::Replay>,
}

impl<'a> Context<'a> {
    /// A context over a delivery, publishing through `publisher`, with no deadline.
    pub fn new(info: &'a DeliveryInfo, publisher: &'a Publisher) -> Self {
        Self {
            info,
            publisher,
            deadline: None,
            stop: None,
            steps: std::sync::Mutex::default(),
        }
    }

    /// This context with the stop [`stopping`](Self::stopping) waits for.
    #[must_use]
    pub(crate) fn with_stop(mut self, stop: &'a tokio_util::sync::CancellationToken) -> Self {
        self.stop = Some(stop);
        self
    }

    /// This context with the deadline [`deadline`](Self::deadline) returns.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// When the handler must be done: the subscription's `timeout` after the call started, on
    /// tokio's clock (so a paused test clock moves it too); `None` when the subscription has no
    /// timeout. Past it the call is stopped, its future dropped: a handler that must not be cut
    /// off between two writes checks the time left (`deadline - Instant::now()`) first.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// How many times the message was snoozed before this delivery (0 at first).
    pub fn snoozes(&self) -> u32 {
        self.info.snoozes
    }

    /// The message id.
    pub fn message_id(&self) -> &str {
        &self.info.message_id
    }

    /// The delivery attempt: 1 the first time, 2 on the first retry, ...
    pub fn attempt(&self) -> u32 {
        self.info.attempt
    }

    /// The key the message was read from.
    pub fn source(&self) -> &str {
        &self.info.source
    }

    /// All headers set by the publisher.
    pub fn headers(&self) -> &Headers {
        &self.info.headers
    }

    /// One header, when set.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.info.headers.get(name).map(String::as_str)
    }

    /// Whether the publisher awaits this message's result (`publish().await_result(..)`).
    pub fn is_awaited(&self) -> bool {
        self.info.headers.contains_key(crate::job::RESULT_HEADER)
    }

    /// Reports the job's progress (any serde value, stored as JSON under the message id with
    /// the broker's result ttl), readable at once by any process with
    /// `publisher.progress::<P>(id)`. Each call replaces the progress before it; once the job
    /// has a result or failed, it changes nothing.
    ///
    /// ```no_run
    /// use ruststream_core::{Context, Result};
    ///
    /// async fn render(pages: u32, ctx: &mut Context<'_>) -> Result<()> {
    ///     for page in 1..=pages {
    ///         // ... render the page ...
    ///         ctx.progress(&(page * 100 / pages)).await?;
    ///     }
    ///     ctx.set_result(&format!("rendered {pages} pages")).await
    /// }
    /// ```
    pub async fn progress<P: Serialize + ?Sized>(&self, progress: &P) -> Result<()> {
        self.write(JobWrite::Progress(crate::job::encode(progress)?))
            .await
    }

    /// Sets the job's result (any serde value, stored as JSON under the message id with the
    /// broker's result ttl): what the publisher's `await_result` returns. The first result
    /// stays: a later call, e.g. by a redelivery of the message after a crash, changes nothing.
    pub async fn set_result<R: Serialize + ?Sized>(&self, result: &R) -> Result<()> {
        self.write(JobWrite::Result(crate::job::encode(result)?))
            .await
    }

    async fn write(&self, write: JobWrite) -> Result<()> {
        crate::job::write(self.publisher, &self.info.message_id, write).await
    }

    /// Resolves once the message is cancelled (`publisher.cancel(destination, id)`, or the
    /// operator's `cancel`) while this handler runs: stop the work, and return. Whatever the
    /// handler returns then, the message settles as cancelled; a handler still running
    /// [`cancel_grace`](crate::SubscribeOptions::cancel_grace) after the signal is dropped.
    /// On a source that cannot be cancelled (Pub/Sub) it never resolves; a batch handler has
    /// [`BatchContext::cancelled`](crate::BatchContext::cancelled) for each item.
    ///
    /// ```no_run
    /// use ruststream_core::{Context, Result};
    ///
    /// async fn render(ctx: &mut Context<'_>) -> Result<()> {
    ///     tokio::select! {
    ///         () = ctx.cancelled() => {} // clean up, then return
    ///         () = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub async fn cancelled(&self) {
        match &self.info.cancel.0 {
            Some(signals) => signals.signalled(&self.info.message_id).await,
            None => std::future::pending().await,
        }
    }

    /// Whether the message was cancelled while this handler runs (see
    /// [`cancelled`](Self::cancelled)), without waiting.
    pub fn is_cancelled(&self) -> bool {
        self.info
            .cancel
            .0
            .as_ref()
            .is_some_and(|s| s.is_signalled(&self.info.message_id))
    }

    /// Resolves once the app begins to stop (a SIGTERM, `shutdown()`): the handler has the
    /// app's `shutdown_timeout` to finish. A long loop records a checkpoint and returns a retry
    /// (`Err(HandlerOutcome::retry())`, or a step error with `?`): as it used steps, the
    /// message then goes back to its queue at once, with no attempt spent (a snooze, bounded by
    /// `max_snoozes`), and the next worker resumes at the checkpoint. Outside a running app (a context made by hand) it never resolves.
    ///
    /// ```no_run
    /// use ruststream_core::{Context, HandlerOutcome};
    ///
    /// async fn import(ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
    ///     let mut page = ctx.resume_from::<u32>().await?.unwrap_or(0);
    ///     while page < 100 {
    ///         tokio::select! {
    ///             () = ctx.stopping() => return Err(HandlerOutcome::retry()),
    ///             () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
    ///         }
    ///         page += 1;
    ///         ctx.checkpoint(&page).await?;
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub async fn stopping(&self) {
        match self.stop {
            Some(stop) => stop.cancelled().await,
            None => std::future::pending().await,
        }
    }

    /// Whether the app began to stop (see [`stopping`](Self::stopping)), without waiting.
    pub fn is_stopping(&self) -> bool {
        self.stop
            .is_some_and(tokio_util::sync::CancellationToken::is_cancelled)
    }

    /// The children of the flow this message is the parent of (see [`crate::flow`]), in the
    /// order they were added: each child's id, how it ended, and its result
    /// (`child.result::<R>()`).
    ///
    /// # Errors
    /// A configuration error when this message is no flow's parent; a broker error of kind
    /// [`Other`](crate::ErrorKind::Other) when its flow's record is gone (older than the result
    /// ttl); the broker's error when the read fails.
    pub async fn children(&self) -> Result<Vec<crate::FlowChild>> {
        crate::flow::children_of(self.publisher, self.info, "ctx.children()").await
    }

    /// A publisher on the broker the message came from:
    /// `ctx.publisher().message(&v).to("k").publish().await?`.
    pub fn publisher(&self) -> &'a Publisher {
        self.publisher
    }
}
