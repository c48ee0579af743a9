//! One receiver's claim loop (`Subscription::read`): takes free permits, claims that many
//! messages through the receiver (backing off while claims fail), and hands each claimed batch
//! to a batch runner (see `runners`) or its deliveries to the batcher; and the drain on stop
//! (`Subscription::drain`). The loop sends nothing itself: the receiver's `receive` is the
//! broker's claim.

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::runners::Runners;
use super::settle::{ErrorBackoff, GRACE, Giving};
use super::stopping::Cut;
use super::{Held, Lane, Subscription, Token};
use crate::erased::Handler;
use crate::health::SubscriptionState;
use crate::{Broker, Delivery, ErrorKind, Receiver};

/// What the reader does with a claimed batch: hand it to a batch runner, which runs a handler on
/// each delivery, or pass its deliveries to the batcher.
enum Route<B: Broker> {
    Each(Runners<B>),
    Batcher(mpsc::UnboundedSender<Held<B>>),
}

impl<B: Broker> Subscription<B> {
    /// One receiver's claim loop, until `stop`: claims as many messages as there are free
    /// `permits` (at most half of them a claim) and starts their handlers. Returns its tasks
    /// (batch runners, a batcher), its route and lane dropped: idle runners end then, busy ones
    /// once their batch is handled, and a batcher hands over its partial batch.
    pub(super) async fn read(
        self: Arc<Self>,
        mut receiver: B::Receiver,
        lane: Lane<B>,
        permits: Arc<Semaphore>,
        stop: CancellationToken,
    ) -> JoinSet<()> {
        let concurrency = lane.opts.concurrency.max(1);
        let mut batches = JoinSet::new();
        let (route, most) = self.route(&mut batches, &lane, concurrency);
        let mut failing: Option<ErrorBackoff> = None;

        while !stop.is_cancelled() {
            let mut held = tokio::select! {
                p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                () = stop.cancelled() => break,
            };
            let free = permits.available_permits().min(most - 1);
            let free = u32::try_from(free).unwrap_or(u32::MAX);
            if let Ok(more) = permits.clone().try_acquire_many_owned(free) {
                held.merge(more);
            }
            let Some(batch) = self
                .claim(&mut receiver, held.num_permits(), &mut failing, &stop)
                .await
            else {
                if self.state.get() == SubscriptionState::Refused {
                    break;
                }
                continue;
            };
            if batch.is_empty() {
                continue;
            }
            // Give back what the broker did not fill; the rest goes one per message.
            drop(held.split(held.num_permits().saturating_sub(batch.len())));
            match &route {
                Route::Each(runners) => runners.hand((batch, held), &mut batches),
                // The batcher lives until `route` is dropped below.
                Route::Batcher(to) => batch.into_iter().for_each(|delivery| {
                    let _ = to.send((delivery, held.split(1)));
                }),
            }
            // Reap ended tasks (aborted runners) so the set does not grow without bound.
            while batches.try_join_next().is_some() {}
        }
        // Idle runners end, and the batcher hands over its partial batch once its channel closes.
        drop(route);
        drop(lane);
        batches
    }

    /// Claims up to `n` messages. On an error: marks the subscription failing (`failing` holds
    /// the backoff while it is), waits the backoff or the stop, and returns `None`. An error
    /// that retrying cannot mend ([`ErrorKind::Unsupported`]) marks it refused instead, logged
    /// once, and returns `None` at once: the loop then stops.
    async fn claim(
        &self,
        receiver: &mut B::Receiver,
        n: usize,
        failing: &mut Option<ErrorBackoff>,
        stop: &CancellationToken,
    ) -> Option<Vec<Delivery<Token<B>>>> {
        match receiver.receive(n).await {
            Ok(batch) => {
                if failing.take().is_some() {
                    self.state.set(SubscriptionState::Reading);
                }
                Some(batch)
            }
            Err(e) if e.kind() == ErrorKind::Unsupported => {
                if self.state.refuse(e.to_string()) {
                    tracing::error!(subscription = %self.name, error = %e,
                        "the server refused this subscription's read; it stops reading until the app restarts");
                }
                None
            }
            Err(e) => {
                let backoff = failing.get_or_insert_with(|| {
                    self.state.set(SubscriptionState::Failing);
                    ErrorBackoff::default()
                });
                let wait = backoff.next();
                tracing::warn!(subscription = %self.name, error = %e, retry_in = ?wait, "receive failed");
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = stop.cancelled() => {}
                }
                None
            }
        }
    }

    /// Where claimed batches go (batch runners, or the batcher of a batch handler, started in
    /// `batches`), and the most permits one claim takes.
    fn route(
        self: &Arc<Self>,
        batches: &mut JoinSet<()>,
        lane: &Lane<B>,
        concurrency: usize,
    ) -> (Route<B>, usize) {
        // At most half the permits a claim: two batches in flight, one being handled while the
        // next is claimed, so the reader never waits for a whole batch to finish. A batch
        // handler's claim may take a whole batch.
        let most = (concurrency / 2).max(1);
        match &self.handler {
            Handler::One(h) => (
                Route::Each(Runners::new(self.clone(), h.clone(), lane.clone())),
                most,
            ),
            Handler::Batch(h, batch) => {
                let (tx, rx) = mpsc::unbounded_channel();
                batches.spawn(self.clone().batcher(rx, h.clone(), *batch, lane.clone()));
                (Route::Batcher(tx), most.max(batch.size).min(concurrency))
            }
        }
    }

    /// On stop: gives the running batches (of every claim loop) until `deadline`
    /// (`shutdown_timeout` after the stop) to finish. Then cuts off the handlers still running
    /// (`cut`; those that used steps settle as put back) and tells the settler to give up on
    /// failing settles (`giving`), gives the batches [`GRACE`] more, and aborts the rest, whose
    /// messages stay claimed for the broker's recovery.
    pub(super) async fn drain(
        &self,
        mut batches: Vec<JoinSet<()>>,
        permits: &Semaphore,
        concurrency: usize,
        deadline: tokio::time::Instant,
        (cut, giving): (&Cut, &Giving),
    ) {
        for set in &mut batches {
            while set.try_join_next().is_some() {}
        }
        let in_flight = concurrency - permits.available_permits().min(concurrency);
        if in_flight > 0 {
            tracing::info!(subscription = %self.name, in_flight, "stopping: waiting for handlers");
        }
        if join_all(&mut batches, deadline).await {
            return;
        }
        let running = concurrency - permits.available_permits().min(concurrency);
        tracing::warn!(
            subscription = %self.name,
            running,
            "shutdown timeout: handlers still running are stopped; the messages of those that used steps go back to their queue, the others stay claimed and will be recovered"
        );
        cut.cut();
        giving.up();
        if join_all(&mut batches, deadline + GRACE).await {
            return;
        }
        for set in &mut batches {
            set.abort_all();
            while set.join_next().await.is_some() {}
        }
    }
}

/// Waits until every task of `batches` ended, or `deadline`: whether they all ended.
async fn join_all(batches: &mut [JoinSet<()>], deadline: tokio::time::Instant) -> bool {
    tokio::time::timeout_at(deadline, async {
        for set in batches.iter_mut() {
            while set.join_next().await.is_some() {}
        }
    })
    .await
    .is_ok()
}
