//! `ruststream::testing::TestApp` on the virtual clock: delays, `.at(..)`, retry backoff, key
//! expiry and a cluster topology, all in model time (an hour takes a few milliseconds), with no
//! server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::testing::TestApp;
use ruststream::{Settlement, subscriber};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

// Braces in an outgoing name are a template, so the tests name the tagged key with `.to(..)`.
outgoing!(Job);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Done {
    n: u32,
}

outgoing!(Done);

/// Acknowledges, or keeps asking for a retry when `retry` is set.
#[derive(Clone, Default)]
struct Worker {
    retry: bool,
    attempts: Arc<Mutex<Vec<u32>>>,
}

impl Handle<Job> for Worker {
    async fn handle(&self, _: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.attempts.lock().expect("lock").push(ctx.attempt());
        if self.retry {
            Err(HandlerOutcome::retry())
        } else {
            Ok(())
        }
    }
}

/// Replies to every job with a `Done`.
struct Replier;

impl Handle<Job, Done> for Replier {
    async fn handle(&self, job: &Job, _: &(), _: &mut Context<'_>) -> Result<Done, HandlerOutcome> {
        Ok(Done { n: job.n })
    }
}

fn app(source: RedisList, worker: Worker) -> RustStream {
    RustStream::new(AppInfo::new("testapp", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379").prefix("t:"),
        |b| {
            b.include(subscriber(source, worker).build());
        },
    )
}

fn broker_error(e: fred::error::Error) -> ruststream::Error {
    ruststream::redis::error::core(e)
}

#[tokio::test(start_paused = true)]
async fn a_delayed_publish_waits_for_the_clock() -> ruststream::Result<()> {
    let tb = TestApp::start(app(RedisList::new("{jobs}").reliable(), Worker::default())).await?;
    let job = Job { n: 1 };
    tb.broker::<RedisBroker>()
        .message(&job)
        .to("{jobs}")
        .delay(Duration::from_secs(3600))
        .publish()
        .await?;
    let b = tb.broker::<RedisBroker>();
    b.published::<Job>("{jobs}").assert_called_once().with(&job);
    assert!(b.published::<Job>("{jobs}").messages()[0].delayed);
    tb.advance(Duration::from_secs(59 * 60)).await?;
    tb.broker::<RedisBroker>()
        .subscriber("{jobs}")
        .assert_not_called();
    tb.advance(Duration::from_secs(2 * 60)).await?;
    tb.broker::<RedisBroker>()
        .subscriber("{jobs}")
        .assert_called_once()
        .with(&job)
        .settled(HandlerOutcome::ack());
    tb.shutdown().await
}

/// A bad option stops the app at startup with a `ConfigError` that names the option and the
/// subscription, and says the fix.
#[tokio::test(start_paused = true)]
async fn a_bad_option_is_refused_naming_the_option_and_the_subscription() {
    let source = RedisList::new("{orders}").reliable().max_attempts(0);
    let Err(e) = TestApp::start(app(source, Worker::default())).await else {
        panic!("max_attempts(0) must stop the app");
    };
    assert_eq!(e.kind(), ruststream::ErrorKind::Configuration, "{e}");
    let config = e.config_error().expect("a configuration error");
    assert_eq!(config.option, "max_attempts");
    assert_eq!(config.subject.as_deref(), Some("{orders}"));
    assert_eq!(
        e.to_string(),
        "configuration: `max_attempts` of `{orders}`: must be at least 1; set it to 1 or more (1 handles each message once, without retries)"
    );
}

#[tokio::test(start_paused = true)]
async fn at_reads_the_model_clock() -> ruststream::Result<()> {
    let tb = TestApp::start(app(RedisList::new("{jobs}").reliable(), Worker::default())).await?;
    tb.advance(Duration::from_secs(3600)).await?;
    let when = tb.now() + Duration::from_secs(600);
    tb.broker::<RedisBroker>()
        .message(&Job { n: 2 })
        .to("{jobs}")
        .at(when)
        .publish()
        .await?;
    tb.advance(Duration::from_secs(590)).await?;
    tb.broker::<RedisBroker>()
        .subscriber("{jobs}")
        .assert_not_called();
    tb.advance(Duration::from_secs(20)).await?;
    tb.broker::<RedisBroker>()
        .subscriber("{jobs}")
        .assert_called_once();
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn retry_backoff_runs_on_the_clock() -> ruststream::Result<()> {
    let worker = Worker {
        retry: true,
        ..Worker::default()
    };
    let source = RedisList::new("{jobs}")
        .reliable()
        .max_attempts(3)
        .retry(Backoff::exponential(Duration::from_secs(60)).jitter(0.0));
    let tb = TestApp::start(app(source, worker.clone())).await?;
    tb.broker::<RedisBroker>()
        .message(&Job { n: 3 })
        .to("{jobs}")
        .publish()
        .await?;
    let calls = |n| {
        tb.broker::<RedisBroker>()
            .subscriber("{jobs}")
            .assert_called(n)
            .calls()
            .len()
    };
    calls(1);
    tb.advance(Duration::from_secs(59)).await?;
    calls(1);
    tb.advance(Duration::from_secs(2)).await?;
    calls(2);
    // The second retry waits twice as long.
    tb.advance(Duration::from_secs(118)).await?;
    calls(2);
    tb.advance(Duration::from_secs(3)).await?;
    tb.broker::<RedisBroker>()
        .subscriber("{jobs}")
        .assert_called(3)
        .settled(HandlerOutcome::retry())
        .settled(Settlement::Dead {
            reason: "max-attempts".into(),
        });
    assert_eq!(*worker.attempts.lock().expect("lock"), [1, 2, 3]);
    let redis = tb.broker::<RedisBroker>().client().await?;
    let dead: i64 = redis.llen("t:{jobs}.dead").await.map_err(broker_error)?;
    assert_eq!(dead, 1);
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn a_reply_queue_expires_on_the_clock() -> ruststream::Result<()> {
    let app = RustStream::new(AppInfo::new("testapp", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379"),
        |b| {
            b.include(
                subscriber(RedisStream::new("uploads").group("g"), Replier)
                    .reply()
                    .to("{out}")
                    .build(),
            )
            .out_reply(list::Publish::new().ttl(Duration::from_secs(90)));
        },
    );
    let tb = TestApp::start(app).await?;
    tb.broker::<RedisBroker>()
        .message(&Job { n: 4 })
        .to("uploads")
        .publish()
        .await?;
    let b = tb.broker::<RedisBroker>();
    b.published::<Done>("{out}")
        .assert_called_once()
        .with(&Done { n: 4 });
    let redis = b.client().await?;
    let ttl: i64 = redis.pttl("{out}").await.map_err(broker_error)?;
    assert!(ttl > 0 && ttl <= 90_000, "ttl {ttl}");
    tb.advance(Duration::from_secs(91)).await?;
    let left: i64 = redis.exists("{out}").await.map_err(broker_error)?;
    assert_eq!(left, 0, "nobody fed the queue: it expired");
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn a_cluster_app_runs_on_a_cluster_model() -> ruststream::Result<()> {
    let app = RustStream::new(AppInfo::new("testapp", "0.0.0")).with_broker(
        RedisBroker::cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]),
        |b| {
            b.include(subscriber(RedisList::new("{jobs}").reliable(), Worker::default()).build());
        },
    );
    let tb = TestApp::start(app).await?;
    assert!(tb.model().is_cluster());
    tb.broker::<RedisBroker>()
        .message(&Job { n: 5 })
        .to("{jobs}")
        .publish()
        .await?;
    tb.broker::<RedisBroker>()
        .subscriber("{jobs}")
        .assert_called_once();
    let redis = tb.broker::<RedisBroker>().client().await?;
    let e = redis
        .custom::<Value, _>(fred::cmd!("LMOVE"), vec!["a", "b", "RIGHT", "LEFT"])
        .await
        .expect_err("two slots");
    assert!(e.details().starts_with("CROSSSLOT"), "{e:?}");
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn a_queue_with_partitions_spreads_over_the_cluster_models_slots() -> ruststream::Result<()> {
    let worker = Worker::default();
    let app = RustStream::new(AppInfo::new("testapp", "0.0.0")).with_broker(
        RedisBroker::cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]),
        |b| {
            let jobs = RedisList::new("jobs").reliable().partitions(4);
            b.include(subscriber(jobs, worker.clone()).build());
        },
    );
    let tb = TestApp::start(app).await?;
    let broker = tb.broker::<RedisBroker>();
    for n in 0..8 {
        broker
            .message(&Job { n })
            .to("jobs")
            .partition_key(format!("k{}", n % 2))
            .publish()
            .await?;
    }
    broker.subscriber("jobs").assert_called(8);
    let slots: std::collections::HashSet<u16> = (0..4)
        .map(|i| fred::util::redis_keyslot(format!("{{jobs:{i}}}").as_bytes()))
        .collect();
    assert_eq!(slots.len(), 4, "each partition in a slot of its own");
    assert_eq!(worker.attempts.lock().expect("lock").len(), 8);
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn a_unique_id_is_enqueued_once_per_window_on_the_clock() -> ruststream::Result<()> {
    let worker = Worker::default();
    let app = RustStream::new(AppInfo::new("testapp", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379"),
        |b| {
            b.include(subscriber(RedisList::new("{jobs}").reliable(), worker.clone()).build());
        },
    );
    let tb = TestApp::start(app).await?;
    let broker = tb.broker::<RedisBroker>();
    let window = Duration::from_secs(60);
    let jobs: Vec<Job> = (0..4).map(|n| Job { n }).collect();
    let publish = |job| {
        broker
            .message(job)
            .to("{jobs}")
            .id("nightly")
            .unique_for(window)
            .publish()
    };
    assert!(publish(&jobs[0]).await?.is_enqueued());
    let second = publish(&jobs[1]).await?;
    assert_eq!((second.enqueued, second.duplicates), (0, 1));
    broker.subscriber("{jobs}").assert_called(1);
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(
        !publish(&jobs[2]).await?.is_enqueued(),
        "still within the window"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(publish(&jobs[3]).await?.is_enqueued(), "the window ended");
    broker.subscriber("{jobs}").assert_called(2);
    tb.shutdown().await
}

/// Drops every job (to the dead-letter list).
#[derive(Clone, Default)]
struct Dropper(Arc<Mutex<Vec<u32>>>);

impl Handle<Job> for Dropper {
    async fn handle(&self, _: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.0.lock().expect("lock").push(ctx.attempt());
        Err(HandlerOutcome::drop())
    }
}

// The fault: a drop's settle that keeps failing (its dead-letter key a string: WRONGTYPE) is
// retried for over a minute of the clock; the shutdown must not wait for it.
#[tokio::test(start_paused = true)]
async fn a_settle_that_keeps_failing_does_not_hold_the_shutdown() -> ruststream::Result<()> {
    const TIMEOUT: Duration = Duration::from_millis(500);
    let source = || {
        RedisList::new("{jobs}")
            .reliable()
            .min_idle(Duration::from_secs(3))
    };
    let dropper = Dropper::default();
    let app = RustStream::new(AppInfo::new("testapp", "0.0.0"))
        .shutdown_timeout(TIMEOUT)
        .with_broker(
            RedisBroker::standalone("redis://localhost:6379").prefix("t:"),
            |b| {
                b.include(subscriber(source(), dropper.clone()).build());
            },
        );
    let mut tb = TestApp::start(app).await?;
    let client = tb.broker::<RedisBroker>().client().await?;
    let () = client
        .set("t:{jobs}.dead", "not a list", None, None, false)
        .await
        .map_err(broker_error)?;
    tb.broker::<RedisBroker>()
        .message(&Job { n: 1 })
        .to("{jobs}")
        .publish()
        .await?;
    tb.advance(Duration::from_millis(100)).await?;
    assert_eq!(*dropper.0.lock().expect("lock"), [1]);
    let worker = Worker::default();
    let stopped = tokio::time::Instant::now();
    tb.restart(app_with(source(), worker.clone(), TIMEOUT))
        .await?;
    let took = stopped.elapsed();
    assert!(took <= TIMEOUT + Duration::from_secs(1), "{took:?}");
    let processing: i64 = client
        .llen("t:{jobs}.processing")
        .await
        .map_err(broker_error)?;
    assert_eq!(processing, 1, "the entry stays claimed");
    let _: i64 = client.del("t:{jobs}.dead").await.map_err(broker_error)?;
    tb.advance(Duration::from_secs(5)).await?;
    assert_eq!(*worker.attempts.lock().expect("lock"), [2], "recovered");
    let processing: i64 = client
        .llen("t:{jobs}.processing")
        .await
        .map_err(broker_error)?;
    assert_eq!(processing, 0);
    tb.shutdown().await
}

fn app_with(source: RedisList, worker: Worker, timeout: Duration) -> RustStream {
    app(source, worker).shutdown_timeout(timeout)
}
