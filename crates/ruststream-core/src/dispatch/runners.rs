//! The batch runners of one claim loop: long-lived tasks, each running the handlers of one
//! claimed batch at a time, concurrently (`FuturesUnordered`), then waiting idle for the next
//! batch. A new runner starts only when every one is busy, so a batch never waits; at most
//! [`IDLE_RUNNERS`] wait idle, so a pool keeps no more runners (each with slots for at most
//! half of `concurrency`) than the batches running and that many more. At a stop's cut-off a
//! runner polls each of its running handlers once more, so that each sees the cut-off
//! (`stopping`). Sends no commands itself.
//!
//! A runner keeps each delivery's dispatch future (`Subscription::handle_one`, about 2 kB) in a
//! slot it reuses from batch to batch: the futures of a batch are not allocated and freed by the
//! hundred. Freed by the hundred, they make glibc's allocator return the freed heap to the kernel
//! after each batch and fault it in again for the next (`docs/decisions.md`, "A claimed batch
//! runs in one task, in a runner reused from batch to batch").

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tokio::task::JoinSet;

use super::{Lane, Subscription, Token};
use crate::erased::ErasedHandler;
use crate::{Broker, Delivery};

/// A claimed batch with the permits of its deliveries.
type Batch<B> = (Vec<Delivery<Token<B>>>, OwnedSemaphorePermit);

/// Most runners a pool keeps idle; a runner that ends its batch with this many waiting ends
/// too, and its slots are freed. Two batches are in flight at a time (a claim takes at most
/// half the permits), and a third starts while a batch's last handlers run, so four idle
/// runners cover the steady state, and a burst of small batches leaves no more behind.
const IDLE_RUNNERS: usize = 4;

/// The idle runners of a pool, each waiting on the sender it left here; `closed` once the claim
/// loop stops handing out batches.
struct Idle<B: Broker> {
    waiting: Vec<oneshot::Sender<Batch<B>>>,
    closed: bool,
}

/// The runner pool of one claim loop. Its tasks live in the claim loop's `JoinSet`, which the
/// stop drains (`Subscription::drain`).
pub(super) struct Runners<B: Broker> {
    subscription: Arc<Subscription<B>>,
    handler: Arc<dyn ErasedHandler>,
    lane: Lane<B>,
    idle: Arc<Mutex<Idle<B>>>,
}

impl<B: Broker> Runners<B> {
    pub(super) fn new(
        subscription: Arc<Subscription<B>>,
        handler: Arc<dyn ErasedHandler>,
        lane: Lane<B>,
    ) -> Self {
        Self {
            subscription,
            handler,
            lane,
            idle: Arc::new(Mutex::new(Idle {
                waiting: Vec::new(),
                closed: false,
            })),
        }
    }

    /// Hands `batch` to the most recently idle runner, or to a new one in `tasks` when none is
    /// idle.
    pub(super) fn hand(&self, mut batch: Batch<B>, tasks: &mut JoinSet<()>) {
        loop {
            let next = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .waiting
                .pop();
            let Some(runner) = next else { break };
            match runner.send(batch) {
                Ok(()) => return,
                // Its task is gone (aborted): try the next one.
                Err(back) => batch = back,
            }
        }
        tasks.spawn(run(
            self.subscription.clone(),
            self.handler.clone(),
            self.lane.clone(),
            self.idle.clone(),
            batch,
        ));
    }
}

impl<B: Broker> Drop for Runners<B> {
    /// Ends the idle runners; a busy one ends once its batch is handled.
    fn drop(&mut self) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.closed = true;
        idle.waiting.clear();
    }
}

/// One runner: handles `batch`, then waits idle for the next one, until the pool closes.
async fn run<B: Broker>(
    subscription: Arc<Subscription<B>>,
    handler: Arc<dyn ErasedHandler>,
    lane: Lane<B>,
    idle: Arc<Mutex<Idle<B>>>,
    mut batch: Batch<B>,
) {
    // Grows to the largest batch this runner has handled; a slot is emptied when its delivery
    // is handled, and refilled by the next batch.
    let mut slots: Vec<Pin<Box<Option<_>>>> = Vec::new();
    loop {
        let (deliveries, mut permits) = batch;
        let n = deliveries.len();
        for (i, delivery) in deliveries.into_iter().enumerate() {
            let handled = subscription.handle_one(&*handler, (delivery, permits.split(1)), &lane);
            match slots.get_mut(i) {
                Some(slot) => Pin::as_mut(slot).set(Some(handled)),
                None => slots.push(Box::pin(Some(handled))),
            }
        }
        // A pass polls the handlers still running; the first also waits for the cut-off, which
        // starts a pass over them all, so each sees it (`stopping::cut_off`).
        let mut cut = false;
        loop {
            let mut running: FuturesUnordered<_> = slots
                .iter_mut()
                .take(n)
                .filter(|slot| slot.is_some())
                .map(|slot| Piece::Slot(Slot(Pin::as_mut(slot))))
                .collect();
            let mut left = running.len();
            if left == 0 {
                break;
            }
            if !cut {
                running.push(Piece::Cut(Box::pin(lane.cut.cutting())));
            }
            while left > 0 {
                match running.next().await {
                    Some(Ended::Slot) => left -= 1,
                    Some(Ended::Cut) => {
                        cut = true;
                        break;
                    }
                    None => break,
                }
            }
            if left == 0 {
                break;
            }
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut idle = idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.closed || idle.waiting.len() >= IDLE_RUNNERS {
                return;
            }
            idle.waiting.push(tx);
        }
        match rx.await {
            Ok(next) => batch = next,
            Err(_) => return,
        }
    }
}

/// What a runner waits on: a slot, or the cut-off of the running handlers.
enum Piece<'a, F> {
    Slot(Slot<'a, F>),
    Cut(Pin<Box<tokio_util::sync::WaitForCancellationFuture<'a>>>),
}

/// Which [`Piece`] ended.
enum Ended {
    Slot,
    Cut,
}

impl<F: Future<Output = ()>> Future for Piece<'_, F> {
    type Output = Ended;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Ended> {
        match self.get_mut() {
            Self::Slot(slot) => Pin::new(slot).poll(cx).map(|()| Ended::Slot),
            Self::Cut(cut) => cut.as_mut().poll(cx).map(|()| Ended::Cut),
        }
    }
}

/// A runner's slot as a future: polls the future in it and empties it once it is done.
struct Slot<'a, F>(Pin<&'a mut Option<F>>);

impl<F: Future<Output = ()>> Future for Slot<'_, F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(running) = self.0.as_mut().as_pin_mut() else {
            return Poll::Ready(());
        };
        if running.poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.0.set(None);
        Poll::Ready(())
    }
}
