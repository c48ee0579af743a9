//! The contract each transport (`list`, `stream`, `pubsub`) fulfils, and the types the core's
//! dispatch loop sees: [`RedisSource`] (a subscription's source, any transport),
//! [`RedisReceiver`] (reads it), [`RedisSettler`] (settles what it read) and [`Token`] (what a
//! settle needs of one delivery). Sends no command itself.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use fred::types::Value;
use futures::future::BoxFuture;
use ruststream_core::{
    BrokerSource, ChannelDoc, Delivery, DeliveryInfo, Receiver, Result, Retries, Settlement,
    Settler, SubscribeOptions,
};
use tokio_util::sync::CancellationToken;

use crate::conn::Connections;
use crate::frame::{Frame, encode_parts};
use crate::keys::{KeySpace, SourceKeys};
use crate::options::SourceOptions;
use crate::pause::Gate;
use crate::policy::PublishPolicy;

/// Equality across transport types: `other` equals `self` when it is a `Self` that compares
/// equal. Every `PartialEq` transport has it.
pub(crate) trait DynEq {
    fn same_as(&self, other: &dyn Any) -> bool;
}

impl<T: PartialEq + Any> DynEq for T {
    fn same_as(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>() == Some(self)
    }
}

/// What one transport does for a subscription: check it, prepare it, open its receiver.
pub(crate) trait Transport: Any + DynEq + fmt::Debug + Send + Sync {
    /// The key (or channel) the user named.
    fn key(&self) -> &str;
    /// The options every transport has.
    fn options(&self) -> &SourceOptions;
    /// The channel, for the AsyncAPI document.
    fn describe(&self) -> ChannelDoc;
    /// Every key of the subscription, by full name, in `keys`.
    fn source_keys(&self, keys: &KeySpace) -> SourceKeys;
    /// What becomes of a retry of this transport's messages.
    fn retries(&self) -> Retries {
        Retries::Redeliver
    }
    /// Checks the configuration, and on a cluster the slot rule of the keys it uses together;
    /// the error says what to change.
    fn validate(&self, keys: &KeySpace) -> Result<()>;
    /// How the app's publisher sends to this key by default, when the transport says.
    fn route(&self) -> Option<PublishPolicy> {
        None
    }
    /// On a source spread over partitions (`crate::partition`), one transport per partition,
    /// each a whole queue of its own; empty otherwise.
    fn partitions(&self) -> Vec<Box<dyn Transport>> {
        Vec::new()
    }
    /// With partitions and a whole-queue rate limit: the logical queue's limiter, which the
    /// partitions' reader reserves passes from (`crate::claim::Reserve`); the partitions'
    /// own claims have no rate gate.
    fn limiter(&self, _space: &KeySpace) -> Option<crate::limit::Limiter> {
        None
    }
    /// Prepares the server once the broker is connected (consumer groups, scripts).
    fn prepare<'a>(&'a self, conns: &'a Connections) -> BoxFuture<'a, Result<()>>;
    /// Opens the receiver, on a connection of its own.
    fn open<'a>(
        &'a self,
        conns: &'a Connections,
        stop: CancellationToken,
    ) -> BoxFuture<'a, Result<RedisReceiver>>;
}

/// What every list or stream reader runs beside its reads: the queue gauges of its keys, and the
/// gate that holds its reads while an operator has paused it.
pub(crate) async fn watch_source(
    conns: &Connections,
    source: &dyn Transport,
    pool: &fred::clients::Pool,
    stop: &CancellationToken,
) -> Result<Option<Gate>> {
    let keys = source.source_keys(&conns.keys);
    crate::gauges::spawn(pool.clone(), keys.clone(), stop.clone());
    let Some(key) = keys.paused else {
        return Ok(None);
    };
    let wake = conns.notifier(&key).await?;
    let gate = Gate::open(&conns.pauses, pool.clone(), wake, key, stop.clone()).await?;
    Ok(Some(gate))
}

/// A subscription's source on Redis: a [`RedisList`](crate::RedisList),
/// [`RedisStream`](crate::RedisStream) or [`RedisChannel`](crate::RedisChannel), made with
/// `RedisSource::from(..)` or by the `#[subscriber]` macro.
#[derive(Clone)]
pub struct RedisSource(Arc<dyn Transport>);

impl RedisSource {
    pub(crate) fn new(transport: impl Transport) -> Self {
        Self(Arc::new(transport))
    }

    pub(crate) fn transport(&self) -> &dyn Transport {
        &*self.0
    }
}

impl fmt::Debug for RedisSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for RedisSource {
    fn eq(&self, other: &Self) -> bool {
        let other: &dyn Any = &*other.0;
        self.0.same_as(other)
    }
}

impl BrokerSource for RedisSource {
    fn key(&self) -> &str {
        self.0.key()
    }

    fn options(&self) -> &SubscribeOptions {
        &self.0.options().core
    }

    fn describe(&self) -> ChannelDoc {
        self.0.describe()
    }

    fn retries(&self) -> Retries {
        self.0.retries()
    }
}

/// What a settle needs of one delivered entry.
#[derive(Debug, Clone)]
pub struct Token {
    /// The list value as claimed (for `LREM`), the stream entry id, or the Pub/Sub message.
    pub(crate) raw: Bytes,
    /// The decoded entry, its id filled in.
    pub(crate) frame: Frame,
    /// The claim's member in the recovery set, when there is one.
    pub(crate) member: Option<Bytes>,
    /// The claim's sequence number of its reader, when it has a recovery-set member.
    pub(crate) claim: Option<u64>,
    /// The partition it was read from, on a source with partitions (`crate::partition`).
    pub(crate) partition: usize,
}

impl Token {
    /// The frame to store as a dead letter: the entry with a `reason` header.
    pub(crate) fn dead_frame(&self, reason: &str) -> Bytes {
        let mut headers = self.frame.headers.clone();
        headers.insert(crate::frame::REASON_HEADER.to_owned(), reason.to_owned());
        encode_parts(
            &self.frame.id,
            self.frame.attempt,
            &headers,
            &self.frame.payload,
        )
    }

    /// The frame of the entry's next delivery: its attempt raised by one.
    pub(crate) fn retry_frame(&self) -> Bytes {
        encode_parts(
            &self.frame.id,
            self.frame.attempt.saturating_add(1),
            &self.frame.headers,
            &self.frame.payload,
        )
    }
}

/// A delivery of `frame` (a missing id is made up) from `source`; `raw` is what settling needs.
pub(crate) fn delivery(source: Arc<str>, raw: Bytes, mut frame: Frame) -> Delivery<Token> {
    if frame.id.is_empty() {
        frame.id = crate::frame::new_id();
    }
    Delivery {
        info: DeliveryInfo::new(
            frame.id.clone(),
            frame.attempt,
            source,
            frame.headers.clone(),
        ),
        payload: frame.payload.clone(),
        token: Token {
            raw,
            frame,
            member: None,
            claim: None,
            partition: 0,
        },
        unreadable: None,
    }
}

/// A delivery of the list value `raw`: its frame, or when the frame cannot be read, a delivery
/// the core dead-letters with the reason, whose dead letter keeps all of `raw` as its payload.
pub(crate) fn list_delivery(source: Arc<str>, raw: Bytes) -> Delivery<Token> {
    match Frame::try_decode(raw.clone()) {
        Ok(frame) => delivery(source, raw, frame),
        Err(e) => {
            let whole = Frame {
                id: String::new(),
                attempt: Frame::attempt_of(&raw),
                headers: ruststream_core::Headers::new(),
                payload: raw.clone(),
            };
            unreadable(delivery(source, raw, whole), &e)
        }
    }
}

/// `d`, marked for the core to dead-letter with reason `decode: <why>`.
pub(crate) fn unreadable(mut d: Delivery<Token>, why: &impl ToString) -> Delivery<Token> {
    d.unreadable = Some(why.to_string());
    d
}

/// The bytes of a reply value, when it has some.
pub(crate) fn value_bytes(v: Value) -> Option<Bytes> {
    match v {
        Value::Bytes(b) => Some(b),
        Value::String(s) => Some(s.into_inner()),
        Value::Integer(i) => Some(Bytes::from(i.to_string())),
        Value::Double(f) => Some(Bytes::from(f.to_string())),
        _ => None,
    }
}

/// One transport's reading of one subscription.
pub(crate) trait Receive: Send + 'static {
    /// Claims up to `max` deliveries (see [`Receiver::receive`]). Once `hurry` is cancelled it
    /// no longer waits for entries: a blocking read in progress is interrupted and what it got
    /// is returned (a partitioned reader's other partitions found some).
    fn receive<'a>(
        &'a mut self,
        max: usize,
        hurry: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Vec<Delivery<Token>>>>;
    /// The settler of what this receiver delivers.
    fn settler(&self) -> RedisSettler;
    /// Whether its connection is up (see [`Receiver::probe`]).
    fn probe(&self) -> Option<ruststream_core::Probe>;
}

/// One transport's settling of one subscription.
pub(crate) trait Settle: Send + Sync + 'static {
    /// Settles a batch in one round trip where the transport can.
    fn settle<'a>(&'a self, batch: &'a [(Token, Settlement)]) -> BoxFuture<'a, Result<()>>;
    /// Where the entries of abandoned settles stay (see [`Settler::unsettled`]).
    fn unsettled(&self) -> String;
}

/// The `hurry` of a read that no one hurries.
static NEVER: std::sync::LazyLock<CancellationToken> =
    std::sync::LazyLock::new(CancellationToken::new);

/// The receiver of one Redis subscription, whatever its transport.
pub struct RedisReceiver {
    receive: Box<dyn Receive>,
    /// Holds reads while an operator has paused the subscription.
    gate: Option<Gate>,
}

impl std::fmt::Debug for RedisReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisReceiver").finish_non_exhaustive()
    }
}

impl RedisReceiver {
    pub(crate) fn new(receive: impl Receive) -> Self {
        Self {
            receive: Box::new(receive),
            gate: None,
        }
    }

    /// The same receiver, not reading while `gate` (if any) says the subscription is paused.
    pub(crate) fn gated(mut self, gate: Option<Gate>) -> Self {
        self.gate = gate;
        self
    }

    /// Whether it may read now (not paused by an operator).
    pub(crate) fn is_open(&self) -> bool {
        self.gate.as_ref().is_none_or(Gate::is_open)
    }

    /// Waits until it may read or it is stopped (see [`Gate::wait_open`]).
    pub(crate) async fn wait_open(&mut self) -> bool {
        match &mut self.gate {
            Some(gate) => gate.wait_open().await,
            None => true,
        }
    }

    /// Reads as [`Receive::receive`], whether or not it is paused (the caller checked).
    pub(crate) fn receive_now<'a>(
        &'a mut self,
        max: usize,
        hurry: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Vec<Delivery<Token>>>> {
        self.receive.receive(max, hurry)
    }
}

impl Receiver for RedisReceiver {
    type Token = Token;
    type Settler = RedisSettler;

    async fn receive(&mut self, max: usize) -> Result<Vec<Delivery<Token>>> {
        if !self.wait_open().await {
            return Ok(Vec::new());
        }
        self.receive.receive(max, &NEVER).await
    }

    fn settler(&self) -> RedisSettler {
        self.receive.settler()
    }

    fn probe(&self) -> Option<ruststream_core::Probe> {
        self.receive.probe()
    }
}

/// Settles the entries of one subscription, whatever its transport.
#[derive(Clone)]
pub struct RedisSettler(Arc<dyn Settle>);

impl std::fmt::Debug for RedisSettler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettler").finish_non_exhaustive()
    }
}

impl RedisSettler {
    pub(crate) fn new(settle: impl Settle) -> Self {
        Self(Arc::new(settle))
    }
}

impl Settler for RedisSettler {
    type Token = Token;

    async fn settle(&self, batch: &[(Token, Settlement)]) -> Result<()> {
        self.0.settle(batch).await
    }

    fn unsettled(&self) -> String {
        self.0.unsettled()
    }
}
