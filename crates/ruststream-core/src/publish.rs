//! Publishing: the broker-agnostic [`Publisher`] handle and its builders.
//!
//! A broker implements [`PublishBackend`]; users reach it through `broker.publisher()`, through
//! [`Context::publisher`](crate::Context::publisher) inside a handler, and through replies.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
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
        }
    }
}

/// What a broker implements to publish. One call may carry many messages: send them in as few
/// round trips as the broker can.
pub trait PublishBackend: Send + Sync + 'static {
    /// Publishes every message, or fails.
    fn publish(&self, messages: Vec<OutMessage>) -> BoxFuture<'_, Result<()>>;
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
    pub async fn send(&self, messages: Vec<OutMessage>) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        #[cfg(feature = "otel")]
        let (messages, span) = crate::otel::Producer::start(messages);
        let result = self.0.publish(messages).await;
        #[cfg(feature = "otel")]
        span.end(&result);
        result
    }
}

#[derive(Default)]
struct Options {
    to: Option<String>,
    headers: Headers,
    id: Option<String>,
    due: Option<Due>,
    partition_key: Option<String>,
}

/// A publish being built; finish it with [`publish`](Self::publish).
#[must_use = "a publish does nothing until `.publish().await`"]
pub struct PublishBuilder<'a, T> {
    publisher: &'a Publisher,
    values: &'a [T],
    opts: Options,
}

impl<T: MessageType> PublishBuilder<'_, T> {
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

    /// Encodes and publishes.
    pub async fn publish(self) -> Result<()> {
        let messages = self.encode()?;
        self.publisher.send(messages).await
    }

    fn encode(&self) -> Result<Vec<OutMessage>> {
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
                })
            })
            .collect()
    }
}
