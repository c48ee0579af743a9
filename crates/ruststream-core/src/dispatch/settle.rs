//! The settler task of one subscription: takes handled deliveries (with their permits) and
//! settles them through the broker's [`Settler`] in batches, retrying a failed settle with
//! backoff. The commands are the broker's.
//!
//! On stop the retries are bounded: once [`Giving::up`] is told (`shutdown_timeout` after the
//! stop), a failed settle is not tried again, a settle still waiting for its reply gets
//! [`GRACE`] more, and whatever is left is abandoned: its entries stay claimed, for the broker's
//! recovery, and one log line says how many and where ([`Settler::unsettled`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;

use super::Done;
use crate::health::StateCell;
use crate::{Broker, ErrorKind, Receiver, Settler};

/// Most settlements sent to the broker in one call.
const SETTLE_BATCH: usize = 1024;

/// How long a settle sent around the give-up still has for its reply, so that a settle sent as
/// the last handler finished is not cut off: the stop is bounded by `shutdown_timeout` + this.
pub(super) const GRACE: Duration = Duration::from_millis(250);

/// The settler's stop: cancelled `shutdown_timeout` after the subscription's stop, when settles
/// still failing are given up.
#[derive(Clone, Default)]
pub(super) struct Giving {
    up: CancellationToken,
}

impl Giving {
    /// Tells the settler to give up on settles that fail from now on.
    pub(super) fn up(&self) {
        self.up.cancel();
    }

    /// Resolves once the settler gives up.
    async fn given_up(&self) {
        self.up.cancelled().await;
    }

    /// Resolves [`GRACE`] after the settler gave up: the last moment a reply is waited for.
    async fn cut_off(&self) {
        self.up.cancelled().await;
        tokio::time::sleep(GRACE).await;
    }
}

/// Settles what `done` brings until it closes. A settle the server refuses for good
/// ([`ErrorKind::Unsupported`]) is not retried: its entries stay claimed for the broker's
/// recovery, and `state` is marked refused (logged once).
pub(super) async fn settle_loop<B: Broker>(
    settler: <B::Receiver as Receiver>::Settler,
    mut done: mpsc::UnboundedReceiver<Done<B>>,
    name: String,
    state: Arc<StateCell>,
    giving: Giving,
) {
    let mut received = Vec::with_capacity(SETTLE_BATCH);
    let mut batch = Vec::with_capacity(SETTLE_BATCH);
    let mut abandoned = 0;
    let mut refused = 0;
    let cut_off = giving.cut_off();
    tokio::pin!(cut_off);
    let mut past_cut_off = false;
    while done.recv_many(&mut received, SETTLE_BATCH).await > 0 {
        // The permits go back as the round trip starts, so the next claim overlaps it.
        let mut permits: Option<OwnedSemaphorePermit> = None;
        for (mut token, settlement, permit, steps) in received.drain(..) {
            if let Some(note) = steps {
                settler.steps_recorded(&mut token, note);
            }
            batch.push((token, settlement));
            match (&mut permits, permit) {
                (Some(all), Some(p)) => all.merge(p),
                (all @ None, p) => *all = p,
                (Some(_), None) => {}
            }
        }
        drop(permits);
        if past_cut_off {
            abandoned += batch.len();
            batch.clear();
            continue;
        }
        let mut backoff = ErrorBackoff::default();
        let mut tries = 0;
        loop {
            let settled = tokio::select! {
                r = settler.settle(&batch) => Some(r),
                () = &mut cut_off => None,
            };
            let e = match settled {
                Some(Ok(())) => break,
                Some(Err(e)) => e,
                None => {
                    past_cut_off = true;
                    abandoned += batch.len();
                    break;
                }
            };
            if e.kind() == ErrorKind::Unsupported {
                if state.refuse(e.to_string()) {
                    tracing::error!(subscription = %name, error = %e, lost_settlements = batch.len(),
                        "the server refused this subscription's settle; the messages stay claimed and will be recovered");
                }
                refused += batch.len();
                break;
            }
            tries += 1;
            if tries >= 20 {
                tracing::error!(subscription = %name, error = %e, lost_settlements = batch.len(),
                    "settle keeps failing: giving up; the messages stay claimed and will be recovered");
                break;
            }
            let wait = backoff.next();
            tracing::warn!(subscription = %name, error = %e, retry_in = ?wait, "settle failed");
            let given_up = tokio::select! {
                () = tokio::time::sleep(wait) => false,
                () = giving.given_up() => true,
            };
            if given_up {
                abandoned += batch.len();
                break;
            }
        }
        batch.clear();
    }
    if refused > 0 {
        let stay = settler.unsettled();
        tracing::error!(subscription = %name, refused,
            "{refused} settles refused by the server; their entries stay {stay}");
    }
    if abandoned > 0 {
        let stay = settler.unsettled();
        tracing::warn!(subscription = %name, abandoned,
            "{abandoned} settles abandoned at shutdown; their entries stay {stay}");
    }
}

/// Capped exponential backoff for broker errors: 50 ms doubling to 5 s.
#[derive(Default)]
pub(super) struct ErrorBackoff(u32);

impl ErrorBackoff {
    pub(super) fn next(&mut self) -> Duration {
        let wait = Duration::from_millis(50) * 2u32.saturating_pow(self.0.min(7));
        self.0 += 1;
        wait.min(Duration::from_secs(5))
    }
}
