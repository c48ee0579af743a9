//! Watching handlers at work: an [`Observer`] is told of every delivery a subscription hands to
//! its handler and of how that delivery was settled.
//!
//! This is the hook test harnesses use (`ruststream::testing::TestApp` records calls with it, so a
//! test can say `subscriber("key").assert_called_once().with(&v).settled(HandlerOutcome::ack())`);
//! tooling may use it too. Set one with [`RustStream::observe`](crate::RustStream::observe). An
//! app without an observer pays one `Option` check per message.
//!
//! Observers are called on the handler's task, synchronously: keep them quick and never block.
//!
//! Every subscription also keeps a [`Tally`] (a few relaxed atomic increments a message), which
//! [`RunningApp::tallies`](crate::RunningApp::tallies) hands out, e.g. for live rates.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use crate::history::{Counts, TIME_BUCKETS, bucket_of};
use crate::{DeliveryInfo, HandlerOutcome, Settlement};

/// One delivery handed to a handler, as an [`Observer`] sees it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Call<'a> {
    /// The subscription's name: its source key, or `key#2`, `key#3`, ... for further subscribers
    /// of the same key on one broker.
    pub subscription: &'a str,
    /// Id, attempt, source key (without the broker's prefix) and headers.
    pub info: &'a DeliveryInfo,
    /// The encoded payload, as the handler will decode it.
    pub payload: &'a Bytes,
}

/// Sees every handler call of an app and its settlement.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use ruststream_core::observe::{Call, Observer};
/// use ruststream_core::{HandlerOutcome, Settlement};
///
/// #[derive(Default)]
/// struct Count(AtomicUsize);
///
/// impl Observer for Count {
///     fn called(&self, _call: &Call<'_>) {
///         self.0.fetch_add(1, Ordering::Relaxed);
///     }
///     fn settled(&self, _call: &Call<'_>, _outcome: Option<HandlerOutcome>, _settlement: &Settlement) {}
/// }
/// ```
pub trait Observer: Send + Sync + 'static {
    /// A delivery is about to be handed to its handler (which decodes it first).
    fn called(&self, call: &Call<'_>);

    /// The delivery's fate was decided and goes to the broker's settler.
    ///
    /// `outcome` is what the handler decided (a handler that returned `Ok` is
    /// [`HandlerOutcome::ack`]); it is `None` when the handler did not decide: the payload did not
    /// decode, the handler panicked, or the message had no attempts left and was not run (then
    /// [`called`](Self::called) was not called either). `settlement` is what the broker is told
    /// to do, after the retry policy and the attempt limit.
    fn settled(&self, call: &Call<'_>, outcome: Option<HandlerOutcome>, settlement: &Settlement);
}

/// Running totals of one subscription's settled deliveries since the app started: a few relaxed
/// atomic increments a message. [`counts`](Self::counts) reads them all, for the history
/// (`crate::history`).
#[derive(Debug)]
pub struct Tally {
    handled: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    timed_out: AtomicU64,
    times: [AtomicU64; TIME_BUCKETS],
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            handled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            retried: AtomicU64::new(0),
            dead: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            times: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Tally {
    /// Deliveries settled, whatever their outcome.
    pub fn handled(&self) -> u64 {
        self.handled.load(Ordering::Relaxed)
    }

    /// Deliveries settled other than acknowledged: retried, dead-lettered or cancelled.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Every total, read one after the other (not one atomic snapshot).
    pub fn counts(&self) -> Counts {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counts {
            handled: load(&self.handled),
            failed: load(&self.failed),
            retried: load(&self.retried),
            dead: load(&self.dead),
            timed_out: load(&self.timed_out),
            times: std::array::from_fn(|i| load(&self.times[i])),
        }
    }

    /// Counts one settlement and how long its handling took.
    pub(crate) fn record(&self, settlement: &Settlement, took: Duration) {
        self.handled.fetch_add(1, Ordering::Relaxed);
        self.times[bucket_of(took)].fetch_add(1, Ordering::Relaxed);
        match settlement {
            Settlement::Ack => return,
            Settlement::Retry { .. } => self.retried.fetch_add(1, Ordering::Relaxed),
            Settlement::Dead { .. } => self.dead.fetch_add(1, Ordering::Relaxed),
            Settlement::Cancelled => 0,
        };
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a handler call stopped at its deadline.
    pub(crate) fn timed_out(&self) {
        self.timed_out.fetch_add(1, Ordering::Relaxed);
    }
}

/// An observer shared by every subscription of an app.
pub(crate) type SharedObserver = Option<Arc<dyn Observer>>;
