//! Subscribers: a source bound to a handler, built by hand with [`subscriber`] or by
//! `#[subscriber]`, and mounted on a broker with `b.include(..)`.

use std::marker::PhantomData;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::erased::{ErasedHandler, Handled, Handler};
use crate::{
    Broker, BrokerSource, ConfigError, Context, DeliveryInfo, Error, Handle, MessageType,
    OutMessage, Publisher, Source,
};

struct Typed<H, In, Out> {
    handler: H,
    reply_to: Option<String>,
    _types: PhantomData<fn(In) -> Out>,
}

impl<H: Handle<In, ()>, In: MessageType> ErasedHandler for Typed<H, In, ()> {
    fn call<'a>(
        &'a self,
        info: &'a DeliveryInfo,
        payload: &'a [u8],
        publisher: &'a Publisher,
        deadline: Option<tokio::time::Instant>,
        stop: &'a tokio_util::sync::CancellationToken,
    ) -> BoxFuture<'a, Handled> {
        Box::pin(async move {
            let msg = match In::decode(payload) {
                Ok(m) => m,
                Err(e) => return Handled::Failed(e),
            };
            let mut ctx = Context::new(info, publisher)
                .with_deadline(deadline)
                .with_stop(stop);
            match self.handler.handle(&msg, &(), &mut ctx).await {
                Ok(()) => Handled::Ack(None),
                Err(outcome) => Handled::Outcome(outcome),
            }
        })
    }
}

/// The reply flavour: `Out` is published to the reply destination before the input is acked.
struct Replying<H, In, Out>(Typed<H, In, Out>);

impl<H: Handle<In, Out>, In: MessageType, Out: MessageType> ErasedHandler for Replying<H, In, Out> {
    fn call<'a>(
        &'a self,
        info: &'a DeliveryInfo,
        payload: &'a [u8],
        publisher: &'a Publisher,
        deadline: Option<tokio::time::Instant>,
        stop: &'a tokio_util::sync::CancellationToken,
    ) -> BoxFuture<'a, Handled> {
        Box::pin(async move {
            let msg = match In::decode(payload) {
                Ok(m) => m,
                Err(e) => return Handled::Failed(e),
            };
            let mut ctx = Context::new(info, publisher)
                .with_deadline(deadline)
                .with_stop(stop);
            let out = match self.0.handler.handle(&msg, &(), &mut ctx).await {
                Ok(out) => out,
                Err(outcome) => return Handled::Outcome(outcome),
            };
            match encode_reply(&out, self.0.reply_to.as_deref()) {
                Ok(m) => Handled::Ack(Some(m)),
                Err(e) => Handled::Failed(e),
            }
        })
    }
}

fn encode_reply<Out: MessageType>(out: &Out, to: Option<&str>) -> Result<OutMessage, Error> {
    let destination = match to {
        Some(to) => to.to_owned(),
        None => out
            .destination()?
            .ok_or(Error::NoDestination {
                type_name: std::any::type_name::<Out>(),
            })?
            .into_owned(),
    };
    Ok(OutMessage::new(destination, out.encode()?))
}

/// A message type as the AsyncAPI document shows it.
#[derive(Debug, Clone, Copy)]
pub struct MessageDoc {
    /// The Rust type name.
    pub type_name: &'static str,
    /// The payload's JSON schema.
    pub schema: fn() -> schemars::Schema,
    /// The content type.
    pub content_type: &'static str,
    /// The type's own destination template, if any.
    pub name: Option<&'static str>,
}

impl MessageDoc {
    pub(crate) fn of<T: MessageType>() -> Self {
        Self {
            type_name: std::any::type_name::<T>(),
            schema: T::schema,
            content_type: T::content_type(),
            name: T::NAME,
        }
    }

    /// The type name without its module path.
    pub fn short_name(&self) -> &'static str {
        self.type_name.rsplit("::").next().unwrap_or(self.type_name)
    }
}

/// A source bound to a handler, ready to mount with `b.include(..)`.
pub struct Subscriber<B: Broker> {
    pub(crate) source: B::Source,
    pub(crate) handler: Handler,
    pub(crate) input: MessageDoc,
    pub(crate) reply: Option<Reply<B>>,
    /// Whether its handler uses durable steps (see [`SubscriberBuilder::uses_steps`]).
    pub(crate) uses_steps: bool,
}

impl<B: Broker> std::fmt::Debug for Subscriber<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber").finish_non_exhaustive()
    }
}

pub(crate) struct Reply<B: Broker> {
    pub(crate) to: Option<String>,
    pub(crate) message: MessageDoc,
    pub(crate) policy: Option<B::Policy>,
}

impl<B: Broker> Subscriber<B> {
    /// Sets how replies are published, e.g. `list::Publish::new().ttl(..)` on Redis. Without it,
    /// replies use the default policy of the destination's transport.
    pub fn out_reply(&mut self, policy: impl Into<B::Policy>) -> &mut Self {
        if let Some(reply) = &mut self.reply {
            reply.policy = Some(policy.into());
        } else {
            tracing::warn!(
                source = self.source.key(),
                "out_reply on a subscriber without a reply: ignored; add `.reply()` to the subscriber"
            );
        }
        self
    }

    /// The source this subscriber reads.
    pub fn source(&self) -> &B::Source {
        &self.source
    }

    /// The reply destination, when the subscriber replies to a fixed one.
    pub fn reply_to(&self) -> Option<&str> {
        self.reply.as_ref().and_then(|r| r.to.as_deref())
    }

    /// Refuses a reply with nowhere to go (no `.to(..)` and no outgoing name on its type), a
    /// batch that does not fit the subscription's concurrency, and steps on a source that cannot
    /// redeliver.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if let Handler::Batch(_, batch) = &self.handler {
            batch.validate(self.source.key(), self.source.options().concurrency.max(1))?;
        }
        if self.uses_steps {
            crate::steps::check_source(self.source.key(), self.source.retries())?;
        }
        match &self.reply {
            Some(reply) if reply.to.is_none() && reply.message.name.is_none() => {
                Err(ConfigError::new(
                    "reply",
                    format!(
                        "the reply `{}` has no destination: neither `.to(..)` nor an outgoing name on its type",
                        reply.message.short_name()
                    ),
                    "add `.to(\"key\")` (or `reply(\"key\")` in #[subscriber]), or `#[outgoing(name = \"...\")]` on the type",
                )
                .on(self.source.key())
                .into())
            }
            _ => Ok(()),
        }
    }

    /// This subscriber as the AsyncAPI document shows it, on `broker`.
    pub(crate) fn doc(&self, broker: &B) -> crate::asyncapi::OperationDoc {
        crate::asyncapi::OperationDoc {
            channel: self.source.describe(),
            input: self.input,
            reply: self.reply.as_ref().map(|r| (r.to.clone(), r.message)),
            reply_transport: self
                .reply
                .as_ref()
                .and_then(|r| broker.reply_transport(r.to.as_deref(), r.policy.as_ref())),
        }
    }
}

/// Anything `b.include(..)` mounts: a [`Subscriber`], or the item `#[subscriber]` generates.
pub trait IntoSubscriber {
    /// The broker the subscriber runs on.
    type Broker: Broker;
    /// Builds the subscriber.
    fn into_subscriber(self) -> Subscriber<Self::Broker>;
}

impl<B: Broker> IntoSubscriber for Subscriber<B> {
    type Broker = B;
    fn into_subscriber(self) -> Subscriber<B> {
        self
    }
}

/// Starts a hand-written subscriber: `subscriber(RedisList::new("jobs"), Render).build()`.
pub fn subscriber<S: Source, H>(source: S, handler: H) -> SubscriberBuilder<S, H> {
    SubscriberBuilder {
        source,
        handler,
        uses_steps: false,
    }
}

/// A subscriber being built.
#[must_use = "finish with `.build()`"]
pub struct SubscriberBuilder<S, H> {
    pub(crate) source: S,
    pub(crate) handler: H,
    uses_steps: bool,
}

impl<S: std::fmt::Debug, H> std::fmt::Debug for SubscriberBuilder<S, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriberBuilder")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl<S: Source, H> SubscriberBuilder<S, H> {
    /// Says that the handler uses durable steps (`ctx.step`, `ctx.sleep`, `ctx.wait_for`,
    /// `ctx.checkpoint`, `ctx.resume_from`; see [`crate::steps`]). The app then refuses to start
    /// when the source cannot redeliver (a simple list, Pub/Sub), instead of the first step
    /// failing when a message comes. `#[subscriber]` calls it when the function's body calls one
    /// of them on its context.
    pub fn uses_steps(mut self) -> Self {
        self.uses_steps = true;
        self
    }

    /// A subscriber whose handler acknowledges with no reply.
    pub fn build<In: MessageType>(self) -> Subscriber<S::Broker>
    where
        H: Handle<In, ()>,
    {
        Subscriber {
            source: self.source.into_source(),
            handler: Handler::One(Arc::new(Typed {
                handler: self.handler,
                reply_to: None,
                _types: PhantomData::<fn(In)>,
            })),
            input: MessageDoc::of::<In>(),
            reply: None,
            uses_steps: self.uses_steps,
        }
    }

    /// The handler's return value is published as a reply: to `.to(..)`, or to its type's
    /// outgoing name.
    pub fn reply(self) -> ReplyBuilder<S, H> {
        ReplyBuilder {
            inner: self,
            to: None,
        }
    }
}

/// A replying subscriber being built.
#[must_use = "finish with `.build()`"]
pub struct ReplyBuilder<S, H> {
    inner: SubscriberBuilder<S, H>,
    to: Option<String>,
}

impl<S: std::fmt::Debug, H> std::fmt::Debug for ReplyBuilder<S, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyBuilder")
            .field("inner", &self.inner)
            .field("to", &self.to)
            .finish()
    }
}

impl<S: Source, H> ReplyBuilder<S, H> {
    /// The key replies go to (overrides the reply type's outgoing name).
    pub fn to(mut self, destination: impl Into<String>) -> Self {
        self.to = Some(destination.into());
        self
    }

    /// Builds the subscriber.
    pub fn build<In: MessageType, Out: MessageType>(self) -> Subscriber<S::Broker>
    where
        H: Handle<In, Out>,
    {
        let typed = Typed {
            handler: self.inner.handler,
            reply_to: self.to.clone(),
            _types: PhantomData::<fn(In) -> Out>,
        };
        Subscriber {
            source: self.inner.source.into_source(),
            handler: Handler::One(Arc::new(Replying(typed))),
            input: MessageDoc::of::<In>(),
            reply: Some(Reply {
                to: self.to,
                message: MessageDoc::of::<Out>(),
                policy: None,
            }),
            uses_steps: self.inner.uses_steps,
        }
    }
}
