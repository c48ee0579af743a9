//! The mover's knobs: `schedule_interval` and `move_batch`, broker-wide on `RedisBroker` and per
//! subscription.
//!
//! - On `TestApp`'s virtual clock: an entry whose wake-up never came is moved within the
//!   interval, and later with a longer one; bad settings are refused at startup.
//! - On the model, the standalone server and the cluster (the harness): one mover call moves at
//!   most `move_batch` entries, and a subscription's own interval wins over the broker's.
//!
//! Entries "without a wake-up" are written into the delayed set with plain `HSET` + `ZADD`, as
//! a lost `PUBLISH` leaves them: only the interval's poll finds them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::redis::frame::encode_parts;
use ruststream::testing::TestApp;
use ruststream::{Headers, subscriber};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::harness;
use harness::{Env, on};

on!(
    [memory, standalone, cluster]
    one_mover_call_moves_at_most_move_batch,
    a_subscriptions_own_interval_wins_over_the_brokers
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}
outgoing!(Job);

/// Records when each job arrived (tokio's clock: virtual under TestApp); when `gate` is set,
/// holds each handler until the test adds a permit.
#[derive(Clone, Default)]
struct Arrivals {
    seen: Arc<Mutex<Vec<(u32, Instant)>>>,
    gate: Option<Arc<Semaphore>>,
}

impl Arrivals {
    fn gated() -> Self {
        Self {
            seen: Arc::default(),
            gate: Some(Arc::new(Semaphore::new(0))),
        }
    }

    fn seen(&self) -> Vec<(u32, Instant)> {
        self.seen.lock().expect("lock").clone()
    }
}

impl Handle<Job> for Arrivals {
    async fn handle(&self, job: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.seen
            .lock()
            .expect("lock")
            .push((job.n, Instant::now()));
        if let Some(gate) = &self.gate {
            gate.acquire()
                .await
                .map_err(|_| HandlerOutcome::retry())?
                .forget();
        }
        Ok(())
    }
}

/// Writes job `n` into `key`'s delayed set (full names under `prefix`), due at `due_ms`, with
/// no wake-up `PUBLISH`.
async fn schedule_silently(client: &Client, prefix: &str, key: &str, n: u32, due_ms: u64) {
    let id = format!("silent-{n}");
    let frame = encode_parts(&id, 1, &Headers::new(), format!("{{\"n\":{n}}}").as_bytes());
    let _: i64 = client
        .hset(
            format!("{prefix}{key}.delayed.payloads"),
            (id.as_str(), frame),
        )
        .await
        .expect("HSET");
    let _: i64 = client
        .zadd(
            format!("{prefix}{key}.delayed"),
            None,
            None,
            false,
            false,
            (due_ms as f64, id.as_str()),
        )
        .await
        .expect("ZADD");
}

const PREFIX: &str = "t:";

fn app(source: RedisList, h: Arrivals, broker: RedisBroker) -> RustStream {
    RustStream::new(AppInfo::new("scheduling", "0.0.0")).with_broker(broker, |b| {
        b.include(subscriber(source, h).build());
    })
}

fn broker() -> RedisBroker {
    RedisBroker::standalone("redis://localhost:6379").prefix(PREFIX)
}

/// How late job 1 arrives on TestApp when it is due 100 ms after the app started and no wake-up
/// comes, with the subscription's `interval`.
async fn lateness_without_wake_up(interval: Duration) -> ruststream::Result<Duration> {
    let h = Arrivals::default();
    let source = RedisList::new("{jobs}").schedule_interval(interval);
    let tb = TestApp::start(app(source, h.clone(), broker())).await?;
    let client = tb.broker::<RedisBroker>().client().await?;
    let due = Instant::now() + Duration::from_millis(100);
    schedule_silently(&client, PREFIX, "{jobs}", 1, tb.model().now_ms() + 100).await;
    tb.advance(interval + Duration::from_secs(1)).await?;
    let seen = h.seen();
    assert_eq!(seen.len(), 1, "the entry was moved within the interval");
    tb.shutdown().await?;
    Ok(seen[0].1 - due)
}

#[tokio::test(start_paused = true)]
async fn without_a_wake_up_an_entry_is_moved_within_the_interval() -> ruststream::Result<()> {
    let epsilon = Duration::from_millis(50);
    let short = Duration::from_secs(1);
    let long = Duration::from_secs(10);
    let late_short = lateness_without_wake_up(short).await?;
    let late_long = lateness_without_wake_up(long).await?;
    eprintln!("lateness without a wake-up: {late_short:?} ({short:?}), {late_long:?} ({long:?})");
    assert!(
        late_short <= short + epsilon,
        "{late_short:?} late with a {short:?} interval"
    );
    assert!(
        late_long <= long + epsilon,
        "{late_long:?} late with a {long:?} interval"
    );
    assert!(
        late_long > late_short + Duration::from_secs(5),
        "a longer interval makes a lost wake-up later: {late_long:?} vs {late_short:?}"
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn with_a_wake_up_the_interval_does_not_matter() -> ruststream::Result<()> {
    let h = Arrivals::default();
    let source = RedisList::new("{jobs}").schedule_interval(Duration::from_secs(60));
    let tb = TestApp::start(app(source, h.clone(), broker())).await?;
    let due = Instant::now() + Duration::from_millis(100);
    tb.broker::<RedisBroker>()
        .message(&Job { n: 1 })
        .to("{jobs}")
        .delay(Duration::from_millis(100))
        .publish()
        .await?;
    tb.advance(Duration::from_secs(1)).await?;
    let seen = h.seen();
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].1 - due <= Duration::from_millis(10),
        "{:?} late",
        seen[0].1 - due
    );
    tb.shutdown().await
}

/// Entries due one millisecond apart are each moved when due: after a move the reader waits
/// for the next due entry to the millisecond (with a 5 ms floor on that wait, the second one
/// arrived 4 ms late).
#[tokio::test(start_paused = true)]
async fn entries_due_a_millisecond_apart_are_each_moved_when_due() -> ruststream::Result<()> {
    let h = Arrivals::default();
    let source = RedisList::new("{jobs}").schedule_interval(Duration::from_secs(60));
    let tb = TestApp::start(app(source, h.clone(), broker())).await?;
    let published = Instant::now();
    for n in 0..5_u32 {
        tb.broker::<RedisBroker>()
            .message(&Job { n })
            .to("{jobs}")
            .delay(Duration::from_millis(100 + u64::from(n)))
            .publish()
            .await?;
    }
    tb.advance(Duration::from_millis(300)).await?;
    let seen = h.seen();
    assert_eq!(seen.len(), 5);
    for (n, at) in seen {
        let due = published + Duration::from_millis(100 + u64::from(n));
        assert!(at >= due, "job {n} moved before it was due");
        assert!(
            at - due <= Duration::from_millis(2),
            "job {n} moved {:?} late",
            at - due
        );
    }
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn bad_scheduling_settings_are_refused_at_startup() {
    let zero = Duration::ZERO;
    let cases: [(RedisList, RedisBroker, &str, Option<&str>, &str); 4] = [
        (
            RedisList::new("{jobs}").schedule_interval(zero),
            broker(),
            "schedule_interval",
            Some("{jobs}"),
            "must be longer than zero",
        ),
        (
            RedisList::new("{jobs}").move_batch(0),
            broker(),
            "move_batch",
            Some("{jobs}"),
            "must be between 1 and 1000 (it is 0)",
        ),
        (
            RedisList::new("{jobs}").move_batch(1001),
            broker(),
            "move_batch",
            Some("{jobs}"),
            "must be between 1 and 1000 (it is 1001)",
        ),
        (
            RedisList::new("{jobs}"),
            broker().schedule_interval(zero),
            "RedisBroker::schedule_interval",
            None,
            "must be longer than zero",
        ),
    ];
    for (source, broker, option, subject, problem) in cases {
        let Err(e) = TestApp::start(app(source, Arrivals::default(), broker)).await else {
            panic!("`{option}` must be refused");
        };
        let config = harness::config_error(&e);
        assert_eq!(config.option, option, "{e}");
        assert_eq!(config.subject.as_deref(), subject, "{e}");
        assert!(config.problem.starts_with(problem), "{e}");
        assert!(
            config
                .fix
                .contains(".schedule_interval(Duration::from_secs(1))")
                || config.fix.contains(".move_batch(128)"),
            "the error says how to fix it: {e}"
        );
    }
}

/// With one handler at a time held by the test, the reader runs one mover call, claims one
/// entry and then waits for a permit: what that call moved is all the delayed set lost.
async fn one_mover_call_moves_at_most_move_batch(env: &Env) {
    for batch in [3_u32, 5] {
        let h = Arrivals::gated();
        let key = format!("{{batch{batch}}}");
        let source = RedisList::new(key.as_str())
            .concurrency(1)
            .move_batch(batch);
        // A broker of its own each round: a stopped app closes its broker's connections.
        let broker = env.broker_with(|b| b);
        let running = env.start(app(source, h.clone(), broker.clone())).await;
        let jobs: Vec<Job> = (0..10).map(|n| Job { n }).collect();
        broker
            .publisher()
            .messages(&jobs)
            .to(key.as_str())
            .delay(Duration::from_millis(200))
            .publish()
            .await
            .expect("publish");
        let delayed = format!("{key}.delayed");
        let left = 10 - i64::from(batch);
        env.eventually("one handler runs", async || h.seen().len() == 1)
            .await;
        env.eventually("one batch moved", async || {
            env.zcard(&delayed).await == left && env.llen(&key).await == i64::from(batch) - 1
        })
        .await;
        // Nothing else may move while the handler is held: look again after a while.
        env.advance(Duration::from_millis(300)).await;
        assert_eq!(
            env.zcard(&delayed).await,
            left,
            "batch {batch}: one call moved {batch}"
        );
        assert_eq!(env.llen(&key).await, i64::from(batch) - 1);
        let gate = h.gate.clone().expect("gated");
        gate.add_permits(100);
        env.eventually("every job handled", async || h.seen().len() == 10)
            .await;
        env.stop(running).await;
    }
}

/// The broker polls every 60 s; `{own}` polls every 200 ms and `{inherits}` takes the broker's
/// interval, so only `{own}` finds its silently scheduled entry soon.
async fn a_subscriptions_own_interval_wins_over_the_brokers(env: &Env) {
    let (own, inherits) = (Arrivals::default(), Arrivals::default());
    let broker = env.broker_with(|b| b.schedule_interval(Duration::from_secs(60)));
    let app = RustStream::new(AppInfo::new("scheduling", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(broker, |b| {
            b.include(
                subscriber(
                    RedisList::new("{own}").schedule_interval(Duration::from_millis(200)),
                    own.clone(),
                )
                .build(),
            );
            b.include(subscriber(RedisList::new("{inherits}"), inherits.clone()).build());
        });
    let running = env.start(app).await;
    // A reader's first mover call finds anything already due: a job handled on each says that
    // call is behind them, so what is scheduled next waits for the poll.
    let publisher = env.broker().publisher();
    for key in ["{own}", "{inherits}"] {
        publisher
            .message(&Job { n: 0 })
            .to(key)
            .publish()
            .await
            .expect("publish");
    }
    env.eventually("both read once", async || {
        own.seen().len() == 1 && inherits.seen().len() == 1
    })
    .await;
    let started = Instant::now();
    schedule_silently(&env.client, &env.prefix, "{own}", 1, 0).await;
    schedule_silently(&env.client, &env.prefix, "{inherits}", 2, 0).await;
    env.eventually("{own} moved its entry", async || own.seen().len() == 2)
        .await;
    assert!(
        own.seen()[1].1 - started < Duration::from_secs(2),
        "{{own}} polls every 200 ms"
    );
    // A non-event: `{inherits}` must not move within the default interval (5 s) either, which
    // it would if the broker's 60 s did not apply to it.
    env.advance(Duration::from_secs(6).saturating_sub(started.elapsed()))
        .await;
    assert_eq!(inherits.seen().len(), 1, "{{inherits}} polls every 60 s");
    assert_eq!(env.zcard("{inherits}.delayed").await, 1);
    env.stop(running).await;
}
