//! Whether a running app can do its work, for readiness probes: a [`Health`] handle, from
//! [`RunningApp::health`](crate::RunningApp::health), answers without I/O from states the app
//! keeps anyway.
//!
//! - A subscription is *reading* from the moment its receiver opened (its connection is up)
//!   until a receive fails; it is *reading* again once a receive succeeds. The dispatch loop
//!   stores the state only when it changes, so a message costs nothing here. On stop it is
//!   *stopped*.
//! - A receiver may also offer a [`Probe`] of its connection ([`Receiver::probe`]): a blocking
//!   read waits while its connection is down rather than failing, so the probe is what tells.
//! - A broker says whether its shared connections are up ([`Broker::ready`]).
//! - A subscription added to the running app ([`RunningApp::include`]) joins the handle; one
//!   stopped with [`RunningApp::stop_subscription`] leaves it, so stopping one on purpose does
//!   not make the app unready.
//!
//! [`RunningApp::include`]: crate::RunningApp::include
//! [`RunningApp::stop_subscription`]: crate::RunningApp::stop_subscription
//!
//! [`Receiver::probe`]: crate::Receiver::probe
//! [`Broker::ready`]: crate::Broker::ready

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

/// A cheap, non-blocking check of whether a connection is up, callable from any thread.
pub type Probe = Arc<dyn Fn() -> bool + Send + Sync>;

/// What a broker's readiness check says: `Err` names what is not ready.
pub(crate) type BrokerCheck = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Where a subscription's reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SubscriptionState {
    /// Its receiver is open and its last receive, if any, succeeded.
    Reading,
    /// Its last receive failed; the dispatch loop retries with backoff.
    Failing,
    /// Its receiver's connection is down (its probe says so); the client reconnects.
    Disconnected,
    /// It stopped (the app or this subscription was stopped).
    Stopped,
}

impl fmt::Display for SubscriptionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Reading => "reading",
            Self::Failing => "receives fail, retrying",
            Self::Disconnected => "its connection is down, reconnecting",
            Self::Stopped => "stopped",
        })
    }
}

/// The state of one subscription, shared between its dispatch loop and the [`Health`] handle.
#[derive(Debug)]
pub(crate) struct StateCell(AtomicU8);

impl StateCell {
    /// A subscription whose receiver just opened: reading.
    pub(crate) fn reading() -> Arc<Self> {
        Arc::new(Self(AtomicU8::new(0)))
    }

    pub(crate) fn set(&self, state: SubscriptionState) {
        let n = match state {
            SubscriptionState::Reading => 0,
            SubscriptionState::Failing | SubscriptionState::Disconnected => 1,
            SubscriptionState::Stopped => 2,
        };
        self.0.store(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> SubscriptionState {
        match self.0.load(Ordering::Relaxed) {
            0 => SubscriptionState::Reading,
            1 => SubscriptionState::Failing,
            _ => SubscriptionState::Stopped,
        }
    }
}

/// One subscription as the health handle sees it.
pub(crate) struct Watched {
    pub(crate) name: String,
    pub(crate) state: Arc<StateCell>,
    pub(crate) probe: Option<Probe>,
}

/// A cheap, clonable view of a running app's readiness (see the [module docs](self)).
///
/// ```no_run
/// # async fn demo(app: ruststream_core::RustStream) -> ruststream_core::Result<()> {
/// use ruststream_core::App;
/// let running = app.start().await?;
/// let health = running.health();
/// if let Err(not_ready) = health.check() {
///     eprintln!("not ready: {}", not_ready.join("; "));
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Health(Arc<Inner>);

struct Inner {
    subscriptions: RwLock<Vec<Watched>>,
    brokers: RwLock<Vec<BrokerCheck>>,
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Health")
            .field("subscriptions", &self.subscriptions())
            .finish_non_exhaustive()
    }
}

impl Health {
    /// A handle watching nothing yet.
    pub(crate) fn new() -> Self {
        Self(Arc::new(Inner {
            subscriptions: RwLock::new(Vec::new()),
            brokers: RwLock::new(Vec::new()),
        }))
    }

    /// Watches one more broker's shared connections.
    pub(crate) fn add_broker(&self, check: BrokerCheck) {
        write(&self.0.brokers).push(check);
    }

    /// Watches one more subscription (one added to the running app).
    pub(crate) fn add(&self, watched: Watched) {
        write(&self.0.subscriptions).push(watched);
    }

    /// Stops watching the subscription `name` (it was stopped on purpose).
    pub(crate) fn remove(&self, name: &str) {
        write(&self.0.subscriptions).retain(|w| w.name != name);
    }

    /// Each subscription's name and state. A reading subscription whose connection probe says
    /// the connection is down shows as [`SubscriptionState::Disconnected`].
    pub fn subscriptions(&self) -> Vec<(String, SubscriptionState)> {
        let watched = self
            .0
            .subscriptions
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        watched
            .iter()
            .map(|w| {
                let state = match w.state.get() {
                    SubscriptionState::Reading if w.probe.as_ref().is_some_and(|p| !p()) => {
                        SubscriptionState::Disconnected
                    }
                    s => s,
                };
                (w.name.clone(), state)
            })
            .collect()
    }

    /// `Ok` when every broker is connected and every subscription is reading; otherwise one
    /// short sentence for each thing that is not.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let mut not_ready: Vec<String> = self
            .0
            .brokers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|b| b().err())
            .collect();
        for (name, state) in self.subscriptions() {
            if state != SubscriptionState::Reading {
                not_ready.push(format!("subscription `{name}`: {state}"));
            }
        }
        if not_ready.is_empty() {
            Ok(())
        } else {
            Err(not_ready)
        }
    }

    /// Whether [`check`](Self::check) passes.
    pub fn is_ready(&self) -> bool {
        self.check().is_ok()
    }
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
