//! Publishing: the broker-agnostic [`Publisher`] handle and its builders.
//!
//! A broker implements [`PublishBackend`]; users reach it through `broker.publisher()`, through
//! [`Context::publisher`](crate::Context::publisher) inside a handler, and through replies.
//! `builder.rs` holds the builder a publish is written with and the future it is sent as.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::{ConfigError, Durability, Error, Headers, MessageType, Result};

mod builder;

pub use self::builder::{PublishBuilder, Publishing};

/// The header that names a message's fair group ([`PublishBuilder::group`]).
pub const GROUP_HEADER: &str = "rs.group";

/// When a delayed message becomes due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// This long after the broker receives the publish (measured on the broker's clock).
    In(Duration),
    /// At this wall-clock time.
    At(SystemTime),
}

/// One encoded message on its way to a broker.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OutMessage {
    /// The key (list, stream, channel) it goes to, before the broker's prefix.
    pub destination: String,
    /// The encoded payload.
    pub payload: Bytes,
    /// User headers.
    pub headers: Headers,
    /// The message id; the broker makes one when `None`.
    pub id: Option<String>,
    /// Hold the message back until it is due.
    pub due: Option<Due>,
    /// On a destination spread over partitions, the key that picks the partition: messages with
    /// one key go to one partition, so they stay in order. `None` spreads them round robin.
    pub partition_key: Option<String>,
    /// Publish only when no message with the same [`id`](Self::id) was published to this
    /// destination within this window; a second one in the window is not enqueued. Needs an id.
    pub unique_for: Option<Duration>,
    /// On a destination with priority levels (`RedisList::new(k).priorities(n)`), the level:
    /// `0` (the default) is the lowest, `n - 1` the highest, read first.
    pub priority: u8,
    /// Return only once this many replicas hold the message (see [`Durability`]); `None`
    /// leaves it to the destination's policy.
    pub durable: Option<Durability>,
}

impl OutMessage {
    /// A message with a payload for a destination, no headers, id or delay.
    pub fn new(destination: impl Into<String>, payload: Bytes) -> Self {
        Self {
            destination: destination.into(),
            payload,
            headers: Headers::new(),
            id: None,
            due: None,
            partition_key: None,
            unique_for: None,
            priority: 0,
            durable: None,
        }
    }
}

/// What a publish did: how many of its messages were enqueued, and how many were not because a
/// message with the same id was published within its [`unique_for`](PublishBuilder::unique_for)
/// window (or waits in the delayed set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Enqueued {
    /// Messages enqueued (or scheduled, when delayed).
    pub enqueued: usize,
    /// Messages not enqueued: their id was seen within the window.
    pub duplicates: usize,
}

impl Enqueued {
    /// `enqueued` of `sent` messages (the rest were duplicates).
    pub fn of(enqueued: usize, sent: usize) -> Self {
        Self {
            enqueued,
            duplicates: sent.saturating_sub(enqueued),
        }
    }

    /// Whether every message was enqueued (none was a duplicate).
    pub fn is_enqueued(&self) -> bool {
        self.duplicates == 0
    }
}

/// What a broker implements to publish. One call may carry many messages: send them in as few
/// round trips as the broker can.
pub trait PublishBackend: Send + Sync + 'static {
    /// Publishes every message, or fails; returns how many were enqueued (a message with
    /// [`OutMessage::unique_for`] whose id was seen within the window is not).
    fn publish(&self, messages: Vec<OutMessage>) -> BoxFuture<'_, Result<usize>>;

    /// Where this broker keeps job progress and results (see [`crate::job`]); `None` (the
    /// default) when it keeps none, and then `await_result`, `Context::set_result` and
    /// `Publisher::job_state` fail saying so.
    fn jobs(&self) -> Option<&dyn crate::JobStore> {
        None
    }

    /// Where this broker keeps step records (see [`crate::steps`]); `None` (the default) when
    /// it keeps none, and then `Context::step` and `Context::sleep` fail saying so.
    fn steps(&self) -> Option<&dyn crate::StepStore> {
        None
    }

    /// Cancels message `id` of `destination` wherever it is (see
    /// [`Publisher::cancel`]); a call made again answers what the first did. The default
    /// refuses: the broker cannot cancel.
    fn cancel<'a>(
        &'a self,
        destination: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<crate::CancelOutcome>> {
        let _ = (destination, id);
        Box::pin(async {
            Err(ConfigError::new(
                "broker",
                "this broker cannot cancel messages",
                "use a broker that does (RedisBroker)",
            )
            .into())
        })
    }

    /// Sends the signal `name` with `payload` (JSON) to message `id` of `destination` (see
    /// [`Publisher::signal`]). The default refuses: the broker keeps no step records.
    fn signal<'a>(
        &'a self,
        destination: &'a str,
        id: &'a str,
        name: &'a str,
        payload: bytes::Bytes,
    ) -> BoxFuture<'a, Result<crate::Signalled>> {
        let _ = (destination, id, name, payload);
        Box::pin(async { Err(crate::steps::unsupported()) })
    }

    /// Publishes a flow (see [`crate::flow`]): its record, then its children; a flow published
    /// again with the same id finishes what the first publish left undone. The default refuses.
    fn publish_flow(&self, flow: crate::flow::OutFlow) -> BoxFuture<'_, Result<()>> {
        let _ = flow;
        Box::pin(async { Err(crate::flow::unsupported()) })
    }

    /// Records that the flow child `child_id` (whose headers are `headers`) ended with
    /// `outcome`, before the child is settled; enqueues the parent when it was the last. A call
    /// made again changes nothing. The default does nothing (it published no flow).
    fn flow_child<'a>(
        &'a self,
        headers: &'a crate::Headers,
        child_id: &'a str,
        outcome: crate::flow::ChildOutcome,
    ) -> BoxFuture<'a, Result<()>> {
        let _ = (headers, child_id, outcome);
        Box::pin(async { Ok(()) })
    }

    /// The state of the flow whose record a parent's [`RECORD_HEADER`](crate::flow::RECORD_HEADER)
    /// names; `None` when there is none (expired). The default refuses.
    fn read_flow<'a>(
        &'a self,
        record: &'a str,
    ) -> BoxFuture<'a, Result<Option<crate::flow::FlowState>>> {
        let _ = record;
        Box::pin(async { Err(crate::flow::unsupported()) })
    }
}

/// A cheap, cloneable handle that publishes messages through a broker.
#[derive(Clone)]
pub struct Publisher(Arc<dyn PublishBackend>);

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Publisher")
    }
}

impl Publisher {
    /// Wraps a broker's publish backend.
    pub fn new(backend: Arc<dyn PublishBackend>) -> Self {
        Self(backend)
    }

    /// Starts a publish of one value: `publisher.message(&v).to("jobs").publish().await?`.
    pub fn message<'a, T: MessageType>(&'a self, value: &'a T) -> PublishBuilder<'a, T> {
        PublishBuilder::new(self, std::slice::from_ref(value))
    }

    /// Starts a publish of many values in one round trip: `publisher.messages(&jobs).to("jobs")`.
    pub fn messages<'a, T: MessageType>(&'a self, values: &'a [T]) -> PublishBuilder<'a, T> {
        PublishBuilder::new(self, values)
    }

    /// Starts a flow: `parent` runs once every child added with
    /// [`child`](crate::flow::FlowBuilder::child) is done, and reads their results
    /// ([`Context::children`](crate::Context::children)); see [`crate::flow`].
    pub fn flow<'a, T: MessageType>(&'a self, parent: &T) -> crate::flow::FlowBuilder<'a> {
        crate::flow::FlowBuilder::new(self, parent)
    }

    /// The broker's publish backend.
    pub(crate) fn backend(&self) -> &dyn PublishBackend {
        &*self.0
    }

    /// Publishes already encoded messages. With the `otel` feature, in a producer span whose
    /// trace context goes into each message's headers (see the `otel` module).
    pub async fn send(&self, messages: Vec<OutMessage>) -> Result<Enqueued> {
        if messages.is_empty() {
            return Ok(Enqueued::default());
        }
        let sent = messages.len();
        #[cfg(feature = "otel")]
        let (messages, span) = crate::otel::Producer::start(messages);
        let result = self.0.publish(messages).await;
        #[cfg(feature = "otel")]
        span.end(&result);
        result.map(|n| Enqueued::of(n, sent))
    }
}

impl Publisher {
    /// What is known of job `id` (a message id): its latest progress, its result or why it
    /// failed; `None` when nothing was recorded or the record expired.
    pub async fn job_state(&self, id: &str) -> Result<Option<crate::JobRecord>> {
        self.job_store()?.read_job(id).await
    }

    /// The latest progress the handler of job `id` reported, decoded as `P`.
    pub async fn progress<P: serde::de::DeserializeOwned>(&self, id: &str) -> Result<Option<P>> {
        match self.job_state(id).await? {
            Some(record) => record.progress(),
            None => Ok(None),
        }
    }

    /// Waits, at most `timeout`, for the result of job `id` (published earlier, e.g. after an
    /// [`Error::ResultTimeout`]): as [`Publishing::await_result`] after its publish.
    pub async fn wait_result<R: serde::de::DeserializeOwned>(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<R> {
        crate::job::wait(self.job_store()?, id, timeout).await
    }

    /// Cancels message `id` of the queue `destination` wherever it is, and says what it did
    /// ([`CancelOutcome`](crate::CancelOutcome)): delayed, it is removed; running in any
    /// process, its handler is told ([`Context::cancelled`](crate::Context::cancelled)) and
    /// dropped if it has not finished within its subscription's
    /// [`cancel_grace`](crate::SubscribeOptions::cancel_grace); queued, it is settled as
    /// cancelled when claimed. A cancel and a settle of the same message race atomically: the
    /// one that reaches the broker first wins (a handler that acks after the cancel still
    /// settles as cancelled; a cancel after the ack finds nothing running). An awaited job
    /// cancelled fails its `await_result` with [`Error::Cancelled`].
    ///
    /// Safe to call again after an error (a lost reply): the broker records the cancel, so the
    /// second call answers what the first did, and cancels nothing twice.
    ///
    /// On Redis, `destination` is a list queue or a stream (a stream cancel holds for every
    /// consumer group), as its route says (`RedisBroker::route`; unrouted, a list). The route
    /// does not name a list's processing list: a list read with a processing list named other
    /// than the default `<key>.processing` is not found running from here; the operator's
    /// `cancel SUB --id ID`, which has the subscription's keys, finds it.
    pub async fn cancel(&self, destination: &str, id: &str) -> Result<crate::CancelOutcome> {
        let outcome = self.0.cancel(destination, id).await?;
        match self.0.jobs() {
            Some(store) => crate::cancel::with_job(store, id, outcome).await,
            None => Ok(outcome),
        }
    }

    /// Sends the signal `name` with `payload` to message `id` of `destination`, for its
    /// [`Context::wait_for`](crate::Context::wait_for): the payload is recorded in the
    /// message's step record and, when the message is parked waiting for it, the message is
    /// made due at once, in one script. A signal sent before the wait is kept until the wait
    /// reads it, or until the record's ttl ([`STEPS_TTL`](crate::steps::STEPS_TTL)). The
    /// first signal of a name wins: another answers [`Signalled::Already`](crate::Signalled).
    ///
    /// # Errors
    /// When `payload` does not serialize or is larger than a step records (1 MiB of JSON), the
    /// destination is not a list queue or a stream, the record holds the most steps, or Redis
    /// fails.
    pub async fn signal<T: serde::Serialize>(
        &self,
        destination: &str,
        id: &str,
        name: &str,
        payload: &T,
    ) -> Result<crate::Signalled> {
        let json = crate::job::encode(payload)?;
        if json.len() > crate::steps::MAX_STEP_BYTES {
            return Err(Error::Encode(format!(
                "signal `{name}`: its payload is {} bytes of JSON, more than a step records ({}); send a reference to the data instead",
                json.len(),
                crate::steps::MAX_STEP_BYTES
            )));
        }
        self.0.signal(destination, id, name, json).await
    }

    /// This broker's step store, or the error saying it has none.
    pub(crate) fn step_store(&self) -> Result<&dyn crate::StepStore> {
        self.0.steps().ok_or_else(crate::steps::unsupported)
    }

    /// This broker's job store, or the error saying it has none.
    pub(crate) fn job_store(&self) -> Result<&dyn crate::JobStore> {
        self.0.jobs().ok_or_else(crate::job::unsupported)
    }
}
