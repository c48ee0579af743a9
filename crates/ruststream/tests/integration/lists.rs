//! Behaviour of list (and stream) subscriptions on the in-memory model, the standalone server
//! and the cluster (`name::memory`, `name::standalone`, `name::cluster`, see `harness`). Each
//! test has a key prefix of its own, so they run in parallel; the keys are inspected with raw
//! commands. A queue's keys share a hash tag (`{jobs}`, `{jobs}.processing`, ...), as a cluster
//! requires. Times are tokio's, so that they are virtual on the model.

use crate::harness;

use std::future::pending;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::prelude::*;
use harness::{Env, WAIT, bounded, on, stand, start, stop, unique, wait_until, with_db};
use ruststream::PublishPolicy;
use ruststream::prelude::*;
use ruststream_core::{Broker, OutMessage};
use ruststream_redis::frame::Frame;
use tokio::time::Instant;

on!(
    [memory, standalone, cluster] multi_thread:
    simple_list_delivers_in_publish_order,
    reliable_ack_leaves_no_key,
    reliable_retry_redelivers_then_dead_letters_with_max_attempts,
    reliable_drop_dead_letters_with_reason_dropped,
    reliable_retry_after_waits_in_the_delayed_set,
    a_panicking_handler_is_retried_and_the_app_goes_on,
    garbage_on_a_reliable_list_is_dead_lettered_and_reading_goes_on,
    garbage_on_a_simple_list_is_dead_lettered_and_reading_goes_on,
    garbage_without_a_dead_letter_list_is_removed,
    a_raw_lpush_is_a_payload_without_headers,
    published_headers_reach_the_context,
    shutdown_leaves_an_unfinished_entry_claimed,
    batches_of_every_size_run_side_by_side_once_each_and_idle_runners_stop_at_once,
    reply_ttl_is_rearmed_on_each_push,
    publish_with_ttl_rearms_the_expiry,
    the_key_prefix_is_applied,
    a_stream_entry_is_handled_and_acknowledged,
    delayed_publish_to_a_reliable_list,
    delayed_publish_to_a_simple_list,
    a_routed_stream_destination_gets_xadd_from_a_producer,
);

// Not on the model: the concurrency test samples the processing list in a loop that never
// waits (the model answers at once, so on the paused clock it would starve the app), and the
// model has no `XINFO`.
on!(
    [standalone, cluster] multi_thread:
    the_concurrency_limit_is_never_exceeded,
    two_subscriptions_of_a_stream_group_split_its_entries,
    two_readers_of_a_stream_subscription_share_its_permits,
);

// Standalone only: it counts the connections on a database, and a cluster has no databases.
on!([standalone] multi_thread: shutdown_closes_every_connection);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Done {
    n: u32,
}

outgoing!(Done);

fn info() -> AppInfo {
    AppInfo::new("lists-test", "0.0.0")
}

fn job_json(n: u32) -> Bytes {
    Bytes::from(serde_json::to_vec(&Job { n }).expect("json"))
}

/// The harness's recorder of every delivery ([`harness::Seen`]), settling as a `fn(&Job,
/// attempt)` says.
type Probe = harness::Seen<Job>;

impl Probe {
    fn ns(&self) -> Vec<u32> {
        self.seen().iter().map(|s| s.n).collect()
    }
}

/// An app with one subscriber on `broker`.
fn app_with(broker: &RedisBroker, source: RedisList, probe: &Probe) -> RustStream {
    let probe = probe.clone();
    RustStream::new(info()).with_broker(broker.clone(), move |b| {
        b.include(subscriber(source, probe).build());
    })
}

async fn publish(broker: &RedisBroker, key: &str, n: u32) {
    broker
        .publisher()
        .message(&Job { n })
        .to(key)
        .publish()
        .await
        .expect("publish");
}

// 1 ------------------------------------------------------------------------------------------

async fn simple_list_delivers_in_publish_order(env: &Env) {
    let broker = env.broker();
    broker.connect().await.expect("connect");
    // Half the entries wait in the queue before the app starts, half arrive while it runs.
    for n in 0..50 {
        publish(&broker, "{jobs}", n).await;
    }
    let probe = Probe::acking();
    let app = start(app_with(
        &broker,
        RedisList::new("{jobs}").concurrency(1),
        &probe,
    ))
    .await;
    for n in 50..100 {
        publish(&broker, "{jobs}", n).await;
    }
    wait_until("100 deliveries", WAIT, async || probe.count() >= 100).await;
    stop(app).await;

    assert_eq!(probe.ns(), (0..100).collect::<Vec<_>>());
    assert_eq!(env.llen("{jobs}").await, 0);
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}

// 2 ------------------------------------------------------------------------------------------

async fn reliable_ack_leaves_no_key(env: &Env) {
    let broker = env.broker();
    let probe = Probe::acking();
    let app = start(app_with(
        &broker,
        RedisList::new("{jobs}").reliable(),
        &probe,
    ))
    .await;
    publish(&broker, "{jobs}", 1).await;
    wait_until("one delivery", WAIT, async || probe.count() == 1).await;
    wait_until("the processing list to empty", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;
    stop(app).await;

    assert_eq!(env.llen("{jobs}").await, 0);
    assert_eq!(env.llen("{jobs}.processing").await, 0);
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
    assert_eq!(probe.seen()[0].attempt, 1);
}

async fn reliable_retry_redelivers_then_dead_letters_with_max_attempts(env: &Env) {
    let broker = env.broker();
    let probe = Probe::new(|_, _| Err(HandlerOutcome::retry()));
    let source = RedisList::new("{jobs}")
        .reliable()
        .retry(Backoff::immediate())
        .max_attempts(3);
    let app = start(app_with(&broker, source, &probe)).await;
    publish(&broker, "{jobs}", 7).await;
    wait_until("a dead letter", WAIT, async || {
        env.llen("{jobs}.dead").await == 1
    })
    .await;
    wait_until("the processing list to empty", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;
    stop(app).await;

    let seen = probe.seen();
    assert_eq!(
        seen.iter().map(|s| s.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert!(seen.iter().all(|s| s.id == seen[0].id && s.n == 7));
    let dead = env.frames("{jobs}.dead").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("max-attempts")
    );
    assert_eq!(dead[0].id, seen[0].id);
    assert_eq!(dead[0].attempt, 3);
    assert_eq!(dead[0].payload, job_json(7));
    assert_eq!(env.keys().await, ["{jobs}.dead"]);
}

async fn reliable_drop_dead_letters_with_reason_dropped(env: &Env) {
    let broker = env.broker();
    let probe = Probe::new(|_, _| Err(HandlerOutcome::drop()));
    let app = start(app_with(
        &broker,
        RedisList::new("{jobs}").reliable(),
        &probe,
    ))
    .await;
    broker
        .publisher()
        .message(&Job { n: 3 })
        .to("{jobs}")
        .header("tenant", "acme")
        .publish()
        .await
        .expect("publish");
    wait_until("a dead letter", WAIT, async || {
        env.llen("{jobs}.dead").await == 1
    })
    .await;
    wait_until("the processing list to empty", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;
    stop(app).await;

    assert_eq!(probe.count(), 1);
    let dead = env.frames("{jobs}.dead").await;
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("dropped")
    );
    assert_eq!(
        dead[0].headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    assert_eq!(dead[0].attempt, 1);
    assert_eq!(dead[0].payload, job_json(3));
    assert_eq!(env.keys().await, ["{jobs}.dead"]);
}

async fn reliable_retry_after_waits_in_the_delayed_set(env: &Env) {
    const DELAY: Duration = Duration::from_millis(300);
    let broker = env.broker();
    let probe = Probe::new(|_, attempt| {
        if attempt == 1 {
            Err(HandlerOutcome::retry_after(DELAY))
        } else {
            Ok(())
        }
    });
    let app = start(app_with(
        &broker,
        RedisList::new("{jobs}").reliable(),
        &probe,
    ))
    .await;
    publish(&broker, "{jobs}", 4).await;
    wait_until("the first delivery", WAIT, async || probe.count() == 1).await;
    wait_until("the retry in the delayed set", WAIT, async || {
        env.zcard("{jobs}.delayed").await == 1 || probe.count() > 1
    })
    .await;
    assert_eq!(probe.count(), 1, "came back before the delay");
    let id = probe.seen()[0].id.clone();
    let waiting: Option<Bytes> = env
        .client
        .hget(env.key("{jobs}.delayed.payloads"), id.as_str())
        .await
        .expect("HGET");
    let waiting = Frame::decode(waiting.expect("the payload waits in the hash under the id"));
    assert_eq!((waiting.attempt, waiting.id.as_str()), (2, id.as_str()));
    assert_eq!(waiting.payload, job_json(4));
    assert_eq!(env.llen("{jobs}").await, 0);
    assert_eq!(env.llen("{jobs}.processing").await, 0);

    wait_until("the second delivery", WAIT, async || probe.count() == 2).await;
    wait_until("the processing list to empty", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;
    stop(app).await;

    let seen = probe.seen();
    assert_eq!((seen[1].attempt, seen[1].id.as_str()), (2, id.as_str()));
    let waited = seen[1].at - seen[0].at;
    assert!(waited >= DELAY, "came back after {waited:?}");
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}

// 3 ------------------------------------------------------------------------------------------

async fn a_panicking_handler_is_retried_and_the_app_goes_on(env: &Env) {
    let broker = env.broker();
    let probe = Probe::new(|job, attempt| {
        assert!(!(job.n == 1 && attempt == 1), "handler panics on purpose");
        Ok(())
    });
    let source = RedisList::new("{jobs}")
        .reliable()
        .retry(Backoff::fixed(Duration::from_millis(50)));
    let app = start(app_with(&broker, source, &probe)).await;
    publish(&broker, "{jobs}", 1).await;
    wait_until("the panicking delivery", WAIT, async || probe.count() >= 1).await;
    for n in 2..=5 {
        publish(&broker, "{jobs}", n).await;
    }
    wait_until("the retry and the other entries", WAIT, async || {
        let seen = probe.seen();
        seen.iter().any(|s| s.n == 1 && s.attempt == 2)
            && (2..=5).all(|n| seen.iter().any(|s| s.n == n))
    })
    .await;
    wait_until("the processing list to empty", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;
    stop(app).await;

    let seen = probe.seen();
    let first: Vec<u32> = seen
        .iter()
        .filter(|s| s.n == 1)
        .map(|s| s.attempt)
        .collect();
    assert_eq!(first, [1, 2]);
    assert!(seen.iter().filter(|s| s.n != 1).all(|s| s.attempt == 1));
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}

// 4 ------------------------------------------------------------------------------------------

async fn garbage_goes_to_the_dead_letter_list(env: &Env, source: RedisList) {
    let broker = env.broker();
    let probe = Probe::acking();
    let app = start(app_with(&broker, source, &probe)).await;
    env.lpush_raw("{jobs}", "not json").await;
    publish(&broker, "{jobs}", 8).await;
    wait_until("the valid entry", WAIT, async || probe.count() == 1).await;
    wait_until("a dead letter", WAIT, async || {
        env.llen("{jobs}.dead").await == 1
    })
    .await;
    wait_until("the processing list to empty", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;
    stop(app).await;

    assert_eq!(probe.ns(), [8]);
    let dead = env.frames("{jobs}.dead").await;
    let reason = dead[0].headers.get("reason").cloned().unwrap_or_default();
    assert!(reason.starts_with("decode:"), "reason: {reason}");
    assert_eq!(dead[0].payload, Bytes::from_static(b"not json"));
    assert_eq!(dead[0].attempt, 1);
    assert_eq!(env.keys().await, ["{jobs}.dead"]);
}

async fn garbage_on_a_reliable_list_is_dead_lettered_and_reading_goes_on(env: &Env) {
    garbage_goes_to_the_dead_letter_list(env, RedisList::new("{jobs}").reliable()).await;
}

async fn garbage_on_a_simple_list_is_dead_lettered_and_reading_goes_on(env: &Env) {
    garbage_goes_to_the_dead_letter_list(env, RedisList::new("{jobs}")).await;
}

async fn garbage_without_a_dead_letter_list_is_removed(env: &Env) {
    let broker = env.broker();
    let probe = Probe::acking();
    let source = RedisList::new("{jobs}").reliable().no_dead_letter();
    let app = start(app_with(&broker, source, &probe)).await;
    env.lpush_raw("{jobs}", "not json").await;
    publish(&broker, "{jobs}", 9).await;
    wait_until("the valid entry", WAIT, async || probe.count() == 1).await;
    wait_until("queue and processing list to empty", WAIT, async || {
        env.llen("{jobs}").await == 0 && env.llen("{jobs}.processing").await == 0
    })
    .await;
    stop(app).await;

    assert_eq!(probe.ns(), [9]);
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}

// 5 ------------------------------------------------------------------------------------------

async fn a_raw_lpush_is_a_payload_without_headers(env: &Env) {
    let broker = env.broker();
    let probe = Probe::acking();
    let app = start(app_with(
        &broker,
        RedisList::new("{jobs}").reliable(),
        &probe,
    ))
    .await;
    env.lpush_raw("{jobs}", r#"{"n":1}"#).await;
    wait_until("the raw entry", WAIT, async || probe.count() == 1).await;
    wait_until("the processing list to empty", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;
    stop(app).await;

    let seen = &probe.seen()[0];
    assert_eq!((seen.n, seen.attempt), (1, 1));
    assert!(seen.headers.is_empty(), "headers: {:?}", seen.headers);
    assert!(!seen.id.is_empty(), "a raw entry still gets a message id");
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}

// 6 ------------------------------------------------------------------------------------------

async fn published_headers_reach_the_context(env: &Env) {
    let broker = env.broker();
    let probe = Probe::acking();
    let app = start(app_with(&broker, RedisList::new("{jobs}"), &probe)).await;
    broker
        .publisher()
        .message(&Job { n: 6 })
        .to("{jobs}")
        .header("tenant", "acme")
        .header("region", "eu")
        .publish()
        .await
        .expect("publish");
    publish(&broker, "{jobs}", 60).await;
    wait_until("two deliveries", WAIT, async || probe.count() == 2).await;
    stop(app).await;

    // Both may be handled at once, in either order.
    let seen = probe.seen();
    let with = seen
        .iter()
        .find(|s| s.n == 6)
        .expect("the job with headers");
    let without = seen.iter().find(|s| s.n == 60).expect("the job without");
    assert_eq!(with.header("tenant"), Some("acme"));
    assert_eq!(with.headers.get("region").map(String::as_str), Some("eu"));
    assert_eq!(with.headers.len(), 2);
    assert_eq!(
        without.header("tenant"),
        None,
        "headers do not leak to the next message"
    );
    assert!(without.headers.is_empty());
}

// 7 ------------------------------------------------------------------------------------------

/// A handler that never finishes.
#[derive(Clone, Default)]
struct Stuck(Arc<AtomicUsize>);

impl Handle<Job> for Stuck {
    async fn handle(&self, _: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.0.fetch_add(1, Ordering::SeqCst);
        pending::<()>().await;
        Ok(())
    }
}

async fn shutdown_leaves_an_unfinished_entry_claimed(env: &Env) {
    let broker = env.broker();
    let stuck = Stuck::default();
    let handler = stuck.clone();
    let app = RustStream::new(info())
        .shutdown_timeout(Duration::from_millis(200))
        .with_broker(broker.clone(), move |b| {
            b.include(subscriber(RedisList::new("{jobs}").reliable(), handler).build());
        });
    let app = start(app).await;
    publish(&broker, "{jobs}", 1).await;
    wait_until("the handler to start", WAIT, async || {
        stuck.0.load(Ordering::SeqCst) == 1
    })
    .await;

    let began = Instant::now();
    bounded(
        "shutdown with a stuck handler",
        Duration::from_secs(2),
        app.shutdown(),
    )
    .await
    .expect("shutdown");
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(200),
        "did not wait for the handler: {took:?}"
    );

    assert_eq!(env.llen("{jobs}").await, 0);
    let claimed = env.frames("{jobs}.processing").await;
    assert_eq!(claimed.len(), 1, "the unfinished entry stays claimed");
    assert_eq!((claimed[0].attempt, &claimed[0].payload), (1, &job_json(1)));
    assert!(!env.exists("{jobs}.dead").await);
}

/// Records each job it handles; the jobs below `gate` wait until `gate` of them have started.
#[derive(Clone, Default)]
struct Gated {
    gate: u32,
    started: Arc<AtomicUsize>,
    all_in: Arc<tokio::sync::Notify>,
    seen: Arc<Mutex<Vec<u32>>>,
}

impl Handle<Job> for Gated {
    async fn handle(&self, job: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        if job.n < self.gate {
            let waiting = self.all_in.notified();
            tokio::pin!(waiting);
            waiting.as_mut().enable();
            if self.started.fetch_add(1, Ordering::SeqCst) + 1 == self.gate as usize {
                self.all_in.notify_waiters();
            } else {
                waiting.await;
            }
        }
        self.seen.lock().expect("seen").push(job.n);
        Ok(())
    }
}

// A subscription's batch runners (`dispatch/runners.rs`): two claimed batches run side by side
// (the first 8 jobs, at concurrency 8 and claims of at most 4, each wait until all 8 have
// started, so a batch queued behind a busy runner hangs the test); batches of every size then
// reuse the runners' slots, each job handled once; and at stop the idle runners end at once,
// not at `shutdown_timeout`.
async fn batches_of_every_size_run_side_by_side_once_each_and_idle_runners_stop_at_once(env: &Env) {
    let broker = env.broker();
    let handler = Gated {
        gate: 8,
        ..Gated::default()
    };
    let seen = handler.seen.clone();
    let source = RedisList::new("{jobs}").reliable().concurrency(8);
    let app = RustStream::new(info())
        .shutdown_timeout(Duration::from_secs(60))
        .with_broker(broker.clone(), move |b| {
            b.include(subscriber(source, handler).build());
        });
    let app = start(app).await;
    for n in 0..8 {
        publish(&broker, "{jobs}", n).await;
    }
    wait_until("the 8 gated jobs, side by side", WAIT, async || {
        seen.lock().expect("seen").len() == 8
    })
    .await;
    let mut next = 8;
    for size in [1, 4, 2, 3, 1, 4] {
        for n in next..next + size {
            publish(&broker, "{jobs}", n).await;
        }
        next += size;
        wait_until("a batch handled", WAIT, async || {
            seen.lock().expect("seen").len() == next as usize
        })
        .await;
    }
    wait_until("the processing list to empty", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;

    let began = Instant::now();
    bounded("the stop", Duration::from_secs(30), app.shutdown())
        .await
        .expect("shutdown");
    let took = began.elapsed();
    assert!(took < Duration::from_secs(10), "the stop waited {took:?}");
    let mut handled = seen.lock().expect("seen").clone();
    handled.sort_unstable();
    assert_eq!(handled, (0..next).collect::<Vec<_>>());
    assert_eq!(env.llen("{jobs}").await, 0);
    assert_eq!(env.llen("{jobs}.processing").await, 0);
}

/// Client connections (of any type) whose selected database is `db`.
async fn connections_on(client: &Client, db: u8) -> usize {
    let list: String = client
        .custom(fred::cmd!("CLIENT"), vec!["LIST"])
        .await
        .expect("CLIENT LIST");
    let tag = format!(" db={db} ");
    list.lines().filter(|l| l.contains(&tag)).count()
}

async fn shutdown_closes_every_connection(env: &Env) {
    // A database no other test of this file selects, so its connections can be counted.
    const DB: u8 = 13;
    let url = with_db(env.url().expect("the standalone server"), DB);
    let client = stand::connect(Config::from_url(&url).expect("a valid URL")).await;
    let before = connections_on(&client, DB).await;
    for _ in 0..2 {
        let broker = RedisBroker::standalone(url.clone()).prefix(env.prefix.clone());
        let app = RustStream::new(info()).with_broker(broker, |b| {
            b.include(subscriber(RedisList::new("a").reliable(), Probe::acking()).build());
            b.include(subscriber(RedisList::new("b"), Probe::acking()).build());
        });
        let app = start(app).await;
        let running = connections_on(&client, DB).await;
        assert!(
            running >= before + 3,
            "a pool and two readers: {running} connections, {before} before"
        );
        stop(app).await;
        wait_until("the app's connections to close", WAIT, async || {
            connections_on(&client, DB).await == before
        })
        .await;
    }
    let _ = client.quit().await;
}

// 8 ------------------------------------------------------------------------------------------

/// Replies with the job's number.
struct Echo;

impl Handle<Job, Done> for Echo {
    async fn handle(&self, job: &Job, _: &(), _: &mut Context<'_>) -> Result<Done, HandlerOutcome> {
        Ok(Done { n: job.n })
    }
}

const TTL: Duration = Duration::from_secs(100);

/// Whether a `PTTL` reading is the 100 s TTL, freshly armed.
fn fresh_ttl(pttl: i64) -> bool {
    (90_000..=100_000).contains(&pttl)
}

async fn reply_ttl_is_rearmed_on_each_push(env: &Env) {
    let broker = env.broker();
    let app = RustStream::new(info()).with_broker(broker.clone(), |b| {
        b.include(
            subscriber(RedisList::new("in"), Echo)
                .reply()
                .to("out")
                .build(),
        )
        .out_reply(list::Publish::new().ttl(TTL));
    });
    let app = start(app).await;
    publish(&broker, "in", 1).await;
    wait_until("the first reply", WAIT, async || env.llen("out").await == 1).await;
    let pttl = env.pttl("out").await;
    assert!(fresh_ttl(pttl), "PTTL after the first reply: {pttl}");

    let _: i64 = env
        .client
        .pexpire(env.key("out"), 5_000, None)
        .await
        .expect("PEXPIRE");
    assert!(env.pttl("out").await <= 5_000);
    publish(&broker, "in", 2).await;
    wait_until("the second reply", WAIT, async || {
        env.llen("out").await == 2
    })
    .await;
    let pttl = env.pttl("out").await;
    assert!(fresh_ttl(pttl), "PTTL after the second reply: {pttl}");
    stop(app).await;

    let replies: Vec<Done> = env
        .frames("out")
        .await
        .iter()
        .rev()
        .map(|f| serde_json::from_slice(&f.payload).expect("a Done"))
        .collect();
    assert_eq!(replies, [Done { n: 1 }, Done { n: 2 }]);
}

async fn publish_with_ttl_rearms_the_expiry(env: &Env) {
    let broker = env.broker();
    broker.connect().await.expect("connect");
    let policy = PublishPolicy::List(list::Publish::new().ttl(TTL));
    let message = || OutMessage::new("direct", job_json(1));

    broker
        .publish_with(&policy, vec![message(), message()])
        .await
        .expect("publish");
    assert_eq!(env.llen("direct").await, 2);
    let pttl = env.pttl("direct").await;
    assert!(fresh_ttl(pttl), "PTTL after the first push: {pttl}");

    let _: i64 = env
        .client
        .pexpire(env.key("direct"), 5_000, None)
        .await
        .expect("PEXPIRE");
    broker
        .publish_with(&policy, vec![message()])
        .await
        .expect("publish");
    assert_eq!(env.llen("direct").await, 3);
    let pttl = env.pttl("direct").await;
    assert!(fresh_ttl(pttl), "PTTL after the second push: {pttl}");

    // A plain publish leaves the expiry alone.
    let _: i64 = env
        .client
        .pexpire(env.key("direct"), 5_000, None)
        .await
        .expect("PEXPIRE");
    broker
        .publish_with(&PublishPolicy::List(list::Publish::new()), vec![message()])
        .await
        .expect("publish");
    assert!(env.pttl("direct").await <= 5_000);
    Broker::close(&broker).await;
}

// 9 ------------------------------------------------------------------------------------------

/// Counts handlers running at once.
#[derive(Clone, Default)]
struct Busy {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
}

impl Handle<Job> for Busy {
    async fn handle(&self, _: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        // The work itself.
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        self.done.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn the_concurrency_limit_is_never_exceeded(env: &Env) {
    const N: u32 = 200;
    let broker = env.broker();
    broker.connect().await.expect("connect");
    let jobs: Vec<Job> = (0..N).map(|n| Job { n }).collect();
    broker
        .publisher()
        .messages(&jobs)
        .to("{jobs}")
        .publish()
        .await
        .expect("publish");
    assert_eq!(env.llen("{jobs}").await, i64::from(N));

    // Samples the processing list's length while the app runs.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let client = env.client.clone();
        let key = env.key("{jobs}.processing");
        let sampling = sampling.clone();
        tokio::spawn(async move {
            let (mut max, mut samples) = (0_i64, 0_u32);
            while sampling.load(Ordering::SeqCst) {
                let len: i64 = client.llen(&key).await.expect("LLEN");
                max = max.max(len);
                samples += 1;
            }
            (max, samples)
        })
    };

    let busy = Busy::default();
    let handler = busy.clone();
    let app = RustStream::new(info()).with_broker(broker.clone(), move |b| {
        b.include(subscriber(RedisList::new("{jobs}").reliable().concurrency(4), handler).build());
    });
    let app = start(app).await;
    wait_until("every entry handled", Duration::from_secs(30), async || {
        busy.done.load(Ordering::SeqCst) == N as usize
    })
    .await;
    wait_until("the processing list to empty", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;
    sampling.store(false, Ordering::SeqCst);
    let (max_processing, samples) = bounded("the sampler", WAIT, sampler)
        .await
        .expect("sampler");
    stop(app).await;

    let max = busy.max.load(Ordering::SeqCst);
    assert_eq!(max, 4, "most handlers at once");
    // Four being handled (or handed to the settler), and at most one batch of four being settled
    // while the next claim runs.
    assert!(
        (1..=8).contains(&max_processing),
        "most entries in the processing list: {max_processing} ({samples} samples)"
    );
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}

// 10 -----------------------------------------------------------------------------------------

async fn the_key_prefix_is_applied(env: &Env) {
    // Hash-tagged: the queue's keys share a slot on a cluster.
    let key = format!("{{{}}}", unique("prefix"));
    let prefixed = format!("p:{key}");
    // Raw commands on full key names here: the test's prefix is not the broker's.
    let lpush = async |k: &str, v: &str| {
        let _: i64 = env.client.lpush(k, v).await.expect("LPUSH");
    };
    let llen = async |k: &str| -> i64 { env.client.llen(k).await.expect("LLEN") };
    // An entry at the unprefixed key: a reader that forgot the prefix would take it first.
    lpush(&key, r#"{"n":99}"#).await;

    let broker = env.broker_with(|b| b.prefix("p:"));
    let probe = Probe::new(|job, _| {
        if job.n == 3 {
            Err(HandlerOutcome::drop())
        } else {
            Ok(())
        }
    });
    let app = start(app_with(
        &broker,
        RedisList::new(key.clone()).reliable(),
        &probe,
    ))
    .await;
    lpush(&prefixed, r#"{"n":1}"#).await;
    publish(&broker, &key, 2).await;
    publish(&broker, &key, 3).await;
    wait_until("three deliveries", WAIT, async || probe.count() == 3).await;
    wait_until("the dead letter", WAIT, async || {
        llen(&format!("{prefixed}.dead")).await == 1
    })
    .await;
    wait_until("the processing list to empty", WAIT, async || {
        llen(&format!("{prefixed}.processing")).await == 0
    })
    .await;
    stop(app).await;

    let mut ns = probe.ns();
    ns.sort_unstable();
    assert_eq!(ns, [1, 2, 3]);
    assert_eq!(env.keys_matching(&format!("{key}*")).await, [key.as_str()]);
    assert_eq!(llen(&key).await, 1, "the unprefixed entry is untouched");
    assert_eq!(
        env.keys_matching(&format!("{prefixed}*")).await,
        [format!("{prefixed}.dead")]
    );
    // Outside the test's prefix: not removed by the cleanup.
    env.delete_matching(&format!("{key}*")).await;
    env.delete_matching(&format!("{prefixed}*")).await;
}

// 11 -----------------------------------------------------------------------------------------

/// A stream delivery: the job's number, the attempt, the `tenant` header.
type Delivered = (u32, u32, Option<String>);

/// A stream handler that records deliveries.
#[derive(Clone, Default)]
struct StreamProbe(Arc<Mutex<Vec<Delivered>>>);

impl Handle<Job> for StreamProbe {
    async fn handle(&self, job: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.0.lock().expect("lock").push((
            job.n,
            ctx.attempt(),
            ctx.header("tenant").map(str::to_owned),
        ));
        Ok(())
    }
}

async fn pending_count(env: &Env, key: &str, group: &str) -> i64 {
    env.pending(key, group).await
}

/// Counts each handled job per subscription, so a test can tell which consumer got what.
#[derive(Clone, Default)]
struct Tally(Arc<Mutex<Vec<u32>>>);

impl Handle<Job> for Tally {
    async fn handle(&self, job: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        // Yield, so the other consumer gets a chance to read while this one handles.
        tokio::task::yield_now().await;
        self.0.lock().expect("lock").push(job.n);
        Ok(())
    }
}

/// The same stream subscription included twice is two consumers of the group (each a reader
/// with its own connection): every entry is handled once, by one of them, and none stays
/// pending.
/// Publishes the jobs `0..n` to the stream `{ev}`.
async fn publish_events(broker: RedisBroker, n: u32) {
    let jobs: Vec<Job> = (0..n).map(|n| Job { n }).collect();
    broker
        .route("{ev}", stream::Publish::new())
        .publisher()
        .messages(&jobs)
        .to("{ev}")
        .publish()
        .await
        .expect("publish");
}

async fn two_subscriptions_of_a_stream_group_split_its_entries(env: &Env) {
    const N: u32 = 2_000;
    let broker = env.broker();
    let (a, b) = (Tally::default(), Tally::default());
    let (ha, hb) = (a.clone(), b.clone());
    let app = RustStream::new(info()).with_broker(broker.clone(), move |br| {
        br.include(subscriber(RedisStream::new("{ev}").group("g").concurrency(8), ha).build());
        br.include(subscriber(RedisStream::new("{ev}").group("g").concurrency(8), hb).build());
    });
    let app = start(app).await;
    publish_events(broker.clone(), N).await;
    let handled = || a.0.lock().expect("lock").len() + b.0.lock().expect("lock").len();
    wait_until("every entry handled", Duration::from_secs(30), async || {
        handled() >= N as usize
    })
    .await;
    wait_until("no pending entry", WAIT, async || {
        pending_count(env, "{ev}", "g").await == 0
    })
    .await;
    stop(app).await;

    let mut all: Vec<u32> = a.0.lock().expect("lock").clone();
    all.extend(b.0.lock().expect("lock").iter());
    all.sort_unstable();
    assert_eq!(all, (0..N).collect::<Vec<_>>(), "each entry exactly once");
    let consumers: Vec<Value> = env
        .client
        .custom(
            fred::cmd!("XINFO", hash: fred::types::ClusterHash::from(env.key("{ev}").as_str())),
            vec!["CONSUMERS".to_owned(), env.key("{ev}"), "g".to_owned()],
        )
        .await
        .expect("XINFO CONSUMERS");
    assert_eq!(consumers.len(), 2, "two consumers in the group");
}

async fn two_readers_of_a_stream_subscription_share_its_permits(env: &Env) {
    const N: u32 = 400;
    let broker = env.broker();
    let busy = Busy::default();
    let handler = busy.clone();
    let source = RedisStream::new("{ev}")
        .group("g")
        .consumer("c")
        .concurrency(4)
        .readers(2);
    assert_eq!(source.reader_count(), 2);
    let app = RustStream::new(info()).with_broker(broker.clone(), move |b| {
        b.include(subscriber(source, handler).build());
    });
    let app = start(app).await;
    publish_events(broker.clone(), N).await;
    wait_until("every entry handled", Duration::from_secs(30), async || {
        busy.done.load(Ordering::SeqCst) == N as usize
    })
    .await;
    wait_until("no pending entry", WAIT, async || {
        pending_count(env, "{ev}", "g").await == 0
    })
    .await;
    stop(app).await;

    let max = busy.max.load(Ordering::SeqCst);
    assert!((2..=4).contains(&max), "most handlers at once: {max}");
    let names = crate::bounded::consumer_names(env, "{ev}").await;
    assert_eq!(names, ["c", "c-2"], "one consumer of the group per reader");
}

async fn a_stream_entry_is_handled_and_acknowledged(env: &Env) {
    let broker = env.broker();
    let probe = StreamProbe::default();
    let handler = probe.clone();
    let app = RustStream::new(info()).with_broker(broker.clone(), move |b| {
        b.include(subscriber(RedisStream::new("events").group("g"), handler).build());
    });
    let app = start(app).await;
    let _: Bytes = env
        .client
        .custom(
            fred::cmd!("XADD"),
            vec![
                env.key("events"),
                "*".into(),
                "payload".into(),
                r#"{"n":5}"#.into(),
                "tenant".into(),
                "acme".into(),
            ],
        )
        .await
        .expect("XADD");
    wait_until("the stream entry", WAIT, async || {
        !probe.0.lock().expect("lock").is_empty()
    })
    .await;
    wait_until("no pending entry", WAIT, async || {
        pending_count(env, "events", "g").await == 0
    })
    .await;
    stop(app).await;

    assert_eq!(
        *probe.0.lock().expect("lock"),
        [(5, 1, Some("acme".to_owned()))]
    );
    let len: i64 = env.client.xlen(env.key("events")).await.expect("XLEN");
    assert_eq!(len, 1, "no entry was added back");
    assert!(!env.exists("events.dead").await);
}

// 12 -----------------------------------------------------------------------------------------

async fn delayed_publish_arrives_after_its_delay(env: &Env, source: RedisList) {
    const DELAY: Duration = Duration::from_millis(300);
    let broker = env.broker();
    let probe = Probe::acking();
    let app = start(app_with(&broker, source, &probe)).await;

    let published = Instant::now();
    for _ in 0..2 {
        broker
            .publisher()
            .message(&Job { n: 12 })
            .to("{jobs}")
            .delay(DELAY)
            .id("x")
            .publish()
            .await
            .expect("publish");
    }
    assert!(
        published.elapsed() < DELAY,
        "publishing took too long to check the wait"
    );
    assert_eq!(
        env.zcard("{jobs}.delayed").await,
        1,
        "one entry waits for id `x`"
    );
    assert_eq!(env.hlen("{jobs}.delayed.payloads").await, 1);
    assert_eq!(env.llen("{jobs}").await, 0);
    assert_eq!(probe.count(), 0);

    wait_until("the delayed entry", WAIT, async || probe.count() >= 1).await;
    wait_until(
        "the delayed set, queue and processing list to empty",
        WAIT,
        async || {
            env.zcard("{jobs}.delayed").await == 0
                && env.llen("{jobs}").await == 0
                && env.llen("{jobs}.processing").await == 0
        },
    )
    .await;
    stop(app).await;

    let seen = probe.seen();
    assert_eq!(seen.len(), 1, "delivered once: {seen:?}");
    assert_eq!(
        (seen[0].n, seen[0].attempt, seen[0].id.as_str()),
        (12, 1, "x")
    );
    let waited = seen[0].at - published;
    assert!(waited >= DELAY, "arrived after {waited:?}");
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}

async fn delayed_publish_to_a_reliable_list(env: &Env) {
    delayed_publish_arrives_after_its_delay(env, RedisList::new("{jobs}").reliable()).await;
}

async fn delayed_publish_to_a_simple_list(env: &Env) {
    delayed_publish_arrives_after_its_delay(env, RedisList::new("{jobs}")).await;
}

/// A producer-only process publishes to a stream once the broker routes the key there.
async fn a_routed_stream_destination_gets_xadd_from_a_producer(env: &Env) {
    let producer = env
        .broker()
        .route("events", ruststream::stream::Publish::new());
    producer
        .publisher()
        .message(&Job { n: 7 })
        .to("events")
        .publish()
        .await
        .unwrap();
    let kind: String = env
        .client
        .custom(fred::cmd!("TYPE"), vec![env.key("events")])
        .await
        .unwrap();
    assert_eq!(kind, "stream");
}
