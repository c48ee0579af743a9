//! The handlers tests share: [`Seen`], the one recorder (every delivery it handled, then settles
//! as the test says: at once, later or never), and [`Stuck`], which never finishes.

use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use ruststream::prelude::*;
use ruststream::{Headers, MessageType};
use tokio::time::Instant;

/// What a [`Seen`] decides for a delivery, and when: a future of the handler's result.
pub type Verdict = Pin<Box<dyn Future<Output = Result<(), HandlerOutcome>> + Send>>;

/// Acknowledges at once.
pub fn ack() -> Verdict {
    Box::pin(std::future::ready(Ok(())))
}

/// Settles with `outcome` at once.
pub fn settle(outcome: HandlerOutcome) -> Verdict {
    Box::pin(std::future::ready(Err(outcome)))
}

/// Never finishes (a worker stuck, or killed, mid-handler).
pub fn hang() -> Verdict {
    Box::pin(std::future::pending())
}

/// One delivery as the handler saw it. Derefs to the message, so `d.n` is the message's `n`.
#[derive(Debug, Clone)]
pub struct Delivery<T> {
    /// The decoded message.
    pub message: T,
    /// The attempt (1 for the first delivery).
    pub attempt: u32,
    /// The message id.
    pub id: String,
    /// Where it came from (the channel, for a pattern subscription).
    pub source: String,
    /// Its headers.
    pub headers: Headers,
    /// When the handler started on it (tokio's clock: virtual on the model).
    pub at: Instant,
    /// The same, by the wall clock, in milliseconds since the Unix epoch (to compare with a
    /// due time).
    pub wall_ms: u64,
}

impl<T> Delivery<T> {
    /// The value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

impl<T> Deref for Delivery<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.message
    }
}

/// Decides from the message, its attempt and the index of the delivery in the record.
type Decide<T> = dyn Fn(&T, u32, usize) -> Verdict + Send + Sync;

/// Records every message it handles ([`Delivery`]), in handling order (clones share the record,
/// so several apps can feed one), then settles as its decision says.
pub struct Seen<T> {
    seen: Arc<Mutex<Vec<Delivery<T>>>>,
    decide: Arc<Decide<T>>,
}

impl<T> Clone for Seen<T> {
    fn clone(&self) -> Self {
        Self {
            seen: self.seen.clone(),
            decide: self.decide.clone(),
        }
    }
}

impl<T: Clone + 'static> Default for Seen<T> {
    /// Acknowledges everything.
    fn default() -> Self {
        Self::acking()
    }
}

impl<T: Clone + 'static> Seen<T> {
    /// Settles each message at once as `decide(message, attempt)` says.
    pub fn new(decide: fn(&T, u32) -> Result<(), HandlerOutcome>) -> Self {
        Self::deciding(move |m, attempt, _| Box::pin(std::future::ready(decide(m, attempt))))
    }

    /// Settles each message as `decide(message, attempt, index of the delivery)` says, when
    /// the [`Verdict`] it returns is ready.
    pub fn deciding(decide: impl Fn(&T, u32, usize) -> Verdict + Send + Sync + 'static) -> Self {
        Self {
            seen: Arc::default(),
            decide: Arc::new(decide),
        }
    }

    /// Acknowledges everything.
    pub fn acking() -> Self {
        Self::new(|_, _| Ok(()))
    }

    /// Never finishes a message: its claim stays held until the app dies.
    pub fn hanging() -> Self {
        Self::deciding(|_, _, _| hang())
    }

    /// Every delivery, in handling order.
    pub fn seen(&self) -> Vec<Delivery<T>> {
        self.seen.lock().expect("lock").clone()
    }

    /// The messages handled and their attempts, in handling order.
    pub fn jobs(&self) -> Vec<(T, u32)> {
        let seen = self.seen.lock().expect("lock");
        seen.iter()
            .map(|d| (d.message.clone(), d.attempt))
            .collect()
    }

    /// Each handled message's headers, in handling order.
    pub fn headers(&self) -> Vec<Headers> {
        let seen = self.seen.lock().expect("lock");
        seen.iter().map(|d| d.headers.clone()).collect()
    }

    /// How many were handled.
    pub fn count(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }
}

impl<T: MessageType + Clone + Send + Sync + 'static> Handle<T> for Seen<T> {
    fn handle(
        &self,
        m: &T,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> + Send {
        let attempt = ctx.attempt();
        let index = {
            let mut seen = self.seen.lock().expect("lock");
            seen.push(Delivery {
                message: m.clone(),
                attempt,
                id: ctx.message_id().to_owned(),
                source: ctx.source().to_owned(),
                headers: ctx.headers().clone(),
                at: Instant::now(),
                wall_ms: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            });
            seen.len() - 1
        };
        (self.decide)(m, attempt, index)
    }
}

/// A handler that never finishes: its claims stay held until its app dies.
#[derive(Clone, Default)]
pub struct Stuck(Arc<AtomicUsize>);

impl Stuck {
    /// How many messages it has started on.
    pub fn started(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl<T: MessageType + Send + Sync + 'static> Handle<T> for Stuck {
    async fn handle(&self, _: &T, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.0.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}
