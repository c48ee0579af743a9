//! The handler trait users implement, and what a handler may return.

use std::fmt::Display;
use std::future::Future;

use crate::{Context, HandlerOutcome, MessageType};

/// A message handler: takes a decoded `In`, returns `Ok(Out)` to acknowledge (and reply with
/// `Out` when the subscription has a reply destination) or `Err(outcome)` to settle otherwise.
///
/// ```
/// use std::future::{Future, ready};
/// use ruststream_core::{Context, Handle, HandlerOutcome};
/// # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
/// # struct Job { image: String }
/// # ruststream_core::outgoing!(Job);
///
/// struct Render;
///
/// impl Handle<Job> for Render {
///     fn handle(
///         &self,
///         job: &Job,
///         _outs: &(),
///         _ctx: &mut Context<'_>,
///     ) -> impl Future<Output = Result<(), HandlerOutcome>> {
///         if job.image.is_empty() {
///             return ready(Err(HandlerOutcome::drop()));
///         }
///         ready(Ok(()))
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not handle `{In}` messages (with replies of type `{Out}`)",
    note = "implement `Handle<{In}, {Out}>` for `{Self}`, or write an `async fn` with `#[subscriber(..)]`"
)]
pub trait Handle<In, Out = ()>: Send + Sync + 'static {
    /// Handles one message. `outs` is reserved for typed outputs and is `&()` today.
    fn handle(
        &self,
        msg: &In,
        outs: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<Out, HandlerOutcome>> + Send;
}

/// What an `async fn` handler may return; `#[subscriber]` converts it with this trait.
///
/// `HandlerOutcome`, `()`, `Result<(), E>`, `Result<HandlerOutcome, E>`, and with a reply the reply
/// type `T` or `Result<T, E>`. An `Err(e)` is logged and retried.
#[diagnostic::on_unimplemented(
    message = "a subscriber cannot return `{Self}`",
    note = "return `HandlerOutcome`, `()`, `Result<(), E>`, `Result<HandlerOutcome, E>`, or with `reply` the reply type"
)]
pub trait IntoHandlerResult<Out> {
    /// Converts into the result a [`Handle`] returns.
    fn into_handler_result(self) -> Result<Out, HandlerOutcome>;
}

impl IntoHandlerResult<()> for HandlerOutcome {
    fn into_handler_result(self) -> Result<(), HandlerOutcome> {
        if self.is_ack() { Ok(()) } else { Err(self) }
    }
}

impl IntoHandlerResult<()> for () {
    fn into_handler_result(self) -> Result<(), HandlerOutcome> {
        Ok(())
    }
}

impl<E: Display> IntoHandlerResult<()> for Result<(), E> {
    fn into_handler_result(self) -> Result<(), HandlerOutcome> {
        self.map_err(failed)
    }
}

impl<E: Display> IntoHandlerResult<()> for Result<HandlerOutcome, E> {
    fn into_handler_result(self) -> Result<(), HandlerOutcome> {
        self.map_err(failed)?.into_handler_result()
    }
}

impl<T: MessageType> IntoHandlerResult<T> for T {
    fn into_handler_result(self) -> Result<T, HandlerOutcome> {
        Ok(self)
    }
}

impl<T: MessageType, E: Display> IntoHandlerResult<T> for Result<T, E> {
    fn into_handler_result(self) -> Result<T, HandlerOutcome> {
        self.map_err(failed)
    }
}

fn failed(e: impl Display) -> HandlerOutcome {
    tracing::warn!(error = %e, "handler failed; the message will be retried");
    crate::outcome::note_failure(e.to_string());
    HandlerOutcome::retry()
}
