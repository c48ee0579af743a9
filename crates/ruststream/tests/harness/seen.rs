//! Handlers tests share: [`Seen`] records what it handled, [`Stuck`] never finishes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ruststream::prelude::*;
use ruststream::{Headers, MessageType};

/// What a handler decides for a message at an attempt.
type Decide<T> = fn(&T, u32) -> Result<(), HandlerOutcome>;

/// Records every message it handles with its attempt and headers, in handling order (clones
/// share the record, so several apps can feed one), then settles as `decide` says.
#[derive(Clone)]
pub struct Seen<T> {
    seen: Arc<Mutex<Vec<(T, u32, Headers)>>>,
    decide: Decide<T>,
}

impl<T: Clone> Seen<T> {
    /// Settles each message as `decide` says.
    pub fn new(decide: Decide<T>) -> Self {
        Self {
            seen: Arc::default(),
            decide,
        }
    }

    /// Acknowledges everything.
    pub fn acking() -> Self {
        Self::new(|_, _| Ok(()))
    }

    /// The messages handled and their attempts, in handling order.
    pub fn jobs(&self) -> Vec<(T, u32)> {
        let seen = self.seen.lock().expect("lock");
        seen.iter().map(|(m, a, _)| (m.clone(), *a)).collect()
    }

    /// Each handled message's headers, in handling order.
    pub fn headers(&self) -> Vec<Headers> {
        let seen = self.seen.lock().expect("lock");
        seen.iter().map(|(_, _, h)| h.clone()).collect()
    }

    /// How many were handled.
    pub fn count(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }
}

impl<T: MessageType + Clone + Send + Sync + 'static> Handle<T> for Seen<T> {
    async fn handle(&self, m: &T, _outs: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let attempt = ctx.attempt();
        let headers = ctx.headers().clone();
        self.seen
            .lock()
            .expect("lock")
            .push((m.clone(), attempt, headers));
        (self.decide)(m, attempt)
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
