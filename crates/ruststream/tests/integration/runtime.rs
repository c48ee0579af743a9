//! Subscriptions added to and stopped on a running app: `RunningApp::include` and
//! `RunningApp::stop_subscription`, on the model, the standalone server and the cluster (the
//! harness), and through `TestApp`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::testing::TestApp;
use ruststream::{RunningApp, subscriber};

use crate::harness;
use harness::{Env, on};

on!(
    [memory, standalone, cluster]
    an_added_subscription_handles_with_its_own_concurrency_and_a_stopped_one_leaves,
    a_refused_or_failed_addition_leaves_the_app_as_it_was,
    a_stream_group_added_at_runtime_is_created_and_read
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}
outgoing!(Job);

/// Counts handled jobs and the most handlers that ran at once; each takes `pause`.
#[derive(Clone, Default)]
struct Counter {
    pause: Duration,
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    handled: Arc<Mutex<Vec<u32>>>,
}

impl Counter {
    fn pausing(pause: Duration) -> Self {
        Self {
            pause,
            ..Self::default()
        }
    }

    fn handled(&self) -> usize {
        self.handled.lock().expect("lock").len()
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

impl Handle<Job> for Counter {
    async fn handle(&self, job: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.pause).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        self.handled.lock().expect("lock").push(job.n);
        Ok(())
    }
}

/// Asserts `health` is ready, and that it says nothing of `gone`. The model's connections are
/// not real ones and read as down to the health probes, so on the model only the second holds.
fn assert_ready(env: &Env, health: &ruststream::Health, gone: &str) {
    if let Err(why) = health.check() {
        assert!(env.is_memory(), "not ready: {why:?}");
        let named = format!("`{gone}`");
        assert!(why.iter().all(|w| !w.contains(&named)), "{why:?}");
    }
}

/// The addresses of the channels of a running app's AsyncAPI document.
fn channels(running: &RunningApp) -> Vec<String> {
    let doc = running.asyncapi();
    let mut addresses: Vec<String> = doc["channels"]
        .as_object()
        .expect("channels")
        .values()
        .map(|c| c["address"].as_str().expect("address").to_owned())
        .collect();
    addresses.sort();
    addresses
}

async fn publish(broker: &RedisBroker, key: &str, range: std::ops::Range<u32>) {
    let jobs: Vec<Job> = range.map(|n| Job { n }).collect();
    broker
        .publisher()
        .messages(&jobs)
        .to(key)
        .publish()
        .await
        .expect("publish");
}

async fn an_added_subscription_handles_with_its_own_concurrency_and_a_stopped_one_leaves(
    env: &Env,
) {
    let base = Counter::default();
    let mut running = env
        .start_with(|b| {
            b.include(subscriber(RedisList::new("{base}"), base.clone()).build());
        })
        .await;
    assert_eq!(channels(&running), ["{base}"]);

    let added = Counter::pausing(Duration::from_millis(50));
    let source = RedisList::new("{added}").reliable().concurrency(3);
    running
        .include(subscriber(source, added.clone()).build())
        .await
        .expect("added");
    assert_eq!(
        running.subscriptions().collect::<Vec<_>>(),
        ["{base}", "{added}"]
    );
    assert_eq!(channels(&running), ["{added}", "{base}"]);
    let health = running.health();
    let watched: Vec<String> = health.subscriptions().into_iter().map(|(n, _)| n).collect();
    assert_eq!(watched, ["{base}", "{added}"]);

    publish(&env.broker(), "{added}", 0..20).await;
    env.eventually("the added subscription handles 20", async || {
        added.handled() == 20
    })
    .await;
    assert_eq!(
        added.most(),
        3,
        "its own concurrency, reached and never passed"
    );
    let tallies = running.tallies();
    let tally = &tallies
        .iter()
        .find(|(n, _)| n == "{added}")
        .expect("tallied")
        .1;
    assert_eq!(tally.handled(), 20);
    assert_ready(env, &health, "");

    // A second subscriber of a running key gets the `#2` name, as at startup.
    let second = Counter::default();
    running
        .include(subscriber(RedisList::new("{base}"), second.clone()).build())
        .await
        .expect("a second subscriber of {base}");
    assert!(running.subscriptions().any(|n| n == "{base}#2"));

    running
        .remove_subscription("{added}")
        .await
        .expect("stopped");
    assert!(!running.subscriptions().any(|n| n == "{added}"));
    assert_eq!(channels(&running), ["{base}"]);
    assert!(health.subscriptions().iter().all(|(n, _)| n != "{added}"));
    assert_ready(env, &health, "{added}");
    assert!(running.tallies().iter().all(|(n, _)| n != "{added}"));

    publish(&env.broker(), "{added}", 20..25).await;
    env.eventually("the jobs wait in the queue", async || {
        env.llen("{added}").await == 5
    })
    .await;
    // A non-event: nothing reads them any more, so they stay.
    env.advance(Duration::from_millis(300)).await;
    assert_eq!(env.llen("{added}").await, 5);
    assert_eq!(added.handled(), 20);

    publish(&env.broker(), "{base}", 0..4).await;
    env.eventually("{base} and {base}#2 go on", async || {
        base.handled() + second.handled() == 4
    })
    .await;
    env.stop(running).await;
}

/// The error of adding `s` to `running`, which must fail.
async fn refused(
    running: &mut RunningApp,
    s: ruststream::Subscriber<RedisBroker>,
) -> ruststream::Error {
    running.include(s).await.expect_err("refused")
}

async fn a_refused_or_failed_addition_leaves_the_app_as_it_was(env: &Env) {
    let base = Counter::default();
    let mut running = env
        .start_with(|b| {
            b.include(subscriber(RedisList::new("{base}"), base.clone()).build());
        })
        .await;
    let before = channels(&running);

    // The same configuration error as at startup, word for word.
    let bad = || subscriber(RedisList::new("{bad}").concurrency(0), Counter::default()).build();
    let at_startup = env
        .try_start(env.app(|b| {
            b.include(bad());
        }))
        .await
        .expect_err("refused at startup");
    let at_runtime = refused(&mut running, bad()).await;
    assert_eq!(at_runtime.to_string(), at_startup.to_string());
    let config = harness::config_error(&at_runtime);
    assert_eq!(config, harness::config_error(&at_startup));
    assert_eq!(config.option, "concurrency", "{at_runtime}");
    assert_eq!(config.subject.as_deref(), Some("{bad}"), "{at_runtime}");

    if env.is_cluster() {
        // The slot rule: an untagged reliable queue cannot keep its keys in one slot.
        let untagged = subscriber(RedisList::new("plain").reliable(), Counter::default()).build();
        let e = refused(&mut running, untagged).await;
        let config = harness::config_error(&e);
        assert_eq!(config.option, "key", "{e}");
        assert!(config.fix.contains("hash tag"), "{e}");
    }

    // Group creation fails on a key of the wrong type: nothing is half-started.
    let _: () = env
        .client
        .set(env.key("{taken}"), "a string", None, None, false)
        .await
        .expect("SET");
    let stream = subscriber(RedisStream::new("{taken}").group("g"), Counter::default()).build();
    let e = refused(&mut running, stream).await.to_string();
    assert!(e.contains("cannot create consumer group"), "{e}");

    assert_eq!(running.subscriptions().collect::<Vec<_>>(), ["{base}"]);
    assert_eq!(channels(&running), before);
    assert_eq!(running.tallies().len(), 1);
    let health = running.health();
    assert_eq!(health.subscriptions().len(), 1);
    assert_ready(env, &health, "{taken}");
    publish(&env.broker(), "{base}", 0..3).await;
    env.eventually("the app runs on", async || base.handled() == 3)
        .await;
    env.stop(running).await;
}

async fn a_stream_group_added_at_runtime_is_created_and_read(env: &Env) {
    let mut running = env.start_with(|_| {}).await;
    let added = Counter::default();
    let source = RedisStream::new("{events}").group("late");
    running
        .include(subscriber(source, added.clone()).build())
        .await
        .expect("added");
    // `XPENDING` answers NOGROUP for a group that does not exist.
    env.cmd("XPENDING", vec![env.key("{events}").into(), "late".into()])
        .await
        .expect("the group `late` was created");
    // The publisher learned the key is a stream: this is an XADD.
    publish(&env.broker(), "{events}", 0..5).await;
    env.eventually("the group reads", async || added.handled() == 5)
        .await;
    env.stop(running).await;
}

fn test_app(base: Counter) -> RustStream {
    RustStream::new(AppInfo::new("runtime", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379").prefix("t:"),
        |b| {
            b.include(subscriber(RedisList::new("{base}"), base).build());
        },
    )
}

/// Publishes `jobs` to `{added}` through `tb` and waits until the app settles.
async fn tb_publish(tb: &TestApp, jobs: &[Job]) -> ruststream::Result<()> {
    let b = tb.broker::<RedisBroker>();
    b.messages(jobs).to("{added}").publish().await?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn testapp_adds_and_removes_a_subscription() -> ruststream::Result<()> {
    let mut tb = TestApp::start(test_app(Counter::default())).await?;
    let added = Counter::pausing(Duration::from_secs(1));
    let source = RedisList::new("{added}").reliable().concurrency(2);
    tb.include(subscriber(source, added.clone()).build())
        .await?;

    let jobs: Vec<Job> = (0..6).map(|n| Job { n }).collect();
    tb_publish(&tb, &jobs).await?;
    tb.advance(Duration::from_secs(5)).await?;
    tb.broker::<RedisBroker>()
        .subscriber("{added}")
        .assert_called(6)
        .settled(HandlerOutcome::ack());
    assert_eq!(added.most(), 2);
    let running = tb.running().expect("running");
    assert_eq!(channels(running), ["{added}", "{base}"]);

    tb.stop_subscription("{added}").await?;
    tb_publish(&tb, &[Job { n: 7 }]).await?;
    tb.advance(Duration::from_secs(60)).await?;
    tb.broker::<RedisBroker>()
        .subscriber("{added}")
        .assert_called(6);
    let client = tb.broker::<RedisBroker>().client().await?;
    let queued: i64 = client
        .llen("t:{added}")
        .await
        .map_err(ruststream::redis::error::core)?;
    assert_eq!(queued, 1, "the job waits for a reader");
    let running = tb.running().expect("running");
    assert_eq!(channels(running), ["{base}"]);
    let health = running.health();
    let watched: Vec<String> = health.subscriptions().into_iter().map(|(n, _)| n).collect();
    assert_eq!(watched, ["{base}"]);
    // The model's connections read as down to the probes; only what the app says of `{added}`
    // matters here: nothing.
    let said = health.check().err().unwrap_or_default();
    assert!(said.iter().all(|w| !w.contains("{added}")), "{said:?}");

    let e = tb
        .include(subscriber(RedisList::new("{bad}").move_batch(0), Counter::default()).build())
        .await
        .expect_err("refused");
    let config = harness::config_error(&e);
    assert_eq!(config.option, "move_batch", "{e}");
    assert_eq!(config.subject.as_deref(), Some("{bad}"), "{e}");
    assert!(config.problem.contains("between 1 and 1000"), "{e}");
    tb.shutdown().await
}
