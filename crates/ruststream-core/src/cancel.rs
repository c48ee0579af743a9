//! Cancelling a message by id: what a cancel did ([`CancelOutcome`], from
//! [`Publisher::cancel`](crate::Publisher::cancel)), and the signals that tell a running handler
//! ([`Context::cancelled`](crate::Context::cancelled)).
//!
//! A broker finds the message and answers (see [`CancelOutcome`]); when it is running, the
//! broker tells every process of the subscription, whose receiver hands the id to the dispatch
//! loop ([`Receiver::cancel_signals`](crate::Receiver::cancel_signals)). The loop keeps the
//! signalled ids of one subscription in one `Signals`: a handler's `ctx.cancelled()` resolves
//! once its id is there, and the dispatch drops the handler's future when it has not finished
//! [`SubscribeOptions::cancel_grace`](crate::SubscribeOptions::cancel_grace) after the signal.
//! The message then settles as [`Settlement::Cancelled`](crate::Settlement::Cancelled),
//! whatever the handler decided.
//!
//! The hot path pays only on sources whose receiver listens for signals: one registration on a
//! [`Notify`] per message and one atomic load at its end (no lock, no allocation, while no
//! cancel is pending). The measurement is in `docs/decisions.md`, "Cancellation".

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The reason a cancelled job's record fails with (its `error`), which
/// [`await_result`](crate::Publishing::await_result) turns into
/// [`Error::Cancelled`](crate::Error::Cancelled).
pub const CANCELLED: &str = "cancelled";

/// How long a signalled handler has to finish before its future is dropped, by default.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(5);

/// How long a signalled id is kept for a handler that has not started yet (claimed before the
/// cancel, still waiting for its turn): signals for messages that run in other processes are
/// forgotten after this.
const KEEP: Duration = Duration::from_secs(600);

/// What [`Publisher::cancel`](crate::Publisher::cancel) did. A call made again (after a lost
/// reply) answers what the first one did, and has no second effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CancelOutcome {
    /// The message waited in the delayed set (a delayed publish or a retry later): it was
    /// removed, and will never run.
    Removed,
    /// The message was being handled: its handler was told (`ctx.cancelled()` resolves), and
    /// it settles as cancelled, whether it finishes, or its future is dropped after the grace.
    Signalled,
    /// The message is neither delayed nor running, and the queue is not empty: the cancel is
    /// recorded, so if the message waits in the queue it is settled as cancelled when claimed
    /// and never handled; if it was not there (done, never published) this changes nothing.
    /// A list cannot be searched for one id without reading all of it, hence this answer.
    Marked,
    /// The message's job record says it is over (an awaited job with a result or an error):
    /// nothing was cancelled.
    AlreadyDone,
    /// The message is nowhere: not delayed, not running, and the queue is empty.
    NotFound,
}

impl CancelOutcome {
    /// The outcome's name, as the operator's CLI prints it: `removed`, `signalled`, `marked`,
    /// `already done`, `not found`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Removed => "removed",
            Self::Signalled => "signalled",
            Self::Marked => "marked",
            Self::AlreadyDone => "already done",
            Self::NotFound => "not found",
        }
    }

    /// Whether the cancel took effect (removed, signalled or marked): the message will not be
    /// handled to completion, if it exists.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Self::Removed | Self::Signalled | Self::Marked)
    }
}

impl std::fmt::Display for CancelOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a broker's cancel of job `id` (`outcome`) comes to with its job record in `store`: a
/// cancel that found nothing, of a job whose record says it is over, is
/// [`CancelOutcome::AlreadyDone`]; a cancel that took effect fails the record with
/// [`CANCELLED`], so an awaiter fails at once (a record already final keeps its first value).
/// [`Publisher::cancel`](crate::Publisher::cancel) and the operator's `cancel` end with this.
///
/// # Errors
/// Reading or writing the record failed (the cancel itself is done, and a call made again
/// answers the same).
pub async fn with_job(
    store: &dyn crate::JobStore,
    id: &str,
    outcome: CancelOutcome,
) -> crate::Result<CancelOutcome> {
    if matches!(outcome, CancelOutcome::Marked | CancelOutcome::NotFound)
        && let Some(record) = store.read_job(id).await?
        && record.is_final()
        && record.error.as_deref() != Some(CANCELLED)
    {
        return Ok(CancelOutcome::AlreadyDone);
    }
    if outcome.is_cancelled() {
        store
            .write_job(id, crate::JobWrite::Failed(CANCELLED.into()))
            .await?;
    }
    Ok(outcome)
}

/// The signalled message ids of one subscription in this process.
#[derive(Debug)]
pub(crate) struct Signals {
    ids: Mutex<HashMap<String, Instant>>,
    /// How many ids are held: read without the lock on the hot path.
    held: AtomicUsize,
    /// Woken at each signal: every waiting handler looks for its id.
    notify: Notify,
    grace: Duration,
}

impl Signals {
    pub(crate) fn new(grace: Duration) -> Self {
        Self {
            ids: Mutex::default(),
            held: AtomicUsize::new(0),
            notify: Notify::new(),
            grace,
        }
    }

    /// Records that message `id` is cancelled, and wakes the handlers waiting.
    pub(crate) fn signal(&self, id: String) {
        if let Ok(mut ids) = self.ids.lock() {
            let now = Instant::now();
            ids.retain(|_, at| now.duration_since(*at) < KEEP);
            ids.insert(id, now);
            self.held.store(ids.len(), Ordering::Release);
        }
        self.notify.notify_waiters();
    }

    /// Whether message `id` was signalled.
    pub(crate) fn is_signalled(&self, id: &str) -> bool {
        self.held.load(Ordering::Acquire) > 0 && self.ids.lock().is_ok_and(|i| i.contains_key(id))
    }

    /// Forgets message `id` (its handler is done).
    pub(crate) fn forget(&self, id: &str) {
        if self.held.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Ok(mut ids) = self.ids.lock() {
            ids.remove(id);
            self.held.store(ids.len(), Ordering::Release);
        }
    }

    /// Resolves once message `id` is signalled.
    pub(crate) async fn signalled(&self, id: &str) {
        loop {
            let woken = self.notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.is_signalled(id) {
                return;
            }
            woken.await;
        }
    }

    /// Resolves [`grace`](crate::SubscribeOptions::cancel_grace) after message `id` is
    /// signalled: when its handler's future is dropped.
    pub(crate) async fn expired(&self, id: &str) {
        self.signalled(id).await;
        tokio::time::sleep(self.grace).await;
    }
}

/// A handle on the signals of a delivery's subscription, carried in its
/// [`DeliveryInfo`](crate::DeliveryInfo) so its `Context` can wait for them. Equal to every
/// other: it is not part of what a delivery is.
#[derive(Debug, Clone, Default)]
pub(crate) struct Watch(pub(crate) Option<Arc<Signals>>);

impl PartialEq for Watch {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Watch {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_signal_wakes_the_waiter_of_its_id_only_and_is_forgotten() {
        const GRACE: Duration = Duration::from_millis(50);
        let s = Arc::new(Signals::new(GRACE));
        let other = tokio::spawn({
            let s = s.clone();
            async move { s.signalled("b").await }
        });
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.expired("a").await }
        });
        tokio::task::yield_now().await;
        s.signal("a".into());
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(started.elapsed() >= GRACE, "{:?}", started.elapsed());
        assert!(!other.is_finished());
        assert!(s.is_signalled("a"));
        s.forget("a");
        assert!(!s.is_signalled("a"));
        other.abort();
    }

    /// A handler that is pending once (so both branches of the `select!` are polled).
    async fn handler(i: u32) -> u32 {
        tokio::task::yield_now().await;
        i
    }

    /// The hot path's cost per message (docs/decisions.md, "Cancellation"): a handler future
    /// pending at its first poll, awaited alone and in the dispatch's `select!` beside
    /// [`Signals::expired`], then `is_signalled` and `forget` as `finish` calls them. Run with
    /// `cargo test --release -p redstream-core cancel::tests::cost -- --ignored --nocapture`.
    #[tokio::test]
    #[ignore = "a measurement, not a check"]
    async fn cost() {
        const N: u32 = 1_000_000;
        let s = Signals::new(Duration::from_secs(5));
        s.signal("someone else".into());
        s.forget("someone else");
        let plain = std::time::Instant::now();
        for i in 0..N {
            std::hint::black_box(handler(i).await);
        }
        let plain = plain.elapsed();
        let watched = std::time::Instant::now();
        for i in 0..N {
            let id = "0192-message";
            let v = tokio::select! {
                v = handler(i) => v,
                () = s.expired(id) => 0,
            };
            std::hint::black_box(v);
            std::hint::black_box(s.is_signalled(id));
            s.forget(id);
        }
        let watched = watched.elapsed();
        println!(
            "per message: plain {:?}, watched {:?}, cost {:?}",
            plain / N,
            watched / N,
            (watched.saturating_sub(plain)) / N
        );
    }
}
