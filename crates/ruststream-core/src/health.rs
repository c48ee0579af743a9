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
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

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
    /// It stopped reading because the server refused what it needs (an error of kind
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported), logged once); it stays so
    /// until the app restarts.
    Refused,
}

impl fmt::Display for SubscriptionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Reading => "reading",
            Self::Failing => "receives fail, retrying",
            Self::Disconnected => "its connection is down, reconnecting",
            Self::Stopped => "stopped",
            Self::Refused => "stopped: the server refused what it needs",
        })
    }
}

/// The state of one subscription, shared between its dispatch loop and the [`Health`] handle,
/// and why the server refused it, once it did.
#[derive(Debug, Default)]
pub(crate) struct StateCell {
    state: AtomicU8,
    refusal: OnceLock<String>,
}

impl StateCell {
    /// A subscription whose receiver just opened: reading.
    pub(crate) fn reading() -> Arc<Self> {
        Arc::default()
    }

    /// Stores `state`, unless the subscription was refused: that stays.
    pub(crate) fn set(&self, state: SubscriptionState) {
        let n = match state {
            SubscriptionState::Reading => 0,
            SubscriptionState::Failing | SubscriptionState::Disconnected => 1,
            SubscriptionState::Stopped => 2,
            SubscriptionState::Refused => 3,
        };
        let _ = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                (old != 3).then_some(n)
            });
    }

    pub(crate) fn get(&self) -> SubscriptionState {
        match self.state.load(Ordering::Relaxed) {
            0 => SubscriptionState::Reading,
            1 => SubscriptionState::Failing,
            2 => SubscriptionState::Stopped,
            _ => SubscriptionState::Refused,
        }
    }

    /// Marks the subscription refused for `reason`. True the first time only, so that the
    /// caller reports the refusal once.
    pub(crate) fn refuse(&self, reason: String) -> bool {
        let first = self.refusal.set(reason).is_ok();
        self.set(SubscriptionState::Refused);
        first
    }

    /// Why the server refused the subscription, once it did.
    pub(crate) fn refusal(&self) -> Option<&str> {
        self.refusal.get().map(String::as_str)
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
            .map(|w| (w.name.clone(), state_of(w)))
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
        let watched = self
            .0
            .subscriptions
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        for w in watched.iter() {
            match (state_of(w), w.state.refusal()) {
                (SubscriptionState::Reading, _) => {}
                (state, Some(reason)) => {
                    not_ready.push(format!("subscription `{}`: {state}: {reason}", w.name));
                }
                (state, None) => not_ready.push(format!("subscription `{}`: {state}", w.name)),
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

/// `w`'s state; reading with its connection probe saying down is disconnected.
fn state_of(w: &Watched) -> SubscriptionState {
    match w.state.get() {
        SubscriptionState::Reading if w.probe.as_ref().is_some_and(|p| !p()) => {
            SubscriptionState::Disconnected
        }
        s => s,
    }
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_subscription_stays_refused_and_says_why() {
        let health = Health::new();
        let cell = StateCell::reading();
        health.add(Watched {
            name: "orders".into(),
            state: cell.clone(),
            probe: None,
        });
        assert!(health.is_ready());
        assert!(cell.refuse("the server refused the script CLAIM".into()));
        assert!(!cell.refuse("a second refusal".into()), "reported once");
        // The stop that follows does not hide why it stopped.
        cell.set(SubscriptionState::Stopped);
        assert_eq!(cell.get(), SubscriptionState::Refused);
        assert_eq!(
            health.check(),
            Err(vec![
                "subscription `orders`: stopped: the server refused what it needs: the server refused the script CLAIM"
                    .to_owned()
            ])
        );
    }
}
