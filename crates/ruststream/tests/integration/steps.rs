//! Durable steps and sleeps (`ctx.step`, `ctx.sleep`): a redelivered message replays the steps it
//! recorded instead of running them again; a sleep puts the message back delayed and replays
//! what came before it; the settle that acknowledges the message removes its record. On a
//! reliable list and a stream group, on the model and on Redis; a 30-day sleep on the model's
//! clock; a simple list refuses steps.

use crate::harness;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::proxy::Proxy;
use harness::{Env, WAIT, on, wait_until};
use ruststream::prelude::*;
use ruststream::steps::StepError;
use ruststream::{RunningApp, Source, subscriber};
use tokio::time::Instant;

on!(
    [memory, standalone, cluster] multi_thread:
    a_recorded_step_is_not_run_again,
    steps_replay_on_a_stream,
    a_sleep_on_a_stream,
);

on!(
    [memory, standalone] multi_thread:
    a_sleep_frees_the_worker_and_replays_what_came_before,
    a_stop_after_the_charge_does_not_charge_again,
    a_failed_step_records_its_error,
);

on!([standalone] multi_thread: a_step_record_held_up_by_an_outage_lands_and_the_step_runs_once);

on!([memory] a_thirty_day_sleep_on_the_virtual_clock, a_simple_list_refuses_steps, a_step_name_used_twice_is_an_error);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Order {
    pub(crate) n: u32,
}

outgoing!(Order);

/// Order `n`.
pub(crate) fn order(n: u32) -> Order {
    Order { n }
}

/// A checkout of three steps (charge, reserve, email), with a sleep before the email when
/// `nap` is set; `reserve` fails on its first run when `flaky`.
#[derive(Clone, Default)]
struct Checkout {
    runs: Arc<Mutex<HashMap<&'static str, u32>>>,
    /// Each handler call's start, and the receipt the email step saw, once done.
    calls: Arc<Mutex<Vec<Instant>>>,
    done: Arc<Mutex<Vec<(String, Instant)>>>,
    flaky: bool,
    /// `reserve` never returns on its first run: the worker dies there.
    hang: bool,
    nap: Option<Duration>,
    errors: Arc<Mutex<Vec<harness::StepFailure>>>,
}

impl Checkout {
    /// Counts one run of `step`; answers how many there were.
    fn ran(&self, step: &'static str) -> u32 {
        let mut runs = self.runs.lock().expect("lock");
        let n = runs.entry(step).or_default();
        *n += 1;
        *n
    }

    fn runs(&self, step: &str) -> u32 {
        self.runs
            .lock()
            .expect("lock")
            .get(step)
            .copied()
            .unwrap_or(0)
    }

    /// How often charge, reserve and email ran.
    fn counts(&self) -> [u32; 3] {
        ["charge", "reserve", "email"].map(|step| self.runs(step))
    }

    fn done(&self) -> Vec<(String, Instant)> {
        self.done.lock().expect("lock").clone()
    }

    fn calls(&self) -> usize {
        self.calls.lock().expect("lock").len()
    }
}

impl Handle<Order> for Checkout {
    async fn handle(
        &self,
        order: &Order,
        _: &(),
        ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        self.calls.lock().expect("lock").push(Instant::now());
        let key = ctx.step_key("charge");
        let receipt: String = ctx
            .step("charge", || async {
                self.ran("charge");
                Ok::<_, String>(format!("{key}:{}", order.n))
            })
            .await
            .inspect_err(harness::keep_failure(&self.errors))?;
        ctx.step("reserve", || async {
            let first = self.ran("reserve") == 1;
            if first && self.hang {
                std::future::pending::<()>().await;
            }
            if first && self.flaky {
                Err("the stock service is down".to_owned())
            } else {
                Ok(())
            }
        })
        .await?;
        if let Some(nap) = self.nap {
            ctx.sleep(nap).await?;
        }
        let sent: String = ctx
            .step("email", || async {
                self.ran("email");
                Ok::<_, String>(receipt.clone())
            })
            .await?;
        self.done.lock().expect("lock").push((sent, Instant::now()));
        Ok(())
    }
}

/// Publishes order `n` to `to` with the id `order-1`.
async fn publish(env: &Env, to: &str, n: u32) {
    env.broker()
        .publisher()
        .message(&Order { n })
        .to(to)
        .id("order-1")
        .publish()
        .await
        .expect("publish");
}

/// Starts `handler` on `source`, then publishes order `order-1` to `to` through `producer`.
pub(crate) async fn start<H>(
    env: &Env,
    source: impl Source<Broker = RedisBroker>,
    producer: &RedisBroker,
    to: &str,
    handler: &H,
) -> RunningApp
where
    H: Handle<Order> + Clone + Send + Sync + 'static,
{
    let h = handler.clone();
    let running = env
        .start_with(move |b| {
            b.include(subscriber(source, h).build());
        })
        .await;
    producer.connect().await.expect("connect");
    producer
        .publisher()
        .message(&Order { n: 7 })
        .to(to)
        .id("order-1")
        .publish()
        .await
        .expect("publish");
    running
}

/// Runs `checkout` on `source` for one order (id `order-1`) until `done` holds.
async fn run(
    env: &Env,
    source: impl Source<Broker = RedisBroker>,
    producer: RedisBroker,
    to: &str,
    checkout: &Checkout,
    done: impl AsyncFnMut() -> bool,
) -> Instant {
    let sent = Instant::now();
    let running = start(env, source, &producer, to, checkout).await;
    wait_until("done", WAIT, done).await;
    env.stop(running).await;
    sent
}

/// The second step fails once: the retry replays the first from its record (it is not run
/// again), runs the second again, then the third; the ack removes the record.
async fn a_recorded_step_is_not_run_again(env: &Env) {
    let checkout = Checkout {
        flaky: true,
        ..Checkout::default()
    };
    let list = RedisList::new("{st}")
        .reliable()
        .retry(Backoff::fixed(Duration::from_millis(50)));
    run(env, list, env.broker(), "{st}", &checkout, async || {
        checkout.done().len() == 1 && env.llen("{st}.processing").await == 0
    })
    .await;
    assert_eq!(checkout.calls(), 2, "one retry");
    assert_eq!(
        checkout.counts(),
        [1, 2, 1],
        "charge replayed from its record"
    );
    assert_eq!(
        checkout.done()[0].0,
        "order-1:charge:7",
        "the recorded result"
    );
    assert!(
        !env.exists("{st}.steps:order-1").await,
        "the ack removed the record"
    );
    assert_eq!(env.llen("{st}.dead").await, 0);
}

/// The same on a stream group: the retry is a new entry of the same message id.
async fn steps_replay_on_a_stream(env: &Env) {
    let checkout = Checkout {
        flaky: true,
        ..Checkout::default()
    };
    let stream = RedisStream::new("{sst}")
        .group("g")
        .retry(Backoff::fixed(Duration::from_millis(50)));
    let producer = env.broker_with(|b| b.route("{sst}", ruststream::stream::Publish::new()));
    run(env, stream, producer, "{sst}", &checkout, async || {
        checkout.done().len() == 1 && env.pending("{sst}", "g").await == 0
    })
    .await;
    assert_eq!(checkout.counts(), [1, 2, 1]);
    assert!(
        !env.exists("{sst}.steps:order-1").await,
        "the ack removed the record"
    );
}

/// After a sleep of `nap` on `key`: two calls, each step run once, the email after the sleep,
/// the record gone.
async fn assert_slept(env: &Env, checkout: &Checkout, sent: Instant, nap: Duration, key: &str) {
    assert_eq!(checkout.calls(), 2, "one call before the sleep, one after");
    assert_eq!(checkout.counts(), [1, 1, 1]);
    assert!(
        checkout.done()[0].1 - sent >= nap,
        "emailed after the sleep"
    );
    assert!(!env.exists(&format!("{key}.steps:order-1")).await);
}

/// A sleep ends the call and puts the message back delayed, with no attempt spent; the second
/// call replays charge and reserve, passes the sleep, and emails.
async fn a_sleep_frees_the_worker_and_replays_what_came_before(env: &Env) {
    let nap = Duration::from_millis(300);
    let checkout = Checkout {
        nap: Some(nap),
        ..Checkout::default()
    };
    let list = RedisList::new("{ssl}").reliable();
    let sent = run(env, list, env.broker(), "{ssl}", &checkout, async || {
        checkout.done().len() == 1 && env.llen("{ssl}.processing").await == 0
    })
    .await;
    assert_slept(env, &checkout, sent, nap, "{ssl}").await;
}

/// A sleep on a stream group: the entry is acknowledged and added again after the sleep, with
/// its record; the second call replays charge and reserve.
async fn a_sleep_on_a_stream(env: &Env) {
    let nap = Duration::from_millis(300);
    let checkout = Checkout {
        nap: Some(nap),
        ..Checkout::default()
    };
    let stream = RedisStream::new("{ssn}").group("g");
    let producer = env.broker_with(|b| b.route("{ssn}", ruststream::stream::Publish::new()));
    let sent = run(env, stream, producer, "{ssn}", &checkout, async || {
        checkout.done().len() == 1 && env.pending("{ssn}", "g").await == 0
    })
    .await;
    assert_slept(env, &checkout, sent, nap, "{ssn}").await;
}

/// A 30-day sleep takes no worker and no real time: the message waits in the delayed set with
/// its record, which outlives the sleep. The app is even down for the month (on the model's
/// clock, an idle app's timers would take a while to tick through it).
async fn a_thirty_day_sleep_on_the_virtual_clock(env: &Env) {
    let month = Duration::from_secs(30 * 24 * 3600);
    let checkout = Checkout {
        nap: Some(month),
        ..Checkout::default()
    };
    let start = || {
        let h = checkout.clone();
        env.start_with(move |b| {
            b.include(subscriber(RedisList::new("{sm}").reliable(), h).build());
        })
    };
    let running = start().await;
    let sent = Instant::now();
    publish(env, "{sm}", 1).await;
    env.eventually("asleep", async || env.zcard("{sm}.delayed").await == 1)
        .await;
    env.stop(running).await;
    assert_eq!(env.llen("{sm}.processing").await, 0, "no worker holds it");
    assert!(
        env.pttl("{sm}.steps:order-1").await > i64::try_from(month.as_millis()).expect("ms"),
        "the record outlives the sleep"
    );
    env.advance(month).await;
    let running = start().await;
    env.eventually("woken", async || checkout.done().len() == 1)
        .await;
    env.stop(running).await;
    assert!(checkout.done()[0].1 - sent >= month);
    assert_eq!(checkout.calls(), 2, "one call before the sleep, one after");
    assert_eq!(checkout.counts(), [1, 1, 1]);
    assert!(!env.exists("{sm}.steps:order-1").await);
}

/// A simple list cannot redeliver: a step there fails, saying why, and records nothing.
async fn a_simple_list_refuses_steps(env: &Env) {
    let checkout = Checkout::default();
    run(
        env,
        RedisList::new("{sim}"),
        env.broker(),
        "{sim}",
        &checkout,
        async || !checkout.errors.lock().expect("lock").is_empty(),
    )
    .await;
    let errors = checkout.errors.lock().expect("lock").clone();
    let config = errors[0].1.as_ref().expect("a configuration error");
    assert_eq!(config.option, "steps", "{errors:?}");
    assert_eq!(config.subject.as_deref(), Some("{sim}"), "{errors:?}");
    assert!(config.problem.contains("redeliver"), "{errors:?}");
    assert_eq!(checkout.runs("charge"), 0);
    assert!(env.keys_matching("*steps*").await.is_empty());
}

/// Two steps of one name in one run: the second is an error, and nothing runs twice. So is a
/// step named as the record's own fields (`cursor`, `sleep:..`, `wait:..`, `signal:..`).
async fn a_step_name_used_twice_is_an_error(env: &Env) {
    #[derive(Clone, Default)]
    struct Twice(Arc<Mutex<Vec<String>>>);
    impl Handle<Order> for Twice {
        async fn handle(
            &self,
            _: &Order,
            _: &(),
            ctx: &mut Context<'_>,
        ) -> Result<(), HandlerOutcome> {
            ctx.step("a", || async { Ok::<_, String>(1) }).await?;
            let again: Result<u32, StepError<String>> = ctx.step("a", || async { Ok(2) }).await;
            self.0.lock().expect("lock").push(format!("{again:?}"));
            for own in ["cursor", "wait:paid"] {
                let r: Result<u32, StepError<String>> = ctx.step(own, || async { Ok(3) }).await;
                self.0.lock().expect("lock").push(format!("{r:?}"));
            }
            Err(HandlerOutcome::drop())
        }
    }
    let twice = Twice::default();
    let h = twice.clone();
    let running = env
        .start_with(move |b| {
            b.include(subscriber(RedisList::new("{tw}").reliable(), h).build());
        })
        .await;
    publish(env, "{tw}", 1).await;
    env.eventually("dropped", async || env.llen("{tw}.dead").await == 1)
        .await;
    env.stop(running).await;
    let seen = twice.0.lock().expect("lock").clone();
    assert!(seen[0].contains("used twice"), "{seen:?}");
    assert!(seen[1].contains("the record's own"), "{seen:?}");
    assert!(seen[2].contains("the record's own"), "{seen:?}");
    assert!(
        !env.exists("{tw}.steps:order-1").await,
        "the dead letter removed the record"
    );
}

/// A worker stops while its reserve step hangs, after the charge was recorded: the handler is
/// cut off at the shutdown timeout and its message goes back to the queue at once, so another
/// worker takes it without waiting for `min_idle` (a minute) and replays the charge from its
/// record.
async fn a_stop_after_the_charge_does_not_charge_again(env: &Env) {
    let checkout = Checkout {
        hang: true,
        ..Checkout::default()
    };
    let list = || {
        RedisList::new("{scr}")
            .reliable()
            .min_idle(Duration::from_secs(60))
    };
    let h = checkout.clone();
    let first = env
        .start_with(move |b| {
            b.include(subscriber(list(), h).build());
        })
        .await;
    publish(env, "{scr}", 3).await;
    env.eventually("charged", async || checkout.runs("reserve") == 1)
        .await;
    assert!(
        env.exists("{scr}.steps:order-1").await,
        "the charge is recorded"
    );
    env.stop(first).await;
    assert_eq!(
        (env.llen("{scr}.processing").await, env.llen("{scr}").await),
        (0, 1),
        "back on the queue"
    );
    let h = checkout.clone();
    let second = env
        .start_with(move |b| {
            b.include(subscriber(list(), h).build());
        })
        .await;
    env.eventually("taken again and done", async || checkout.done().len() == 1)
        .await;
    env.stop(second).await;
    assert_eq!(
        checkout.counts(),
        [1, 2, 1],
        "the charge replayed from its record"
    );
    assert!(!env.exists("{scr}.steps:order-1").await);
}

/// The charge's record write is held up (the connection is cut and Redis stays away for 1 s,
/// longer than the command timeout): the write is tried again until it lands, so no error
/// reaches the handler, the charge runs once, and the order completes once.
async fn a_step_record_held_up_by_an_outage_lands_and_the_step_runs_once(env: &Env) {
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    let broker = RedisBroker::standalone(proxy.url())
        .prefix(&env.prefix)
        .command_timeout(Duration::from_millis(300));
    let checkout = Checkout::default();
    let h = checkout.clone();
    let list = RedisList::new("{sf}")
        .reliable()
        .retry(Backoff::fixed(Duration::from_millis(50)));
    let app = RustStream::new(AppInfo::new("steps-fault", "0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(broker, move |b| {
            b.include(subscriber(list, h).build());
        });
    let running = env.start(app).await;
    // The write's arguments hold the charge's JSON result, the receipt.
    proxy.outage_on(b"\"order-1:charge:7\"", Duration::from_secs(1));
    publish(env, "{sf}", 7).await;
    wait_until(
        "done after the outage",
        Duration::from_secs(20),
        async || checkout.done().len() == 1 && env.llen("{sf}.processing").await == 0,
    )
    .await;
    env.stop(running).await;
    assert!(!proxy.outage_armed(), "the write was held");
    let errors = checkout.errors.lock().expect("lock").clone();
    assert!(errors.is_empty(), "the write was tried again: {errors:?}");
    assert_eq!(
        checkout.runs("charge"),
        1,
        "its record landed after the outage"
    );
    assert_eq!(checkout.runs("email"), 1);
    assert_eq!(checkout.done().len(), 1);
    assert_eq!(env.llen("{sf}.dead").await, 0, "nothing lost");
    assert!(!env.exists("{sf}.steps:order-1").await);
}

/// A step that fails records its error for the operator (`failed:<name>`) beside the results,
/// while the message waits for its retry.
async fn a_failed_step_records_its_error(env: &Env) {
    let checkout = Checkout {
        flaky: true,
        ..Checkout::default()
    };
    let list = RedisList::new("{sfe}")
        .reliable()
        .retry(Backoff::fixed(Duration::from_secs(3600)));
    let running = start(env, list, &env.broker(), "{sfe}", &checkout).await;
    env.eventually("retrying", async || env.zcard("{sfe}.delayed").await == 1)
        .await;
    env.stop(running).await;
    let record = env.key("{sfe}.steps:order-1");
    let failed = env
        .cmd(
            "HGET",
            vec![record.as_str().into(), "failed:reserve".into()],
        )
        .await
        .expect("HGET");
    assert_eq!(
        failed.as_bytes_str().as_deref(),
        Some("\"the stock service is down\""),
        "{failed:?}"
    );
    assert_eq!(checkout.counts(), [1, 1, 0]);
}
