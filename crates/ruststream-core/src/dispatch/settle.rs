//! The settler task of one subscription: takes handled deliveries (with their permits) and
//! settles them through the broker's [`Settler`] in batches, retrying a failed settle with
//! backoff. The commands are the broker's.

use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, mpsc};

use super::Done;
use crate::{Broker, Receiver, Settler};

/// Most settlements sent to the broker in one call.
const SETTLE_BATCH: usize = 1024;

pub(super) async fn settle_loop<B: Broker>(
    settler: <B::Receiver as Receiver>::Settler,
    mut done: mpsc::UnboundedReceiver<Done<B>>,
    name: String,
) {
    let mut received = Vec::with_capacity(SETTLE_BATCH);
    let mut batch = Vec::with_capacity(SETTLE_BATCH);
    while done.recv_many(&mut received, SETTLE_BATCH).await > 0 {
        // The permits go back as the round trip starts, so the next claim overlaps it.
        let mut permits: Option<OwnedSemaphorePermit> = None;
        for (token, settlement, permit) in received.drain(..) {
            batch.push((token, settlement));
            match (&mut permits, permit) {
                (Some(all), Some(p)) => all.merge(p),
                (all @ None, p) => *all = p,
                (Some(_), None) => {}
            }
        }
        drop(permits);
        let mut backoff = ErrorBackoff::default();
        let mut tries = 0;
        while let Err(e) = settler.settle(&batch).await {
            tries += 1;
            if tries >= 20 {
                tracing::error!(subscription = %name, error = %e, lost_settlements = batch.len(),
                    "settle keeps failing: giving up; the messages stay claimed and will be recovered");
                break;
            }
            let wait = backoff.next();
            tracing::warn!(subscription = %name, error = %e, retry_in = ?wait, "settle failed");
            tokio::time::sleep(wait).await;
        }
        batch.clear();
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
