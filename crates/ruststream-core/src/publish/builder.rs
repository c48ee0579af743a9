//! A publish being built ([`PublishBuilder`]: destination, headers, id, delay, priority,
//! uniqueness, durability) and sent ([`Publishing`], the future `.publish()` returns, which can
//! also await the job's result). Sends nothing to a broker itself: it encodes the values and
//! hands them to [`Publisher::send`].

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;

use super::{Due, Enqueued, GROUP_HEADER, OutMessage, Publisher};
use crate::{ConfigError, Durability, Error, Headers, MessageType, Result};

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
    /// A publish of `values` through `publisher`, with no option set.
    pub(super) fn new(publisher: &'a Publisher, values: &'a [T]) -> Self {
        Self {
            publisher,
            values,
            opts: Options::default(),
        }
    }

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
    /// one promoted in a failover: see the guide's "Durable publishes and failovers". A retry after
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
            return Err(ConfigError::new(
                ".unique_for(..)",
                "a publish unique within a window needs the message's id",
                "add `.id(..)`",
            )
            .into());
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
            return Err(ConfigError::new(
                "await_result",
                "a publish of one message awaits one result, and this publish has several",
                "publish the values one at a time",
            )
            .into());
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
