//! Behaviour of list subscriptions on the in-memory model, the standalone server
//! and the cluster (`name::memory`, `name::standalone`, `name::cluster`, see `harness`). Each
//! test has a key prefix of its own, so they run in parallel; the keys are inspected with raw
//! commands. A queue's keys share a hash tag (`{jobs}`, `{jobs}.processing`, ...), as a cluster
//! requires. Times are tokio's, so that they are virtual on the model.

use crate::harness;

use std::time::Duration;

use fred::bytes::Bytes;
use fred::prelude::*;
use harness::{Env, WAIT, on, start, stop, unique, wait_until};
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
    reply_ttl_is_rearmed_on_each_push,
    publish_with_ttl_rearms_the_expiry,
    the_key_prefix_is_applied,
    delayed_publish_to_a_reliable_list,
    delayed_publish_to_a_simple_list,
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Job {
    pub(crate) n: u32,
}

outgoing!(Job);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Done {
    n: u32,
}

outgoing!(Done);

pub(crate) fn info() -> AppInfo {
    AppInfo::new("lists-test", "0.0.0")
}

pub(crate) fn job_json(n: u32) -> Bytes {
    Bytes::from(serde_json::to_vec(&Job { n }).expect("json"))
}

/// The harness's recorder of every delivery ([`harness::Seen`]), settling as a `fn(&Job,
/// attempt)` says.
pub(crate) type Probe = harness::Seen<Job>;

impl Probe {
    pub(crate) fn ns(&self) -> Vec<u32> {
        self.seen().iter().map(|s| s.n).collect()
    }
}

/// An app with one subscriber on `broker`.
pub(crate) fn app_with(broker: &RedisBroker, source: RedisList, probe: &Probe) -> RustStream {
    let probe = probe.clone();
    RustStream::new(info()).with_broker(broker.clone(), move |b| {
        b.include(subscriber(source, probe).build());
    })
}

pub(crate) async fn publish(broker: &RedisBroker, key: &str, n: u32) {
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

// 5 ------------------------------------------------------------------------------------------

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
    let kept = async |pattern: String| -> Vec<String> {
        let keys = env.keys_matching(&pattern).await;
        keys.into_iter()
            .filter(|k| !harness::is_history(k))
            .collect()
    };
    assert_eq!(kept(format!("{key}*")).await, [key.as_str()]);
    assert_eq!(llen(&key).await, 1, "the unprefixed entry is untouched");
    assert_eq!(
        kept(format!("{prefixed}*")).await,
        [format!("{prefixed}.dead")]
    );
    // Outside the test's prefix: not removed by the cleanup.
    env.delete_matching(&format!("{key}*")).await;
    env.delete_matching(&format!("{prefixed}*")).await;
}

// 6 ------------------------------------------------------------------------------------------

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
