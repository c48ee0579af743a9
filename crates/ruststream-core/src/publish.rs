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

use crate::{Error, Headers, MessageType, Result};

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

    /// Publishes already encoded messages. With the `otel` feature, in a producer span whose
    /// trace context goes into each message's headers (see [`crate::otel`]).
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
}

/// A publish being built; finish it with [`publish`](Self::publish).
#[must_use = "a publish does nothing until `.publish().await`"]
pub struct PublishBuilder<'a, T> {
    publisher: &'a Publisher,
    values: &'a [T],
    opts: Options,
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
            Sending::Built(_) | Sending::Done => Poll::Ready(Err(Error::Broker(
                "publish polled after it finished".into(),
            ))),
        }
    }
}

impl<T> fmt::Debug for Publishing<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Publishing")
    }
}
