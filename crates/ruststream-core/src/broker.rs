//! The contract between the core and a broker: sources, receivers, settlers, publishing.
//!
//! The core owns the dispatch loop (concurrency, panics, retries, shutdown); a broker only moves
//! bytes: it claims up to `n` messages, settles a batch of them, and publishes.

use std::future::Future;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::{Backoff, DeliveryInfo, OutMessage, Publisher, Result, Settlement};

/// Options every subscription has, whatever its broker.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SubscribeOptions {
    /// Most handlers of this subscription running at once; the broker never claims more than
    /// `concurrency - in_flight` messages, so prefetch never runs ahead of handlers. A handled
    /// message leaves `in_flight` when its settle round trip starts, so up to `2 × concurrency`
    /// can be claimed and not yet settled (for a reliable list: in its processing list).
    pub concurrency: usize,
    /// Deliveries a message gets before it goes to the dead-letter list with reason `max-attempts`.
    pub max_attempts: u32,
    /// Delay before each retry.
    pub retry: Backoff,
    /// How long one handler call may run ([`Context::deadline`](crate::Context::deadline));
    /// past it the call is stopped (its future dropped) and the message retried, or once its
    /// attempts are spent, dead-lettered with reason `timeout`. `None` (the default): no limit.
    pub timeout: Option<std::time::Duration>,
    /// Most snoozes ([`HandlerOutcome::snooze`](crate::HandlerOutcome::snooze)) a message gets;
    /// the one after goes to the dead-letter list with reason `snoozed-too-often`.
    pub max_snoozes: u32,
    /// How long a handler has to finish once its message is cancelled (it sees
    /// [`Context::cancelled`](crate::Context::cancelled) resolve) before its future is dropped.
    pub cancel_grace: std::time::Duration,
    /// The largest payload, in bytes, the handler is given. A larger one goes to the
    /// dead-letter list with reason `too-large`, unread. `None` (the default): no limit.
    pub max_payload_bytes: Option<usize>,
}

/// The snoozes a message gets unless its source says otherwise (see `docs/decisions.md`,
/// "Snooze is a retry that keeps the attempt").
pub const DEFAULT_MAX_SNOOZES: u32 = 25;

impl Default for SubscribeOptions {
    /// 128 handlers at once, 10 attempts, [`Backoff::default`], no timeout,
    /// [`DEFAULT_MAX_SNOOZES`] snoozes, a cancel grace of
    /// [`DEFAULT_CANCEL_GRACE`](crate::cancel::DEFAULT_CANCEL_GRACE) (5 s), no payload limit.
    fn default() -> Self {
        Self {
            concurrency: 128,
            max_attempts: 10,
            retry: Backoff::default(),
            timeout: None,
            max_snoozes: DEFAULT_MAX_SNOOZES,
            cancel_grace: crate::cancel::DEFAULT_CANCEL_GRACE,
            max_payload_bytes: None,
        }
    }
}

/// How a channel appears in the AsyncAPI document.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelDoc {
    /// The key, as users name it (without the broker's prefix).
    pub address: String,
    /// `list`, `stream`, `pubsub`.
    pub transport: &'static str,
    /// Transport details (mode, processing list, group, ...), as JSON.
    pub bindings: serde_json::Value,
}

/// A broker's own description of a subscription source.
pub trait BrokerSource: Send + Sync + 'static {
    /// The key the source reads, as the user named it.
    fn key(&self) -> &str;
    /// The broker-agnostic options.
    fn options(&self) -> &SubscribeOptions;
    /// The channel, for the AsyncAPI document.
    fn describe(&self) -> ChannelDoc;
    /// What becomes of a retry (a handler's retry, retry_after, or a panic) of this source's
    /// messages; [`Retries::Redeliver`] by default.
    fn retries(&self) -> Retries {
        Retries::Redeliver
    }
}

/// What becomes of a retry of a source's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retries {
    /// The message is delivered again, attempt + 1 (lists that claim, streams).
    Redeliver,
    /// The source cannot deliver a message again: the retry goes to the dead-letter list with
    /// this reason (Pub/Sub).
    DeadLetter(&'static str),
    /// The message left the source before its handler ran, so a retry settles nothing: it is
    /// logged and counted as `ignored` (a simple list).
    Ignored,
}

/// A source expression a user writes (`RedisList::new("jobs").reliable()`), tied to its broker.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a subscription source",
    note = "use a source of a broker, such as `RedisList::new(\"key\")` or `RedisStream::new(\"key\").group(\"g\")`"
)]
pub trait Source: Send + 'static {
    /// The broker that reads this source.
    type Broker: Broker;
    /// Converts into the broker's source type.
    fn into_source(self) -> <Self::Broker as Broker>::Source;
}

/// One delivered message: what the handler needs, and the broker's token to settle it.
#[derive(Debug)]
pub struct Delivery<T> {
    /// Id, attempt, source and headers.
    pub info: DeliveryInfo,
    /// The encoded payload.
    pub payload: Bytes,
    /// What the broker needs to settle this message.
    pub token: T,
    /// Why the broker could not read the message's envelope (its headers or id), when it could
    /// not: the core then dead-letters it with reason `decode: <this>` without running the
    /// handler.
    pub unreadable: Option<String>,
}

/// Reads one subscription. It owns the connection it blocks on.
pub trait Receiver: Send + 'static {
    /// What the settler needs per message.
    type Token: Send + Sync + 'static;
    /// Settles batches; runs beside the receiver.
    type Settler: Settler<Token = Self::Token>;

    /// Claims up to `max` messages (`max >= 1`), waiting up to the source's block time when there
    /// are none. Returns early, possibly empty, once the stop token given at creation is cancelled.
    /// Messages it returns have been claimed and must be settled (or left to recovery).
    fn receive(
        &mut self,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Delivery<Self::Token>>>> + Send;

    /// The settler for messages of this receiver.
    fn settler(&self) -> Self::Settler;

    /// More receivers of the same subscription, which the dispatch loop reads beside this one
    /// with the same permits (on Redis, a stream subscription's other consumers of its group,
    /// each decoding its own replies); each settles what it delivered with its own settler.
    /// Taken once, when the loop starts; none by default.
    fn siblings(&mut self) -> Vec<Self>
    where
        Self: Sized,
    {
        Vec::new()
    }

    /// The ids of messages cancelled while they run, as the broker hears of them (every
    /// process of the subscription hears every cancel of its queue); taken once, when the
    /// dispatch loop starts. `None` (the default) when the source cannot be cancelled: then
    /// [`Context::cancelled`](crate::Context::cancelled) never resolves.
    fn cancel_signals(&mut self) -> Option<futures::stream::BoxStream<'static, String>> {
        None
    }

    /// A cheap check of whether this receiver's connection is up, for readiness probes (see
    /// [`crate::health`]); `None` (the default) when the receiver cannot tell, and then only
    /// failed receives count.
    fn probe(&self) -> Option<crate::Probe> {
        None
    }
}

/// Carries out settlements, many per round trip.
pub trait Settler: Send + Sync + 'static {
    /// The receiver's token.
    type Token: Send + Sync + 'static;
    /// Settles every message of the batch, atomically per message.
    fn settle(
        &self,
        batch: &[(Self::Token, Settlement)],
    ) -> impl Future<Output = Result<()>> + Send;

    /// Tells the settler that the message of `token` has a step record (see [`crate::steps`]):
    /// its settle removes the record when it acknowledges or dead-letters the message, and a
    /// park for a signal already recorded makes the message due at once. The default ignores
    /// it (the record then lives out its ttl).
    fn steps_recorded(&self, token: &mut Self::Token, note: crate::steps::StepsNote) {
        let _ = (token, note);
    }

    /// Where the entries of settles abandoned at shutdown stay, and how they come back, for the
    /// log line `N settles abandoned at shutdown; their entries stay <this>` (e.g. "in
    /// `{jobs}.processing` and come back after min_idle").
    fn unsettled(&self) -> String {
        "claimed, for the broker's recovery".to_owned()
    }
}

/// A message broker: connects, validates its subscriptions, reads and publishes.
pub trait Broker: Send + Sync + Sized + 'static {
    /// What a subscription reads.
    type Source: BrokerSource;
    /// How a reply is published (`list::Publish` on Redis).
    type Policy: Clone + Send + Sync + 'static;
    /// Reads one subscription.
    type Receiver: Receiver;

    /// Checks the configuration of every subscription before anything connects: the error says
    /// what to change.
    fn validate(&self, sources: &[&Self::Source]) -> Result<()>;

    /// Connects, checks what needs the server (credentials, cluster slots), and prepares the
    /// sources (consumer groups, scripts).
    fn connect(&self, sources: &[&Self::Source]) -> impl Future<Output = Result<()>> + Send;

    /// Prepares the server for `sources` on a broker already connected (consumer groups): what
    /// [`connect`](Self::connect) does for each source once connected, for a subscription added
    /// to a running app (`RunningApp::include`), after [`validate`](Self::validate) passed. It
    /// may be called again for the same source after a failure.
    fn prepare(&self, sources: &[&Self::Source]) -> impl Future<Output = Result<()>> + Send;

    /// Opens a receiver for a source, on a connection of its own.
    fn receiver(
        &self,
        source: &Self::Source,
        stop: CancellationToken,
    ) -> impl Future<Output = Result<Self::Receiver>> + Send;

    /// A publisher on this broker, with each destination's default policy.
    fn publisher(&self) -> Publisher;

    /// The transport (`list`, `stream`, `pubsub`, as in [`ChannelDoc::transport`]) a reply to
    /// `destination` goes out on, given the policy `.out_reply(..)` set, if any: for the AsyncAPI
    /// document. `None` when the broker cannot tell; the document then takes the transport of a
    /// subscription reading that address, or `list`.
    fn reply_transport(
        &self,
        destination: Option<&str>,
        policy: Option<&Self::Policy>,
    ) -> Option<&'static str> {
        let _ = (destination, policy);
        None
    }

    /// Publishes with an explicit policy (a reply's `.out_reply(..)`).
    fn publish_with(
        &self,
        policy: &Self::Policy,
        messages: Vec<OutMessage>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Where this broker keeps periodic jobs' state (last fired ticks, the registry), shared by
    /// every instance; `None` (the default) when it cannot run periodic jobs, and then an app
    /// that mounts one is refused at startup.
    fn periodic_store(&self) -> Option<std::sync::Arc<dyn crate::periodic::PeriodicStore>> {
        None
    }

    /// Where the subscription on `source` keeps its history (`crate::history`), written by
    /// each subscription once per interval; `None` (the default): no history, nothing counted
    /// beyond the in-memory tally.
    fn history(
        &self,
        source: &Self::Source,
    ) -> Option<std::sync::Arc<dyn crate::history::HistorySink>> {
        let _ = source;
        None
    }

    /// Closes every connection.
    fn close(&self) -> impl Future<Output = ()> + Send;

    /// Whether the broker's shared connections (those that publish and settle) are up, for
    /// readiness probes: `Err` says, in a short sentence, what is not. It must not block or do
    /// I/O. `Ok(())` by default.
    fn ready(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}
