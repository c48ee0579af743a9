//! Waits for signals (`ctx.wait_for`, `publisher.signal`): a waiting message is parked off its
//! queue, holding no worker, until its signal comes or its timeout passes; a signal sent before
//! the wait is kept for it; one sent while the handler runs is not lost to the park. On a
//! reliable list and a stream group, on the model and on Redis; a simple list refuses a wait.

use crate::harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Env, on};
use ruststream::Source;
use ruststream::prelude::*;
use ruststream::steps::{Signalled, WaitTimedOut};

use super::steps::{Order, start};

on!(
    [memory, standalone, cluster] multi_thread:
    a_signal_wakes_a_parked_message,
    a_signal_wakes_a_parked_message_on_a_stream,
    a_signal_sent_before_the_wait_is_kept,
    a_wait_times_out_and_a_late_signal_changes_nothing,
    a_signal_sent_while_the_handler_runs_is_not_lost,
    a_signal_sent_while_the_handler_runs_is_not_lost_on_a_stream,
    a_cancelled_parked_message_leaves_no_record,
);

on!([memory] a_simple_list_refuses_a_wait, pubsub_cannot_be_signalled);

/// The payment provider's webhook, as the signal's payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Paid {
    receipt: String,
}

/// Charges, waits for the `paid` signal (at most `timeout`), then ships; what the wait
/// answered is kept in `seen`.
#[derive(Clone)]
struct Checkout {
    timeout: Duration,
    /// Whether it charges before the wait.
    charge: bool,
    /// Sends the signal from inside the handler, after its wait began: the race with the park.
    signal_inside: Option<String>,
    charges: Arc<Mutex<u32>>,
    calls: Arc<Mutex<u32>>,
    seen: Arc<Mutex<Vec<Result<Paid, WaitTimedOut>>>>,
    errors: Arc<Mutex<Vec<harness::StepFailure>>>,
}

impl Checkout {
    fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            charge: true,
            signal_inside: None,
            charges: Arc::default(),
            calls: Arc::default(),
            seen: Arc::default(),
            errors: Arc::default(),
        }
    }

    fn seen(&self) -> Vec<Result<Paid, WaitTimedOut>> {
        self.seen.lock().expect("lock").clone()
    }

    fn calls(&self) -> u32 {
        *self.calls.lock().expect("lock")
    }

    fn charges(&self) -> u32 {
        *self.charges.lock().expect("lock")
    }
}

impl Handle<Order> for Checkout {
    async fn handle(&self, _: &Order, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        *self.calls.lock().expect("lock") += 1;
        if self.charge {
            ctx.step("charge", || async {
                *self.charges.lock().expect("lock") += 1;
                Ok::<_, String>(())
            })
            .await
            .inspect_err(harness::keep_failure(&self.errors))?;
        }
        let paid = ctx.wait_for::<Paid>("paid", self.timeout).await;
        if let (Err(_), Some(dest)) = (&paid, &self.signal_inside) {
            let sent = ctx
                .publisher()
                .signal(dest, "order-1", "paid", &paid_of("r-1"))
                .await;
            assert_eq!(
                sent.expect("signal"),
                Signalled::Kept,
                "the message is running"
            );
        }
        let paid = paid.inspect_err(harness::keep_failure(&self.errors))?;
        self.seen.lock().expect("lock").push(paid);
        Ok(())
    }
}

fn paid_of(receipt: &str) -> Paid {
    Paid {
        receipt: receipt.into(),
    }
}

/// Sends `paid` to order-1 of `to`.
async fn signal(producer: &RedisBroker, to: &str, receipt: &str) -> Signalled {
    producer
        .publisher()
        .signal(to, "order-1", "paid", &paid_of(receipt))
        .await
        .expect("signal")
}

/// The message parks (in the delayed set, not claimed, one call, one charge); the signal
/// answers `Woken` and the message comes back at once: the charge replays, the wait returns
/// the payload; the ack removes the record; a signal then is only kept, with the record's ttl.
async fn parks_and_wakes(
    env: &Env,
    source: impl Source<Broker = RedisBroker>,
    producer: RedisBroker,
    key: &str,
    claimed: impl AsyncFn() -> i64,
) {
    let checkout = Checkout::new(Duration::from_secs(3600));
    let running = start(env, source, &producer, key, &checkout).await;
    env.eventually("parked", async || {
        env.zcard(&format!("{key}.delayed")).await == 1 && claimed().await == 0
    })
    .await;
    assert_eq!(checkout.calls(), 1);
    assert!(checkout.seen().is_empty(), "still waiting");
    assert_eq!(signal(&producer, key, "r-9").await, Signalled::Woken);
    env.eventually("woken and done", async || {
        checkout.seen().len() == 1 && claimed().await == 0
    })
    .await;
    env.stop(running).await;
    assert_eq!(checkout.seen(), [Ok(paid_of("r-9"))]);
    assert_eq!(checkout.calls(), 2);
    assert_eq!(checkout.charges(), 1, "the charge replayed");
    let record = format!("{key}.steps:order-1");
    assert!(!env.exists(&record).await, "the ack removed the record");
    assert_eq!(env.zcard(&format!("{key}.delayed")).await, 0);
    assert_eq!(signal(&producer, key, "r-11").await, Signalled::Kept);
    let ttl = env.pttl(&record).await;
    assert!(
        ttl > 0 && ttl <= 7 * 24 * 3600 * 1000,
        "a signal to a finished message expires: {ttl}"
    );
}

async fn a_signal_wakes_a_parked_message(env: &Env) {
    let list = RedisList::new("{sg}").reliable();
    parks_and_wakes(env, list, env.broker(), "{sg}", async || {
        env.llen("{sg}.processing").await
    })
    .await;
}

async fn a_signal_wakes_a_parked_message_on_a_stream(env: &Env) {
    let stream = RedisStream::new("{sgs}").group("g");
    let producer = env.broker_with(|b| b.route("{sgs}", ruststream::stream::Publish::new()));
    parks_and_wakes(env, stream, producer, "{sgs}", async || {
        env.pending("{sgs}", "g").await
    })
    .await;
}

/// A signal sent before the message is published is kept (a second is not: the first stands);
/// the wait reads it and never parks.
async fn a_signal_sent_before_the_wait_is_kept(env: &Env) {
    let producer = env.broker();
    producer.connect().await.expect("connect");
    assert_eq!(signal(&producer, "{sk}", "early").await, Signalled::Kept);
    assert_eq!(
        signal(&producer, "{sk}", "again").await,
        Signalled::Already,
        "the first signal stands"
    );
    let checkout = Checkout::new(Duration::from_secs(3600));
    let running = start(
        env,
        RedisList::new("{sk}").reliable(),
        &producer,
        "{sk}",
        &checkout,
    )
    .await;
    env.eventually("done", async || {
        checkout.seen().len() == 1 && env.llen("{sk}.processing").await == 0
    })
    .await;
    env.stop(running).await;
    assert_eq!(checkout.seen(), [Ok(paid_of("early"))]);
    assert_eq!(checkout.calls(), 1, "never parked");
    assert!(!env.exists("{sk}.steps:order-1").await);
}

/// No signal: the message comes back at its timeout and the wait answers `WaitTimedOut`. A
/// signal after the deadline, while the record still holds the wait, answers `Late` and
/// records nothing.
async fn a_wait_times_out_and_a_late_signal_changes_nothing(env: &Env) {
    let timeout = Duration::from_millis(400);
    let checkout = Checkout::new(timeout);
    let producer = env.broker();
    let running = start(
        env,
        RedisList::new("{sto}").reliable(),
        &producer,
        "{sto}",
        &checkout,
    )
    .await;
    env.eventually("parked", async || env.zcard("{sto}.delayed").await == 1)
        .await;
    env.eventually("timed out", async || checkout.seen().len() == 1)
        .await;
    env.stop(running).await;
    assert_eq!(checkout.seen(), [Err(WaitTimedOut)]);
    assert_eq!(checkout.calls(), 2);
    assert_eq!(checkout.charges(), 1);
    // A wait recorded long ago, as a record that outlived its message would hold it.
    let record = env.key("{sto}.steps:late");
    env.cmd(
        "HSET",
        vec![record.as_str().into(), "wait:paid".into(), "1000".into()],
    )
    .await
    .expect("HSET");
    let late = producer
        .publisher()
        .signal("{sto}", "late", "paid", &paid_of("r"))
        .await
        .expect("signal");
    assert_eq!(late, Signalled::Late);
    assert_eq!(env.hlen("{sto}.steps:late").await, 1, "nothing recorded");
}

/// The handler sends the signal itself after its wait began, before its park's settle: the
/// settle finds the signal and makes the message due at once, well before its hour's timeout.
async fn signalled_while_running(
    env: &Env,
    source: impl Source<Broker = RedisBroker>,
    producer: RedisBroker,
    key: &str,
    claimed: impl AsyncFn() -> i64,
) {
    let checkout = Checkout {
        signal_inside: Some(key.into()),
        ..Checkout::new(Duration::from_secs(3600))
    };
    let running = start(env, source, &producer, key, &checkout).await;
    env.eventually("done", async || {
        checkout.seen().len() == 1 && claimed().await == 0
    })
    .await;
    env.stop(running).await;
    assert_eq!(checkout.seen(), [Ok(paid_of("r-1"))]);
    assert_eq!(checkout.calls(), 2);
    assert_eq!(checkout.charges(), 1);
}

async fn a_signal_sent_while_the_handler_runs_is_not_lost(env: &Env) {
    let list = RedisList::new("{sr}").reliable();
    signalled_while_running(env, list, env.broker(), "{sr}", async || {
        env.llen("{sr}.processing").await
    })
    .await;
}

async fn a_signal_sent_while_the_handler_runs_is_not_lost_on_a_stream(env: &Env) {
    let stream = RedisStream::new("{srs}").group("g");
    let producer = env.broker_with(|b| b.route("{srs}", ruststream::stream::Publish::new()));
    signalled_while_running(env, stream, producer, "{srs}", async || {
        env.pending("{srs}", "g").await
    })
    .await;
}

/// A simple list cannot park a message: the wait fails, saying why.
async fn a_simple_list_refuses_a_wait(env: &Env) {
    let checkout = Checkout {
        charge: false,
        ..Checkout::new(Duration::from_secs(60))
    };
    let running = start(
        env,
        RedisList::new("{ssw}"),
        &env.broker(),
        "{ssw}",
        &checkout,
    )
    .await;
    env.eventually("refused", async || {
        !checkout.errors.lock().expect("lock").is_empty()
    })
    .await;
    env.stop(running).await;
    let errors = checkout.errors.lock().expect("lock").clone();
    let config = errors[0].1.as_ref().expect("a configuration error");
    assert_eq!(config.option, "steps", "{errors:?}");
    assert_eq!(config.subject.as_deref(), Some("{ssw}"), "{errors:?}");
    assert!(config.problem.contains("redeliver"), "{errors:?}");
}

/// Pub/Sub keeps nothing: a signal to a channel is refused, saying why.
async fn pubsub_cannot_be_signalled(env: &Env) {
    let producer = env.broker_with(|b| b.route("news", ruststream::pubsub::Publish::new()));
    producer.connect().await.expect("connect");
    let e = producer
        .publisher()
        .signal("news", "order-1", "paid", &paid_of("r"))
        .await
        .expect_err("refused");
    let config = harness::config_error(&e);
    assert_eq!(config.option, "signal", "{e}");
    assert_eq!(config.subject.as_deref(), Some("news"), "{e}");
    assert!(config.problem.contains("Pub/Sub"), "{e}");
}

/// A cancel of a parked message removes it from the delayed set and deletes its step record.
async fn a_cancelled_parked_message_leaves_no_record(env: &Env) {
    let checkout = Checkout::new(Duration::from_secs(3600));
    let producer = env.broker();
    let running = start(
        env,
        RedisList::new("{sc}").reliable(),
        &producer,
        "{sc}",
        &checkout,
    )
    .await;
    env.eventually("parked", async || env.zcard("{sc}.delayed").await == 1)
        .await;
    assert!(env.exists("{sc}.steps:order-1").await);
    assert_eq!(
        env.zcard("{sc}.delayed.parked").await,
        1,
        "the park's settle indexed it for the parked gauge"
    );
    let cancelled = producer
        .publisher()
        .cancel("{sc}", "order-1")
        .await
        .expect("cancel");
    env.stop(running).await;
    assert_eq!(cancelled, ruststream::CancelOutcome::Removed);
    assert_eq!(env.zcard("{sc}.delayed").await, 0);
    assert_eq!(
        env.zcard("{sc}.delayed.parked").await,
        0,
        "the cancel took it out of the parked set"
    );
    assert!(
        !env.exists("{sc}.steps:order-1").await,
        "its record went with it"
    );
    assert_eq!(checkout.calls(), 1);
}
