//! [`Receive`], one transport's reading of one subscription, and [`RedisReceiver`], the
//! receiver the core sees whatever the transport, which holds reads while the subscription is
//! paused (`crate::pause`). Sends no command itself.

use futures::future::BoxFuture;
use ruststream_core::{Delivery, Receiver, Result};
use tokio_util::sync::CancellationToken;

use super::settler::RedisSettler;
use super::token::Token;
use crate::pause::Gate;

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
    /// The ids of its messages cancelled while they run (see [`Receiver::cancel_signals`]).
    fn cancel_signals(&mut self) -> Option<futures::stream::BoxStream<'static, String>> {
        None
    }
}

/// The ids a signal channel's listener `heard` gets, as the core takes them.
pub(crate) fn signal_ids(
    heard: tokio::sync::broadcast::Receiver<bytes::Bytes>,
) -> futures::stream::BoxStream<'static, String> {
    use futures::StreamExt;
    futures::stream::unfold(heard, |mut heard| async move {
        loop {
            match heard.recv().await {
                Ok(id) => return Some((String::from_utf8_lossy(&id).into_owned(), heard)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(lost)) => {
                    // Their settles still settle as cancelled (the record says so).
                    tracing::warn!(lost, "cancel signals lost: their handlers are not told");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .boxed()
}

/// The `hurry` of a read that no one hurries.
static NEVER: std::sync::LazyLock<CancellationToken> =
    std::sync::LazyLock::new(CancellationToken::new);

/// The receiver of one Redis subscription, whatever its transport.
pub struct RedisReceiver {
    receive: Box<dyn Receive>,
    /// Holds reads while an operator has paused the subscription.
    gate: Option<Gate>,
    /// The subscription's other readers, until the dispatch loop takes them.
    siblings: Vec<RedisReceiver>,
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
            siblings: Vec::new(),
        }
    }

    /// The same receiver, with `siblings` read beside it (see [`Receiver::siblings`]).
    pub(crate) fn with_siblings(mut self, siblings: Vec<RedisReceiver>) -> Self {
        self.siblings = siblings;
        self
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

    /// Up when its connection and those of its siblings (not yet taken) are up.
    fn probe(&self) -> Option<ruststream_core::Probe> {
        let own = self.receive.probe();
        if self.siblings.is_empty() {
            return own;
        }
        let probes: Vec<_> = own
            .into_iter()
            .chain(self.siblings.iter().filter_map(Receiver::probe))
            .collect();
        Some(std::sync::Arc::new(move || probes.iter().all(|p| p())))
    }

    fn siblings(&mut self) -> Vec<Self> {
        std::mem::take(&mut self.siblings)
    }

    fn cancel_signals(&mut self) -> Option<futures::stream::BoxStream<'static, String>> {
        self.receive.cancel_signals()
    }
}
