//! A queue spread over partitions (`RedisList::new(k).partitions(n)`, the same for streams): on
//! the in-memory model (what `TestApp` runs on), the standalone server and the cluster, where
//! each partition `{k:i}` lands in a slot of its own. Publishers spread messages round robin or
//! by partition key, a reader takes from every partition without starving any, and recovery,
//! retries, dead letters, pauses and the operator's views are each partition's own.

use crate::harness;

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use harness::{Env, Stuck, WAIT, bounded, on, start, stop, wait_until};
use ruststream::prelude::*;
use ruststream::{RedisSource, Source, list, stream};

on!(
    [memory, memory_cluster, standalone, cluster] multi_thread:
    round_robin_fills_every_partition_and_every_message_is_handled_once,
    a_partition_key_keeps_one_keys_messages_in_order,
    a_full_partition_does_not_starve_the_others,
    retries_and_dead_letters_stay_in_their_partition,
    a_dead_readers_claims_come_back_in_their_partition,
    a_partitioned_stream_is_read_by_one_group,
    a_paused_partition_holds_only_its_own_messages,
);

on!([memory, cluster] bad_partition_settings_stop_the_app_with_a_fix);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    key: String,
    n: u32,
}

outgoing!(Job);

type Seen = harness::Seen<Job>;

/// An app on `broker` with one subscriber; a 1 s shutdown timeout.
fn app(
    broker: &RedisBroker,
    source: impl Source<Broker = RedisBroker>,
    handler: impl Handle<Job>,
) -> RustStream {
    RustStream::new(AppInfo::new("partitions", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(broker.clone(), move |b| {
            b.include(subscriber(source, handler).build());
        })
}

/// Publishes jobs `0..count` to `to` (keyed by `key(n)` when given), one call each.
async fn publish(broker: &RedisBroker, to: &str, count: u32, key: Option<fn(u32) -> String>) {
    for n in 0..count {
        let job = Job {
            key: key.map_or_else(String::new, |k| k(n)),
            n,
        };
        let p = broker.publisher();
        let m = p.message(&job).to(to);
        let m = match key {
            Some(k) => m.partition_key(k(n)),
            None => m,
        };
        m.publish().await.expect("publish");
    }
}

/// A broker of the test whose publisher spreads `key` over `n` partitions.
fn partitioned(env: &Env, key: &'static str, n: u16) -> RedisBroker {
    env.broker_with(|b| b.route(key, list::Publish::new().partitions(n)))
}

async fn round_robin_fills_every_partition_and_every_message_is_handled_once(env: &Env) {
    let broker = partitioned(env, "jobs", 4);
    broker.connect().await.expect("connect");
    publish(&broker, "jobs", 40, None).await;
    for i in 0..4 {
        assert_eq!(
            env.llen(&format!("{{jobs:{i}}}")).await,
            10,
            "partition {i}"
        );
    }
    let seen = Seen::acking();
    let source = RedisList::new("jobs")
        .reliable()
        .partitions(4)
        .concurrency(8);
    let running = start(app(&broker, source, seen.clone())).await;
    wait_until("40 handled", WAIT, async || seen.count() == 40).await;
    for i in 0..4 {
        let processing = format!("{{jobs:{i}}}.processing");
        wait_until("settled", WAIT, async || env.llen(&processing).await == 0).await;
    }
    stop(running).await;
    let mut ns: Vec<u32> = seen.jobs().iter().map(|(j, _)| j.n).collect();
    ns.sort_unstable();
    assert_eq!(ns, (0..40).collect::<Vec<_>>(), "each once");
    for i in 0..4 {
        assert_eq!(env.llen(&format!("{{jobs:{i}}}")).await, 0);
    }
}

async fn a_partition_key_keeps_one_keys_messages_in_order(env: &Env) {
    let broker = partitioned(env, "jobs", 4);
    broker.connect().await.expect("connect");
    // Three keys, interleaved: each key's messages land on one partition, in publish order.
    publish(&broker, "jobs", 60, Some(|n| format!("customer-{}", n % 3))).await;
    let mut lens = Vec::new();
    for i in 0..4 {
        lens.push(env.llen(&format!("{{jobs:{i}}}")).await);
    }
    assert_eq!(lens.iter().sum::<i64>(), 60);
    assert!(
        lens.iter().all(|l| l % 20 == 0),
        "each key's 20 messages share a partition: {lens:?}"
    );
    let seen = Seen::acking();
    let running = start(app(
        &broker,
        RedisList::new("jobs").partitions(4).concurrency(1),
        seen.clone(),
    ))
    .await;
    wait_until("60 handled", WAIT, async || seen.count() == 60).await;
    stop(running).await;
    let mut by_key: HashMap<String, Vec<u32>> = HashMap::new();
    for (job, _) in seen.jobs() {
        by_key.entry(job.key).or_default().push(job.n);
    }
    assert_eq!(by_key.len(), 3);
    for (key, ns) in by_key {
        assert!(ns.is_sorted(), "{key} out of order: {ns:?}");
        assert_eq!(ns.len(), 20);
    }
}

async fn a_full_partition_does_not_starve_the_others(env: &Env) {
    let broker = env.broker();
    broker.connect().await.expect("connect");
    // 300 waiting on partition 0, 5 on partition 3: the 5 are not left until the 300 are done.
    for n in 0..300 {
        publish_raw(
            env,
            "{jobs:0}",
            &Job {
                key: "big".into(),
                n,
            },
        )
        .await;
    }
    for n in 0..5 {
        publish_raw(
            env,
            "{jobs:3}",
            &Job {
                key: "small".into(),
                n,
            },
        )
        .await;
    }
    let seen = Seen::acking();
    let source = RedisList::new("jobs")
        .reliable()
        .partitions(4)
        .concurrency(4);
    let running = start(app(&broker, source, seen.clone())).await;
    wait_until("305 handled", WAIT, async || seen.count() == 305).await;
    stop(running).await;
    let jobs = seen.jobs();
    let last_small = jobs
        .iter()
        .rposition(|(j, _)| j.key == "small")
        .expect("the small partition was read");
    assert!(
        last_small < 60,
        "the small partition's last message was handled {last_small}th of 305"
    );
}

async fn publish_raw(env: &Env, key: &str, job: &Job) {
    let frame = ruststream_redis::frame::Frame {
        id: format!("{}-{}", job.key, job.n),
        attempt: 1,
        headers: ruststream::Headers::new(),
        payload: serde_json::to_vec(job).expect("json").into(),
    };
    let _: i64 = env
        .client
        .lpush(env.key(key), frame.encode())
        .await
        .expect("lpush");
}

async fn retries_and_dead_letters_stay_in_their_partition(env: &Env) {
    let broker = partitioned(env, "jobs", 2);
    // Retried once, then dropped: each message ends in its own partition's dead-letter list.
    let seen = Seen::new(|_, attempt| {
        Err(if attempt == 1 {
            HandlerOutcome::retry_after(Duration::from_millis(50))
        } else {
            HandlerOutcome::drop()
        })
    });
    let source = RedisList::new("jobs").reliable().partitions(2);
    let running = start(app(&broker, source, seen.clone())).await;
    publish(&broker, "jobs", 6, Some(|n| format!("k{}", n % 2))).await;
    wait_until("6 dead letters", WAIT, async || {
        env.llen("{jobs:0}.dead").await + env.llen("{jobs:1}.dead").await == 6
    })
    .await;
    stop(running).await;
    for i in 0..2 {
        let dead = env.frames(&format!("{{jobs:{i}}}.dead")).await;
        let keys: Vec<String> = dead
            .iter()
            .map(|f| serde_json::from_slice::<Job>(&f.payload).expect("job").key)
            .collect();
        assert!(
            keys.iter().all(|k| *k == keys[0]),
            "one key per partition: {keys:?}"
        );
        assert!(dead.iter().all(|f| f.attempt == 2), "retried first");
        assert!(!env.exists(&format!("{{jobs:{i}}}.delayed")).await);
    }
    assert_eq!(seen.count(), 12);
}

async fn a_dead_readers_claims_come_back_in_their_partition(env: &Env) {
    const MIN_IDLE: Duration = Duration::from_millis(500);
    let broker = partitioned(env, "jobs", 2);
    let source = || {
        RedisList::new("jobs")
            .reliable()
            .partitions(2)
            .min_idle(MIN_IDLE)
    };
    let stuck = Stuck::default();
    let handler = stuck.clone();
    let first =
        start(app(&broker, source(), handler).shutdown_timeout(Duration::from_millis(100))).await;
    publish(&broker, "jobs", 4, None).await;
    wait_until("4 claimed", WAIT, async || stuck.started() == 4).await;
    stop(first).await;
    assert_eq!(env.llen("{jobs:0}.processing").await, 2);
    assert_eq!(env.llen("{jobs:1}.processing").await, 2);

    let seen = Seen::acking();
    let second = start(app(&broker, source(), seen.clone())).await;
    wait_until("the 4 recovered and handled", WAIT, async || {
        seen.count() == 4
    })
    .await;
    for i in 0..2 {
        let processing = format!("{{jobs:{i}}}.processing");
        wait_until("settled", WAIT, async || env.llen(&processing).await == 0).await;
        assert_eq!(env.zcard(&format!("{{jobs:{i}}}.claims")).await, 0);
    }
    stop(second).await;
}

async fn a_partitioned_stream_is_read_by_one_group(env: &Env) {
    let broker = env.broker();
    let seen = Seen::acking();
    let source = RedisStream::new("events")
        .group("g")
        .partitions(3)
        .concurrency(6);
    let running = start(app(&broker, source, seen.clone())).await;
    // The app's publisher learnt the route from the subscription: XADD, spread over 3.
    publish(&broker, "events", 30, None).await;
    wait_until("30 handled", WAIT, async || seen.count() == 30).await;
    stop(running).await;
    for i in 0..3 {
        let key = env.key(&format!("{{events:{i}}}"));
        let len: i64 = env.client.xlen(&key).await.expect("xlen");
        assert_eq!(len, 10, "partition {i}");
        let pending: fred::types::Value =
            env.client.xpending(&key, "g", ()).await.expect("xpending");
        let count = match pending {
            fred::types::Value::Array(v) => v.first().and_then(|c| c.as_i64()).unwrap_or(-1),
            _ => -1,
        };
        assert_eq!(count, 0, "partition {i} has nothing pending");
    }
}

async fn a_paused_partition_holds_only_its_own_messages(env: &Env) {
    let broker = partitioned(env, "jobs", 2);
    let source = RedisList::new("jobs").reliable().partitions(2);
    let operator = broker.operator(&[RedisSource::from(source.clone())]);
    let names: Vec<(String, Option<String>)> = operator
        .subscriptions()
        .iter()
        .map(|q| (q.name.clone(), q.partition_of.clone()))
        .collect();
    assert_eq!(
        names,
        [
            ("{jobs:0}".to_owned(), Some("jobs".to_owned())),
            ("{jobs:1}".to_owned(), Some("jobs".to_owned()))
        ]
    );
    operator.connect().await.expect("connect");
    operator.pause("{jobs:1}", "test").await.expect("pause");
    let seen = Seen::acking();
    let running = start(app(&broker, source, seen.clone())).await;
    publish(&broker, "jobs", 8, None).await;
    wait_until("partition 0's 4 handled", WAIT, async || seen.count() == 4).await;
    assert_eq!(
        env.llen("{jobs:1}").await,
        4,
        "the paused partition keeps its own"
    );
    // The whole queue by its name: both partitions.
    operator
        .resume("jobs")
        .await
        .expect("resume by the queue's name");
    wait_until("all 8 handled", WAIT, async || seen.count() == 8).await;
    operator.pause("jobs", "test").await.expect("pause both");
    assert!(env.exists("{jobs:0}.paused").await && env.exists("{jobs:1}.paused").await);
    bounded("stop while paused", WAIT, stop(running)).await;
}

async fn bad_partition_settings_stop_the_app_with_a_fix(env: &Env) {
    let cases = [
        (
            RedisList::new("{jobs}").reliable().partitions(4),
            "partitions",
            "{jobs}",
        ),
        (RedisList::new("jobs").partitions(0), "partitions", "jobs"),
        (
            RedisList::new("jobs")
                .reliable()
                .processing("jobs.p")
                .partitions(2),
            "processing",
            "jobs",
        ),
        (
            RedisList::new("jobs").dead_letter("dead").partitions(2),
            "dead_letter",
            "jobs",
        ),
    ];
    for (source, option, subject) in cases {
        let e = env
            .try_start(app(&env.broker(), source, Seen::acking()))
            .await
            .expect_err("refused");
        let config = harness::config_error(&e);
        assert_eq!(config.option, option, "{e}");
        assert_eq!(config.subject.as_deref(), Some(subject), "{e}");
    }
    let e = env
        .try_start(app(
            &env.broker(),
            RedisStream::new("{events}").group("g").partitions(2),
            Seen::acking(),
        ))
        .await
        .expect_err("refused");
    let config = harness::config_error(&e);
    assert_eq!(config.option, "partitions", "{e}");
    assert_eq!(config.fix, "name it without braces", "{e}");
}

#[tokio::test]
async fn the_asyncapi_document_says_how_many_partitions() {
    let app = RustStream::new(AppInfo::new("p", "0")).with_broker(
        RedisBroker::standalone("redis://127.0.0.1:1"),
        |b| {
            b.include(subscriber(RedisList::new("jobs").partitions(4), Seen::acking()).build());
            b.include(
                subscriber(
                    RedisStream::new("events").group("g").partitions(2),
                    Seen::acking(),
                )
                .build(),
            );
        },
    );
    let text = ruststream_core::asyncapi::document(&app).to_string();
    assert!(text.contains("\"partitions\":4"), "{text}");
    assert!(text.contains("\"partitions\":2"), "{text}");
    let _ = stream::Publish::new().partitions(2);
}
