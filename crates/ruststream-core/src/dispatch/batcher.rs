//! The batch path of a subscription: the reader hands each claimed delivery, with its permit, to
//! a batcher task, which gathers up to the handler's batch size, or what has come `max_wait` after
//! the first of them, and runs the batch handler on it in a task of its own; every item is then
//! settled on its own, by the path of a single message. Sends no command itself.
//!
//! The subscription's `timeout` bounds the batch handler's call: past it every item is settled
//! as a retry (dead-lettered `timeout` once its attempts are spent).
//!
//! The reader's `receive` is never raced against the batch timer: only the batcher's channel
//! receive is, and that is cancel-safe (a claimed message is never dropped by a timeout).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::Instrument;

use super::{Held, Lane, Subscription};
use crate::erased::{BatchOptions, ErasedBatchHandler, Handled, panic_message};
use crate::{Broker, DeliveryInfo, HandlerOutcome, Settlement};

impl<B: Broker> Subscription<B> {
    /// Gathers deliveries into batches and runs them, several at once when the permits allow,
    /// until the reader closes `from`; then hands over the partial batch at once and waits for
    /// its batches. On a shutdown timeout the task is aborted with its batches: their messages
    /// stay claimed, for the broker's recovery.
    pub(super) async fn batcher(
        self: Arc<Self>,
        mut from: mpsc::UnboundedReceiver<Held<B>>,
        handler: Arc<dyn ErasedBatchHandler>,
        options: BatchOptions,
        lane: Lane<B>,
    ) {
        let mut running = JoinSet::new();
        let mut open = true;
        while open {
            let mut batch = Vec::with_capacity(options.size);
            if from.recv_many(&mut batch, options.size).await == 0 {
                break;
            }
            let deadline = tokio::time::Instant::now() + options.max_wait;
            while batch.len() < options.size {
                let more = options.size - batch.len();
                match tokio::time::timeout_at(deadline, from.recv_many(&mut batch, more)).await {
                    Ok(0) => {
                        open = false;
                        break;
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            let run = self
                .clone()
                .run_batch_handler(batch, handler.clone(), lane.clone());
            running.spawn(run);
            while running.try_join_next().is_some() {}
        }
        while running.join_next().await.is_some() {}
    }

    /// Runs the batch handler once on the deliveries that may reach it (the others go to the
    /// dead-letter list as a single message's would) and settles every item.
    async fn run_batch_handler(
        self: Arc<Self>,
        mut batch: Vec<Held<B>>,
        handler: Arc<dyn ErasedBatchHandler>,
        lane: Lane<B>,
    ) {
        // What `BatchContext::cancelled` waits on; `finish` settles a signalled item cancelled.
        for (d, _) in &mut batch {
            d.info.cancel = crate::cancel::Watch(lane.signals.clone());
        }
        let started = Instant::now();
        lane.meters.in_flight.increment(batch.len() as f64);
        #[cfg(feature = "otel")]
        let consumers: Vec<_> = batch
            .iter()
            .map(|(d, _)| crate::otel::Consumer::start(&self.name, &d.info))
            .collect();
        let mut refused: Vec<Option<Settlement>> = Vec::with_capacity(batch.len());
        let mut items: Vec<(&DeliveryInfo, &[u8])> = Vec::with_capacity(batch.len());
        #[cfg(feature = "otel")]
        let mut spans = consumers.iter();
        for (d, _) in &batch {
            // The item's span is the one a refusal marks failed.
            #[cfg(feature = "otel")]
            let _in_span = spans.next().map(|c| c.context().attach());
            let refusal = self.refuse(d, &lane.opts);
            if refusal.is_none() {
                self.observe_called(d);
                items.push((&d.info, &d.payload));
            }
            refused.push(refusal);
        }
        let span =
            tracing::info_span!("handle_batch", subscription = %self.name, items = items.len());
        let handled = if items.is_empty() {
            Vec::new()
        } else {
            let deadline = super::deadline(&lane.opts);
            let run = AssertUnwindSafe(handler.call(&items, &self.publisher, deadline))
                .catch_unwind()
                .map(|handled| {
                    handled.unwrap_or_else(|panic| {
                        let why = format!("handler panicked: {}", panic_message(&*panic));
                        items.iter().map(|_| Handled::Broken(why.clone())).collect()
                    })
                });
            let late = || items.iter().map(|_| Handled::TimedOut).collect();
            super::within(deadline, run, late).instrument(span).await
        }
        .into_iter();
        drop(items);
        let decided = self
            .decide(
                &batch,
                refused,
                handled,
                &lane,
                #[cfg(feature = "otel")]
                &consumers,
            )
            .await;
        #[cfg(feature = "otel")]
        let mut consumers = consumers.into_iter();
        // One span per item, so this never ends the loop early.
        for (held, (outcome, settlement)) in batch.into_iter().zip(decided) {
            #[cfg(feature = "otel")]
            let Some(consumer) = consumers.next() else {
                break;
            };
            self.finish(
                held,
                outcome,
                settlement,
                &lane,
                started,
                #[cfg(feature = "otel")]
                consumer,
            )
            .await;
        }
    }

    /// The outcome and settlement of every item: its refusal, or what the handler made of it.
    async fn decide(
        &self,
        batch: &[Held<B>],
        refused: Vec<Option<Settlement>>,
        mut handled: impl Iterator<Item = Handled>,
        lane: &Lane<B>,
        #[cfg(feature = "otel")] consumers: &[crate::otel::Consumer],
    ) -> Vec<(Option<HandlerOutcome>, Settlement)> {
        let mut decided = Vec::with_capacity(batch.len());
        #[cfg(feature = "otel")]
        let mut spans = consumers.iter();
        for ((d, _), refusal) in batch.iter().zip(refused) {
            #[cfg(feature = "otel")]
            let span = spans.next().map(|c| c.context()).unwrap_or_default();
            let next = match refusal {
                Some(settlement) => (None, settlement),
                None => {
                    let h = handled
                        .next()
                        .unwrap_or_else(|| Handled::Broken("no outcome".into()));
                    let outcome = h.decided();
                    let settle = self.settlement(&d.info, h, None, lane);
                    // The item's span is the one a failure marks.
                    #[cfg(feature = "otel")]
                    let settle = opentelemetry::context::FutureExt::with_context(settle, span);
                    (outcome, settle.await)
                }
            };
            decided.push(next);
        }
        decided
    }
}
