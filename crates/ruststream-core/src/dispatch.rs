//! The dispatch loop of one subscription: claim, run handlers concurrently, settle in batches.
//!
//! - The reader claims at most `concurrency - in_flight` messages; a permit is held from claim
//!   until the settler takes the handled message into a batch, so prefetch never runs ahead of
//!   handlers. The permit does not wait for the settle's round trip, so the next claim overlaps
//!   it. So a subscription has at most `2 × concurrency` messages claimed and not yet
//!   settled: `concurrency` being handled or queued for the settler, and one batch being settled.
//! - A claim takes at most half the permits, so one batch is claimed while another is handled.
//! - The handlers of one claimed batch run concurrently in one task (`FuturesUnordered`), not a
//!   task each, which is cheaper (the figures are in `docs/decisions.md`). Batches run on the runtime's workers in parallel. A
//!   panic is caught per message and the message retried.
//! - Settlements go to one settler task that sends them to the broker in batches.
//! - On stop: no more claims; in-flight handlers get `shutdown_timeout` to finish and are settled;
//!   whatever is still unfinished is left to the broker's recovery. Nothing is lost.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use metrics::{Counter, Gauge, Histogram};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::health::{StateCell, SubscriptionState};
use crate::subscriber::{ErasedHandler, Handled};
use crate::{
    Broker, BrokerSource, Delivery, DeliveryInfo, HandlerOutcome, OutMessage, Publisher, Receiver,
    Retries, Settlement, Settler, SubscribeOptions,
};

/// Most settlements sent to the broker in one call.
const SETTLE_BATCH: usize = 1024;

/// Everything the loop of one subscription needs.
pub(crate) struct Subscription<B: Broker> {
    pub(crate) name: String,
    pub(crate) broker: Arc<B>,
    pub(crate) source: B::Source,
    pub(crate) handler: Arc<dyn ErasedHandler>,
    pub(crate) reply_policy: Option<B::Policy>,
    pub(crate) publisher: Publisher,
    pub(crate) shutdown_timeout: Duration,
    /// Told of every call and settlement (see [`crate::observe`]).
    pub(crate) observer: crate::observe::SharedObserver,
    /// Whether it reads, for [`crate::health`]: stored only when it changes.
    pub(crate) state: Arc<StateCell>,
    /// Settled deliveries so far (see [`crate::observe::Tally`]).
    pub(crate) tally: Arc<crate::observe::Tally>,
}

type Token<B> = <<B as Broker>::Receiver as Receiver>::Token;

/// The metrics of one subscription, registered once so the hot path only increments.
struct Meters {
    acked: Counter,
    retried: Counter,
    ignored: Counter,
    dead: Counter,
    duration: Histogram,
    in_flight: Gauge,
    /// `ruststream_dead_lettered_total` of this subscription, one per [`REASONS`] label.
    dead_lettered: [Counter; REASONS.len()],
}

/// The bounded labels of a dead-letter reason; `decode: <error>` counts as `decode`.
const REASONS: [&str; 5] = [
    "max-attempts",
    "dropped",
    "decode",
    "no-redelivery",
    "other",
];

impl Meters {
    fn new(subscription: &str) -> Self {
        let handled = |outcome: &'static str| metrics::counter!("ruststream_handled_total", "subscription" => subscription.to_owned(), "outcome" => outcome);
        Self {
            acked: handled("ack"),
            retried: handled("retry"),
            ignored: handled("ignored"),
            dead: handled("dead"),
            duration: metrics::histogram!("ruststream_handler_duration_seconds", "subscription" => subscription.to_owned()),
            in_flight: metrics::gauge!("ruststream_in_flight", "subscription" => subscription.to_owned()),
            dead_lettered: REASONS.map(|reason| metrics::counter!("ruststream_dead_lettered_total", "subscription" => subscription.to_owned(), "reason" => reason)),
        }
    }

    fn record(&self, settlement: &Settlement, retries: Retries) {
        match settlement {
            Settlement::Retry { .. } if retries == Retries::Ignored => {}
            Settlement::Ack => self.acked.increment(1),
            Settlement::Retry { .. } => self.retried.increment(1),
            Settlement::Dead { reason } => {
                self.dead.increment(1);
                self.dead_lettered[reason_index(reason)].increment(1);
            }
        }
    }
}

/// The index in [`REASONS`] of a dead-letter reason's label (`decode: <error>` is `decode`).
fn reason_index(reason: &str) -> usize {
    let head = reason.split(':').next().unwrap_or_default();
    REASONS
        .iter()
        .position(|r| *r == head)
        .unwrap_or(REASONS.len() - 1)
}
type Done<B> = (Token<B>, Settlement, Option<OwnedSemaphorePermit>);

impl<B: Broker> Subscription<B> {
    /// Runs until `stop` is cancelled and every in-flight message is settled or abandoned.
    pub(crate) async fn run(self: Arc<Self>, mut receiver: B::Receiver, stop: CancellationToken) {
        let opts = Arc::new(self.source.options().clone());
        let concurrency = opts.concurrency.max(1);
        let permits = Arc::new(Semaphore::new(concurrency));
        // Unbounded, yet bounded by the permits: a handled message carries its permit to the
        // settler, which releases it when the message's settle round trip starts.
        let (done_tx, done_rx) = mpsc::unbounded_channel::<Done<B>>();
        let settler = tokio::spawn(settle_loop::<B>(
            receiver.settler(),
            done_rx,
            self.name.clone(),
        ));
        let mut batches = JoinSet::new();
        let mut backoff = ErrorBackoff::default();
        let meters = Arc::new(Meters::new(&self.name));
        let mut failing = false;

        while !stop.is_cancelled() {
            let mut held = tokio::select! {
                p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                () = stop.cancelled() => break,
            };
            // At most half the permits a claim: two batches in flight, one being handled while
            // the next is claimed, so the reader never waits for a whole batch to finish.
            let most = (concurrency / 2).max(1);
            let free = permits.available_permits().min(most - 1);
            let free = u32::try_from(free).unwrap_or(u32::MAX);
            if let Ok(more) = permits.clone().try_acquire_many_owned(free) {
                held.merge(more);
            }
            let batch = match receiver.receive(held.num_permits()).await {
                Ok(batch) => {
                    if failing {
                        failing = false;
                        backoff.reset();
                        self.state.set(SubscriptionState::Reading);
                    }
                    batch
                }
                Err(e) => {
                    if !failing {
                        failing = true;
                        self.state.set(SubscriptionState::Failing);
                    }
                    let wait = backoff.next();
                    tracing::warn!(subscription = %self.name, error = %e, retry_in = ?wait, "receive failed");
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = stop.cancelled() => {}
                    }
                    continue;
                }
            };
            if batch.is_empty() {
                continue;
            }
            // Give back what the broker did not fill; the rest goes one per message.
            drop(held.split(held.num_permits().saturating_sub(batch.len())));
            batches.spawn(self.clone().run_batch(
                batch,
                held,
                done_tx.clone(),
                opts.clone(),
                meters.clone(),
            ));
            // Reap finished batches so the set does not grow without bound.
            while batches.try_join_next().is_some() {}
        }

        self.state.set(SubscriptionState::Stopped);
        drop(done_tx);
        self.drain(batches, &permits, concurrency).await;
        if settler.await.is_err() {
            tracing::error!(subscription = %self.name, "settler task failed");
        }
    }

    /// On stop: gives the running batches `shutdown_timeout` to finish, then aborts the rest,
    /// whose messages stay claimed for the broker's recovery.
    async fn drain(&self, mut batches: JoinSet<()>, permits: &Semaphore, concurrency: usize) {
        while batches.try_join_next().is_some() {}
        let in_flight = concurrency - permits.available_permits().min(concurrency);
        if in_flight > 0 {
            tracing::info!(subscription = %self.name, in_flight, "stopping: waiting for handlers");
        }
        let finished = tokio::time::timeout(self.shutdown_timeout, async {
            while batches.join_next().await.is_some() {}
        })
        .await;
        if finished.is_err() {
            let abandoned = concurrency - permits.available_permits().min(concurrency);
            tracing::warn!(
                subscription = %self.name,
                abandoned,
                "shutdown timeout: unfinished messages stay claimed and will be recovered"
            );
            batches.abort_all();
            while batches.join_next().await.is_some() {}
        }
    }

    /// Runs the handlers of one claimed batch concurrently in one task, each with one of
    /// `permits`, until the last is handled.
    async fn run_batch(
        self: Arc<Self>,
        batch: Vec<Delivery<Token<B>>>,
        mut permits: OwnedSemaphorePermit,
        done: mpsc::UnboundedSender<Done<B>>,
        opts: Arc<SubscribeOptions>,
        meters: Arc<Meters>,
    ) {
        let mut running: FuturesUnordered<_> = batch
            .into_iter()
            .map(|delivery| {
                let permit = permits.split(1);
                self.handle_one(delivery, permit, &done, &opts, &meters)
            })
            .collect();
        while running.next().await.is_some() {}
    }

    /// Handles one delivery and hands its settlement, with its permit, to the settler.
    async fn handle_one(
        &self,
        delivery: Delivery<Token<B>>,
        permit: Option<OwnedSemaphorePermit>,
        done: &mpsc::UnboundedSender<Done<B>>,
        opts: &SubscribeOptions,
        meters: &Meters,
    ) {
        let span = tracing::info_span!(
            "handle",
            subscription = %self.name,
            message_id = %delivery.info.message_id,
            attempt = delivery.info.attempt,
            headers = ?delivery.info.headers,
        );
        meters.in_flight.increment(1.0);
        let started = std::time::Instant::now();
        let mut outcome = None;
        let handled = self.handle(&delivery, opts, &mut outcome).instrument(span);
        // The consumer span is the OpenTelemetry context the handler (and its publishes) run in.
        #[cfg(feature = "otel")]
        let consumer = crate::otel::Consumer::start(&self.name, &delivery.info);
        #[cfg(feature = "otel")]
        let handled = opentelemetry::context::FutureExt::with_context(handled, consumer.context());
        let mut settlement = handled.await;
        if let Settlement::Retry { .. } = settlement {
            match self.source.retries() {
                Retries::Redeliver => {}
                Retries::DeadLetter(reason) => {
                    tracing::warn!(subscription = %self.name, message_id = %delivery.info.message_id,
                        reason, "this source cannot redeliver: the retry goes to the dead-letter list");
                    settlement = Settlement::Dead {
                        reason: reason.into(),
                    };
                }
                Retries::Ignored => {
                    tracing::warn!(subscription = %self.name, message_id = %delivery.info.message_id,
                        outcome = %outcome.map_or_else(|| "retry (panic)".to_owned(), |o| o.to_string()),
                        "this source popped the message before its handler ran: the retry is ignored and the message is gone (use a reliable list to retry)");
                    meters.ignored.increment(1);
                }
            }
        }
        #[cfg(feature = "otel")]
        consumer.end(&settlement, self.source.retries());
        self.observe_settled(&delivery, outcome, &settlement);
        self.tally.record(&settlement);
        meters.duration.record(started.elapsed().as_secs_f64());
        meters.in_flight.decrement(1.0);
        meters.record(&settlement, self.source.retries());
        // The settler outlives every batch task; a closed channel means it is gone and the
        // message stays claimed, to be recovered.
        let _ = done.send((delivery.token, settlement, permit));
    }

    /// Runs the handler on one delivery and decides its settlement; `outcome` gets what the
    /// handler decided, when it did.
    async fn handle(
        &self,
        d: &Delivery<Token<B>>,
        opts: &SubscribeOptions,
        outcome: &mut Option<HandlerOutcome>,
    ) -> Settlement {
        if let Some(why) = &d.unreadable {
            tracing::error!(subscription = %self.name, message_id = %d.info.message_id, error = %why,
                "message cannot be read: to the dead-letter list");
            #[cfg(feature = "otel")]
            crate::otel::failed(|| format!("message cannot be read: {why}"));
            return Settlement::Dead {
                reason: format!("decode: {why}"),
            };
        }
        if d.info.attempt > opts.max_attempts {
            // Recovered after a crash on its last attempt: do not run it again.
            tracing::warn!(subscription = %self.name, message_id = %d.info.message_id, attempt = d.info.attempt,
                "no attempts left: to the dead-letter list");
            return Settlement::Dead {
                reason: "max-attempts".into(),
            };
        }
        self.observe_called(d);
        let run = AssertUnwindSafe(self.handler.call(&d.info, &d.payload, &self.publisher));
        let handled = run.catch_unwind().await;
        *outcome = match &handled {
            Ok(Handled::Ack(_)) => Some(HandlerOutcome::ack()),
            Ok(Handled::Outcome(o)) => Some(*o),
            _ => None,
        };
        match handled {
            Ok(Handled::Ack(None)) => Settlement::Ack,
            Ok(Handled::Ack(Some(reply))) => match self.publish_reply(reply).await {
                Ok(()) => Settlement::Ack,
                Err(e) => {
                    tracing::warn!(subscription = %self.name, error = %e, "reply not published; retrying the message");
                    retry(&d.info, None, opts)
                }
            },
            Ok(Handled::Outcome(outcome)) => {
                if outcome.is_ack() {
                    Settlement::Ack
                } else if outcome.is_drop() {
                    Settlement::Dead {
                        reason: "dropped".into(),
                    }
                } else {
                    retry(&d.info, outcome.retry_after_delay(), opts)
                }
            }
            Ok(Handled::Failed(e)) => {
                tracing::error!(subscription = %self.name, message_id = %d.info.message_id, error = %e, "message cannot be handled");
                #[cfg(feature = "otel")]
                crate::otel::failed(|| e.to_string());
                Settlement::Dead {
                    reason: e.to_string(),
                }
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(ToString::to_string)
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(subscription = %self.name, message_id = %d.info.message_id, panic = %what, "handler panicked");
                #[cfg(feature = "otel")]
                crate::otel::failed(|| format!("handler panicked: {what}"));
                retry(&d.info, None, opts)
            }
        }
    }

    async fn publish_reply(&self, reply: OutMessage) -> crate::Result<()> {
        match &self.reply_policy {
            Some(policy) => {
                #[cfg(feature = "otel")]
                let (replies, span) = crate::otel::Producer::start(vec![reply]);
                #[cfg(not(feature = "otel"))]
                let replies = vec![reply];
                let result = self.broker.publish_with(policy, replies).await;
                #[cfg(feature = "otel")]
                span.end(&result);
                result
            }
            None => self.publisher.send(vec![reply]).await,
        }
    }
}

/// A retry, or the dead-letter list once the attempts are used up.
fn retry(info: &DeliveryInfo, delay: Option<Duration>, opts: &SubscribeOptions) -> Settlement {
    if info.attempt >= opts.max_attempts {
        tracing::warn!(
            message_id = %info.message_id,
            attempts = info.attempt,
            source = %info.source,
            "no attempts left: to the dead-letter list"
        );
        return Settlement::Dead {
            reason: "max-attempts".into(),
        };
    }
    let delay = delay.unwrap_or_else(|| opts.retry.delay(info.attempt));
    Settlement::Retry {
        delay: (!delay.is_zero()).then_some(delay),
    }
}

async fn settle_loop<B: Broker>(
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
struct ErrorBackoff(u32);

impl ErrorBackoff {
    fn next(&mut self) -> Duration {
        let wait = Duration::from_millis(50) * 2u32.saturating_pow(self.0.min(7));
        self.0 += 1;
        wait.min(Duration::from_secs(5))
    }

    fn reset(&mut self) {
        self.0 = 0;
    }
}
