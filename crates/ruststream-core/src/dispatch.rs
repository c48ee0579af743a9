//! The dispatch loop of one subscription: claim, run handlers concurrently, settle in batches.
//!
//! - The reader claims at most `concurrency - in_flight` messages; a permit is held from claim
//!   until the settler takes the handled message into a batch, so prefetch never runs ahead of
//!   handlers. The permit does not wait for the settle's round trip, so the next claim overlaps
//!   it. So a subscription has at most `2 × concurrency` messages claimed and not yet
//!   settled: `concurrency` being handled or queued for the settler, and one batch being settled.
//! - A claim takes at most half the permits, so one batch is claimed while another is handled.
//! - The handlers of one claimed batch run concurrently in one task (`FuturesUnordered`), not a
//!   task each, which is cheaper (the figures are in `docs/decisions.md`, "Dispatch and
//!   permits"): a batch runner (see `runners`), which lives on to run later batches in the same
//!   memory. Batches run on the runtime's workers in parallel. A panic is caught per message
//!   and the message retried.
//! - Settlements go to one settler task that sends them to the broker in batches.
//! - A receiver may come with [siblings](crate::Receiver::siblings) (a Redis stream's other
//!   consumers of its group): each runs a claim loop of its own, in a task of its own, taking
//!   the same permits, and has a settler task of its own.
//! - A batch handler's deliveries go, each with its permit, to a batcher task that gathers them
//!   into the handler's batches (see `batcher`); each item then settles as above.
//! - A subscription's `timeout` bounds each handler call (a batch handler's call): a call still
//!   running at its deadline has its future dropped, and its messages are settled at once as
//!   retries (dead-lettered `timeout` once their attempts are spent). So a hung handler holds
//!   its permit, its lease and its claim (and a capped queue's slot) only until its deadline.
//! - On stop: no more claims; in-flight handlers get `shutdown_timeout` to finish and are settled.
//!   A handler that used steps and returns a retry once the stop began, or is cut off when the
//!   timeout is over, has its message put back at once (see `stopping`). Whatever else is
//!   unfinished then, or whose settle still fails, is left to the broker's recovery (see
//!   `settle`). Nothing is lost, and the stop is bounded.

mod again;
mod batcher;
mod claim_loop;
mod flows;
mod jobs;
mod meters;
mod observing;
mod runners;
mod settle;
mod stopping;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use self::again::{retry, snooze};
use self::meters::Meters;
use self::settle::{Giving, settle_loop};
use self::stopping::Cut;
use crate::cancel::{Signals, Watch};
use crate::erased::{ErasedHandler, Handled, Handler, panic_message};
use crate::health::{StateCell, SubscriptionState};
use crate::{
    Broker, BrokerSource, Delivery, DeliveryInfo, HandlerOutcome, OutMessage, Publisher, Receiver,
    Retries, Settlement, SubscribeOptions,
};

/// Everything the loop of one subscription needs.
pub(crate) struct Subscription<B: Broker> {
    pub(crate) name: String,
    pub(crate) broker: Arc<B>,
    pub(crate) source: B::Source,
    pub(crate) handler: Handler,
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

/// A handled delivery for the settler: token, settlement, permit, what its settle must know of
/// its steps.
type Done<B> = (
    Token<B>,
    Settlement,
    Option<OwnedSemaphorePermit>,
    Option<crate::steps::StepsNote>,
);

/// A claimed delivery with the permit it holds until its settle starts.
type Held<B> = (Delivery<Token<B>>, Option<OwnedSemaphorePermit>);

/// Where handled deliveries go: the settler's channel, with the options and meters they are
/// settled and counted by.
struct Lane<B: Broker> {
    done: mpsc::UnboundedSender<Done<B>>,
    opts: Arc<SubscribeOptions>,
    meters: Arc<Meters>,
    /// The cancel signals, when the source's receiver hears of them.
    signals: Option<Arc<Signals>>,
    /// The subscription's stop, which handlers see as `ctx.stopping()`.
    stop: CancellationToken,
    /// The cut-off of the handlers still running when `shutdown_timeout` is over.
    cut: Arc<Cut>,
}

impl<B: Broker> Clone for Lane<B> {
    fn clone(&self) -> Self {
        Self {
            done: self.done.clone(),
            opts: self.opts.clone(),
            meters: self.meters.clone(),
            signals: self.signals.clone(),
            stop: self.stop.clone(),
            cut: self.cut.clone(),
        }
    }
}

impl<B: Broker> Subscription<B> {
    /// Runs until `stop` is cancelled and every in-flight message is settled or abandoned: one
    /// claim loop per receiver (the receiver and its [`siblings`](Receiver::siblings)), all
    /// taking the same permits, each with its own settler.
    pub(crate) async fn run(self: Arc<Self>, mut receiver: B::Receiver, stop: CancellationToken) {
        let opts = Arc::new(self.source.options().clone());
        let concurrency = opts.concurrency.max(1);
        let permits = Arc::new(Semaphore::new(concurrency));
        let giving = Giving::default();
        let signals = receiver.cancel_signals().map(|heard| {
            let signals = Arc::new(Signals::new(opts.cancel_grace));
            tokio::spawn(forward_signals(
                heard,
                Arc::downgrade(&signals),
                stop.clone(),
            ));
            signals
        });
        let meters = Arc::new(Meters::new(&self.name));
        let cut = Arc::new(Cut::default());
        // The history is written until every settle is done, then once more.
        let written = CancellationToken::new();
        let history = self.broker.history(&self.source).map(|sink| {
            tokio::spawn(crate::history::keep(
                self.name.clone(),
                self.tally.clone(),
                sink,
                written.clone(),
            ))
        });
        let mut receivers = receiver.siblings();
        receivers.insert(0, receiver);
        let reads = receivers.into_iter().map(|receiver| {
            // Unbounded, yet bounded by the permits: a handled message carries its permit to
            // the settler, which releases it when the message's settle round trip starts.
            let (done_tx, done_rx) = mpsc::unbounded_channel::<Done<B>>();
            let settler = tokio::spawn(settle_loop::<B>(
                receiver.settler(),
                done_rx,
                self.name.clone(),
                self.state.clone(),
                giving.clone(),
            ));
            let lane = Lane {
                done: done_tx,
                opts: opts.clone(),
                meters: meters.clone(),
                signals: signals.clone(),
                stop: stop.clone(),
                cut: cut.clone(),
            };
            // A task each: the receivers decode their replies on both workers at once.
            let read =
                tokio::spawn(
                    self.clone()
                        .read(receiver, lane, permits.clone(), stop.clone()),
                );
            read.map(|batches| {
                (
                    batches.unwrap_or_else(|_| {
                        tracing::error!(subscription = %self.name, "claim loop task failed");
                        JoinSet::new()
                    }),
                    settler,
                )
            })
        });
        let (batches, settlers): (Vec<_>, Vec<_>) =
            futures::future::join_all(reads).await.into_iter().unzip();

        self.state.set(SubscriptionState::Stopped);
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
        self.drain(batches, &permits, concurrency, deadline, (&cut, &giving))
            .await;
        // Settles get the rest of the shutdown timeout; those still failing then are abandoned.
        let mut settlers = futures::future::join_all(settlers);
        let settled = match tokio::time::timeout_at(deadline, &mut settlers).await {
            Ok(settled) => settled,
            Err(_) => {
                giving.up();
                settlers.await
            }
        };
        if settled.iter().any(Result::is_err) {
            tracing::error!(subscription = %self.name, "settler task failed");
        }
        written.cancel();
        if let Some(history) = history {
            let _ = history.await;
        }
    }

    /// Handles one delivery and hands its settlement, with its permit, to the settler.
    async fn handle_one(&self, handler: &dyn ErasedHandler, mut held: Held<B>, lane: &Lane<B>) {
        held.0.info.cancel = Watch(lane.signals.clone());
        held.0.info.steps.redelivers = self.source.retries() == Retries::Redeliver;
        let delivery = &held.0;
        let span = tracing::info_span!(
            "handle",
            subscription = %self.name,
            message_id = %delivery.info.message_id,
            attempt = delivery.info.attempt,
            headers = ?delivery.info.headers,
        );
        lane.meters.in_flight.increment(1.0);
        let started = std::time::Instant::now();
        let mut outcome = None;
        let handled = self
            .handle(handler, delivery, lane, &mut outcome)
            .instrument(span);
        // The consumer span is the OpenTelemetry context the handler (and its publishes) run in.
        #[cfg(feature = "otel")]
        let consumer = crate::otel::Consumer::start(&self.name, &delivery.info);
        #[cfg(feature = "otel")]
        let handled = opentelemetry::context::FutureExt::with_context(handled, consumer.context());
        let settlement = handled.await;
        self.finish(
            held,
            outcome,
            settlement,
            lane,
            started,
            #[cfg(feature = "otel")]
            consumer,
        )
        .await;
    }

    /// Settles one handled delivery: the source's retry rule, an awaited job's failure, otel,
    /// observer, tally, metrics, then the settler (with the delivery's permit).
    async fn finish(
        &self,
        (delivery, permit): Held<B>,
        outcome: Option<HandlerOutcome>,
        mut settlement: Settlement,
        lane: &Lane<B>,
        started: std::time::Instant,
        #[cfg(feature = "otel")] consumer: crate::otel::Consumer,
    ) {
        let meters = &lane.meters;
        if let Some(signals) = &lane.signals {
            // A signal means the broker recorded the cancel before this settle: it wins.
            if signals.is_signalled(&delivery.info.message_id) {
                settlement = Settlement::Cancelled;
            }
            signals.forget(&delivery.info.message_id);
        }
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
                        outcome = %outcome.map_or_else(|| "retry (panic or timeout)".to_owned(), |o| o.to_string()),
                        "this source popped the message before its handler ran: the retry is ignored and the message is gone (use a reliable list to retry)");
                    meters.ignored.increment(1);
                }
            }
        }
        flows::report(
            &self.publisher,
            &delivery.info,
            &mut settlement,
            self.source.retries(),
        )
        .await;
        if let Some(reason) = jobs::failure(&delivery.info, &settlement, self.source.retries()) {
            Box::pin(jobs::record_failure(
                &self.publisher,
                &delivery.info,
                reason,
            ))
            .await;
        }
        #[cfg(feature = "otel")]
        consumer.end(&settlement, self.source.retries());
        self.observe_settled(&delivery, outcome, &settlement);
        let took = started.elapsed();
        self.tally.record(&settlement, took);
        meters.duration.record(took.as_secs_f64());
        meters.in_flight.decrement(1.0);
        meters.record(&settlement, self.source.retries());
        // The settler outlives every batch task; a closed channel means it is gone and the
        // message stays claimed, to be recovered.
        let steps = crate::steps::record_of(&self.publisher, &delivery.info);
        let _ = lane.done.send((delivery.token, settlement, permit, steps));
    }

    /// Runs the handler on one delivery and decides its settlement; `outcome` gets what the
    /// handler decided, when it did.
    async fn handle(
        &self,
        handler: &dyn ErasedHandler,
        d: &Delivery<Token<B>>,
        lane: &Lane<B>,
        outcome: &mut Option<HandlerOutcome>,
    ) -> Settlement {
        if let Some(settlement) = self.refuse(d, &lane.opts) {
            return settlement;
        }
        self.observe_called(d);
        let deadline = deadline(&lane.opts);
        let call = handler.call(&d.info, &d.payload, &self.publisher, deadline, &lane.stop);
        let run = AssertUnwindSafe(crate::outcome::noting_failure(call))
            .catch_unwind()
            .map(|handled| {
                handled.unwrap_or_else(|panic| {
                    let why = format!("handler panicked: {}", panic_message(&*panic));
                    (Handled::Broken(why), None)
                })
            });
        let run = within(deadline, run, || (Handled::TimedOut, None));
        let run = stopping::cut_off(run, &lane.cut, &d.info.steps);
        let (handled, failure) = match &d.info.cancel.0 {
            None => run.await,
            Some(signals) => tokio::select! {
                handled = run => handled,
                () = signals.expired(&d.info.message_id) => {
                    tracing::warn!(subscription = %self.name, message_id = %d.info.message_id,
                        grace = ?lane.opts.cancel_grace, "cancelled handler still running after its grace: dropped");
                    return Settlement::Cancelled;
                }
            },
        };
        *outcome = handled.decided();
        self.settlement(&d.info, handled, failure, lane).await
    }

    /// The dead letter of a delivery that must not reach the handler: unreadable, larger than
    /// `max_payload_bytes`, or past `max_attempts`.
    fn refuse(&self, d: &Delivery<Token<B>>, opts: &SubscribeOptions) -> Option<Settlement> {
        if let Some(why) = &d.unreadable {
            tracing::error!(subscription = %self.name, message_id = %d.info.message_id, error = %why,
                "message cannot be read: to the dead-letter list");
            #[cfg(feature = "otel")]
            crate::otel::failed(|| format!("message cannot be read: {why}"));
            return Some(Settlement::Dead {
                reason: format!("decode: {why}"),
            });
        }
        if let Some(max) = opts.max_payload_bytes
            && d.payload.len() > max
        {
            tracing::warn!(subscription = %self.name, message_id = %d.info.message_id,
                bytes = d.payload.len(), max, "payload larger than max_payload_bytes: to the dead-letter list");
            return Some(Settlement::Dead {
                reason: format!(
                    "too-large: {} bytes, more than max_payload_bytes {max}",
                    d.payload.len()
                ),
            });
        }
        if let Some(dead) = flows::failed_parent(&d.info) {
            tracing::warn!(subscription = %self.name, message_id = %d.info.message_id,
                "a child of this flow failed: the parent goes to the dead-letter list");
            return Some(dead);
        }
        if d.info.attempt > opts.max_attempts {
            // Recovered after a crash on its last attempt: do not run it again.
            tracing::warn!(subscription = %self.name, message_id = %d.info.message_id, attempt = d.info.attempt,
                "no attempts left: to the dead-letter list");
            return Some(Settlement::Dead {
                reason: "max-attempts".into(),
            });
        }
        None
    }

    /// The settlement of a delivery its handler ran on (publishing its reply, if any);
    /// `failure` is the error the handler ended with, for a retry's reason.
    async fn settlement(
        &self,
        info: &DeliveryInfo,
        handled: Handled,
        failure: Option<String>,
        lane: &Lane<B>,
    ) -> Settlement {
        let failure = failure.unwrap_or_default();
        let opts = &*lane.opts;
        if let Some(asleep) = crate::steps::asleep(info, handled.decided()) {
            return asleep;
        }
        if stopping::stopped(&handled, &lane.stop, &info.steps) {
            tracing::info!(subscription = %self.name, message_id = %info.message_id,
                cut_off = matches!(handled, Handled::CutOff),
                "stopping: the message goes back to its queue, no attempt spent");
            return snooze(info, Duration::ZERO, opts, "the app stopped".into());
        }
        match handled {
            Handled::Ack(None) => Settlement::Ack,
            // Boxed, like the job record in `finish`: a rare await kept out of every runner's slot.
            Handled::Ack(Some(reply)) => match Box::pin(self.publish_reply(reply)).await {
                Ok(()) => Settlement::Ack,
                Err(e) => {
                    tracing::warn!(subscription = %self.name, error = %e, "reply not published; retrying the message");
                    retry(info, None, opts, format!("reply not published: {e}"))
                }
            },
            Handled::Outcome(outcome) => {
                if outcome.is_ack() {
                    Settlement::Ack
                } else if outcome.is_drop() {
                    Settlement::Dead {
                        reason: "dropped".into(),
                    }
                } else if let Some(delay) = outcome.snooze_delay() {
                    snooze(info, delay, opts, failure)
                } else {
                    retry(info, outcome.retry_after_delay(), opts, failure)
                }
            }
            Handled::Failed(e) => {
                tracing::error!(subscription = %self.name, message_id = %info.message_id, error = %e, "message cannot be handled");
                #[cfg(feature = "otel")]
                crate::otel::failed(|| e.to_string());
                Settlement::Dead {
                    reason: e.to_string(),
                }
            }
            Handled::Broken(why) => {
                tracing::error!(subscription = %self.name, message_id = %info.message_id, error = %why, "handler failed");
                #[cfg(feature = "otel")]
                crate::otel::failed(|| why.clone());
                retry(info, None, opts, why)
            }
            Handled::TimedOut => {
                tracing::warn!(subscription = %self.name, message_id = %info.message_id,
                    attempt = info.attempt, timeout = ?opts.timeout,
                    "handler still running at its deadline: stopped, the message is retried");
                #[cfg(feature = "otel")]
                crate::otel::failed(|| "handler timed out".to_owned());
                lane.meters.timeouts.increment(1);
                self.tally.timed_out();
                match retry(info, None, opts, "timeout".into()) {
                    Settlement::Dead { .. } => Settlement::Dead {
                        reason: "timeout".into(),
                    },
                    again => again,
                }
            }
            // Settled above, by `stopping::stopped`.
            Handled::CutOff => snooze(info, Duration::ZERO, opts, "the app stopped".into()),
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
            None => self.publisher.send(vec![reply]).await.map(drop),
        }
    }
}

/// Hands the ids `heard` to `signals` until the stop, or the subscription is gone.
async fn forward_signals(
    mut heard: futures::stream::BoxStream<'static, String>,
    signals: std::sync::Weak<Signals>,
    stop: CancellationToken,
) {
    loop {
        let id = tokio::select! {
            id = heard.next() => id,
            () = stop.cancelled() => None,
        };
        let (Some(id), Some(signals)) = (id, signals.upgrade()) else {
            break;
        };
        signals.signal(id);
    }
}

/// When a handler call starting now must be done, by the subscription's `timeout` (none when
/// the timeout is too long for the clock to count to).
fn deadline(opts: &SubscribeOptions) -> Option<tokio::time::Instant> {
    opts.timeout
        .and_then(|t| tokio::time::Instant::now().checked_add(t))
}

/// `run`'s output, or `late()` once `deadline` passed (`run` is then dropped).
async fn within<T>(
    deadline: Option<tokio::time::Instant>,
    run: impl Future<Output = T>,
    late: impl FnOnce() -> T,
) -> T {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, run)
            .await
            .unwrap_or_else(|_| late()),
        None => run.await,
    }
}
