//! Publishing: the broker-agnostic [`Publisher`] handle and its builders.
//!
//! A broker implements [`PublishBackend`]; users reach it through `broker.publisher()`, through
//! [`Context::publisher`](crate::Context::publisher) inside a handler, and through replies.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::{Durability, Error, Headers, MessageType, Result};

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
            Err(Error::config(
                "this broker cannot cancel messages: use a broker that does (RedisBroker)",
            ))
        })
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
        PublishBuilder {
            publisher: self,
            values: std::slice::from_ref(value),
            opts: Options::default(),
        }
    }

    /// Starts a publish of many values in one round trip: `publisher.messages(&jobs).to("jobs")`.
    pub fn messages<'a, T: MessageType>(&'a self, values: &'a [T]) -> PublishBuilder<'a, T> {
        PublishBuilder {
            publisher: self,
            values,
            opts: Options::default(),
        }
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

#[derive(Default)]
struct Options {
    to: Option<String>,
    headers: Headers,
    id: Option<String>,
    due: Option<Due>,
    partition_key: Option<String>,
    unique_for: Option<Duration>,
    priority: u8,
    durable: Option<Durability>,
}

/// A publish being built; finish it with [`publish`](Self::publish).
#[must_use = "a publish does nothing until `.publish().await`"]
pub struct PublishBuilder<'a, T> {
    publisher: &'a Publisher,
    values: &'a [T],
    opts: Options,
}

impl<T> std::fmt::Debug for PublishBuilder<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishBuilder")
            .field("messages", &self.values.len())
            .finish_non_exhaustive()
    }
}

impl<'a, T: MessageType> PublishBuilder<'a, T> {
    /// The destination key; without it the type's outgoing name is used.
    pub fn to(mut self, destination: impl Into<String>) -> Self {
        self.opts.to = Some(destination.into());
        self
    }

    /// Adds a header; handlers read it from their `Context`.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.opts.headers.insert(name.into(), value.into());
        self
    }

    /// Adds headers.
    pub fn headers<K: Into<String>, V: Into<String>>(
        mut self,
        headers: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.opts
            .headers
            .extend(headers.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Sets the message id (only meaningful for a single message).
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.opts.id = Some(id.into());
        self
    }

    /// On a destination spread over partitions (`RedisList::new(k).partitions(n)`), sends every
    /// message with this key to the same partition, so one key's messages stay in order; without
    /// it messages are spread round robin. Ignored by a destination without partitions.
    pub fn partition_key(mut self, key: impl Into<String>) -> Self {
        self.opts.partition_key = Some(key.into());
        self
    }

    /// Makes the publish unique within `window`: a message whose [`id`](Self::id) was published
    /// to the same destination less than `window` ago is not enqueued, and the publish says so
    /// ([`Enqueued::is_enqueued`]). The window holds across every process publishing to the
    /// destination (it is kept in Redis). Needs `.id(..)`; refused without one.
    pub fn unique_for(mut self, window: Duration) -> Self {
        self.opts.unique_for = Some(window);
        self
    }

    /// On a queue with priority levels (`RedisList::new(k).priorities(n)`), the level: `0` (the
    /// default) is the lowest, `n - 1` the highest; readers take from the highest non-empty
    /// level first. A level the destination does not have is refused.
    pub fn priority(mut self, level: u8) -> Self {
        self.opts.priority = level;
        self
    }

    /// Puts the message in the group `group` (a tenant, a customer) of a queue read with fair
    /// groups (`RedisList::groups`): readers take round robin over the groups with waiting
    /// messages, so one group's backlog does not delay another's. The group travels in the
    /// header `rs.group` (handlers see it there), which every way back to the queue (a retry,
    /// recovery, a delayed message, a requeued dead letter) reads to put the message back onto
    /// its own group. On a queue without groups it is only that header.
    pub fn group(self, group: impl Into<String>) -> Self {
        self.header(GROUP_HEADER, group)
    }

    /// Makes the publish durable: it returns `Ok` only once `replicas` replicas of the server
    /// acknowledged its messages, waiting at most `timeout`; fewer is
    /// [`Error::NotDurable`], naming how many did. On Redis this is `WAIT replicas timeout` on
    /// the connection that wrote (and `WAITAOF` on a server that has it, Redis 7.2 and later,
    /// when it runs with `appendonly yes`). A replica that had the write may still not be the
    /// one promoted in a failover: see the README's *Durable publishes*. A retry after
    /// `NotDurable` enqueues the message again unless it has an [`id`](Self::id) and a
    /// [`unique_for`](Self::unique_for) window.
    pub fn durable(mut self, replicas: u32, timeout: Duration) -> Self {
        self.opts.durable = Some(Durability::new(replicas, timeout));
        self
    }

    /// Delivers the message once `delay` has passed.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.opts.due = Some(Due::In(delay));
        self
    }

    /// Delivers the message at `when`.
    pub fn at(mut self, when: SystemTime) -> Self {
        self.opts.due = Some(Due::At(when));
        self
    }

    /// The publish, ready to send: `.publish().await?` returns what was [`Enqueued`].
    pub fn publish(self) -> Publishing<'a, T> {
        Publishing {
            state: Sending::Built(self),
        }
    }

    fn encode(&self) -> Result<Vec<OutMessage>> {
        if self.opts.unique_for.is_some() && self.opts.id.is_none() {
            return Err(Error::config(
                "publish: `.unique_for(..)` needs the message's id: add `.id(..)`",
            ));
        }
        self.values
            .iter()
            .map(|value| {
                let destination: Cow<'_, str> = match &self.opts.to {
                    Some(to) => Cow::Borrowed(to),
                    None => value.destination()?.ok_or(Error::NoDestination {
                        type_name: std::any::type_name::<T>(),
                    })?,
                };
                Ok(OutMessage {
                    destination: destination.into_owned(),
                    payload: value.encode()?,
                    headers: self.opts.headers.clone(),
                    id: self.opts.id.clone(),
                    due: self.opts.due,
                    partition_key: self.opts.partition_key.clone(),
                    unique_for: self.opts.unique_for,
                    priority: self.opts.priority,
                    durable: self.opts.durable,
                })
            })
            .collect()
    }
}

/// A publish ready to send (a future): `.await` it, and it returns what was [`Enqueued`].
#[must_use = "a publish does nothing until `.publish().await`"]
pub struct Publishing<'a, T> {
    state: Sending<'a, T>,
}

enum Sending<'a, T> {
    /// Not polled yet: the builder, so methods can still change what is sent.
    Built(PublishBuilder<'a, T>),
    /// Polled: the send in flight.
    Sent(BoxFuture<'a, Result<Enqueued>>),
    /// Finished (or being polled).
    Done,
}

impl<T: MessageType> Future for Publishing<'_, T> {
    type Output = Result<Enqueued>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if matches!(this.state, Sending::Built(_))
            && let Sending::Built(builder) = std::mem::replace(&mut this.state, Sending::Done)
        {
            let encoded = builder.encode();
            let publisher = builder.publisher;
            this.state = Sending::Sent(Box::pin(async move { publisher.send(encoded?).await }));
        }
        match &mut this.state {
            Sending::Sent(fut) => {
                let out = fut.as_mut().poll(cx);
                if out.is_ready() {
                    this.state = Sending::Done;
                }
                out
            }
            Sending::Built(_) | Sending::Done => Poll::Ready(Err(Error::broker(
                crate::ErrorKind::Other,
                "publish polled after it finished",
            ))),
        }
    }
}

impl<T> fmt::Debug for Publishing<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Publishing")
    }
}

impl<T: MessageType> Publishing<'_, T> {
    /// Publishes the message and waits, at most `timeout`, for the result its handler sets
    /// with [`Context::set_result`](crate::Context::set_result), decoded as `R` (JSON). The
    /// handler may run in any process on the same broker.
    ///
    /// The message gets an id (a UUID v7) unless `.id(..)` gave one; it is the job's id. When
    /// the message ends in the dead-letter list (dropped, out of attempts, undecodable), this
    /// fails at once with [`Error::JobFailed`] and the reason; when it is cancelled
    /// ([`Publisher::cancel`]), with [`Error::Cancelled`]; with no result in time, with
    /// [`Error::ResultTimeout`], which names the job so that
    /// [`Publisher::job_state`] can read it later. A publish that `.unique_for(..)` finds a
    /// duplicate of awaits the result of the job already enqueued under that id (whose failure
    /// is recorded only if it too was published with `await_result`). One message only:
    /// `messages(..)` with more than one value is refused.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use ruststream_core::{Publisher, Result};
    /// # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
    /// # struct Resize { image: String }
    /// # ruststream_core::outgoing!(Resize);
    /// # async fn f(publisher: &Publisher) -> Result<()> {
    /// let url: String = publisher
    ///     .message(&Resize { image: "a.png".into() })
    ///     .to("{resize}")
    ///     .publish()
    ///     .await_result(Duration::from_secs(30))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn await_result<R: serde::de::DeserializeOwned>(
        self,
        timeout: Duration,
    ) -> Result<R> {
        let Sending::Built(mut builder) = self.state else {
            return Err(Error::broker(
                crate::ErrorKind::Other,
                "publish polled after it finished",
            ));
        };
        if builder.values.len() != 1 {
            return Err(Error::config(
                "await_result: a publish of one message awaits one result; publish the values one at a time",
            ));
        }
        let publisher = builder.publisher;
        // Fails before publishing on a broker that keeps no results.
        let store = publisher.job_store()?;
        let id = builder
            .opts
            .id
            .get_or_insert_with(|| uuid::Uuid::now_v7().to_string())
            .clone();
        builder
            .opts
            .headers
            .insert(crate::job::RESULT_HEADER.to_owned(), "1".to_owned());
        publisher.send(builder.encode()?).await?;
        crate::job::wait(store, &id, timeout).await
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

    /// This broker's job store, or the error saying it has none.
    pub(crate) fn job_store(&self) -> Result<&dyn crate::JobStore> {
        self.0.jobs().ok_or_else(crate::job::unsupported)
    }
}
