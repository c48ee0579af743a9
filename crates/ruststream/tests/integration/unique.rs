//! Unique publishes: `.id(x).unique_for(window)` enqueues a message only when no
//! publish of `x` to that destination holds a window, across every publishing process, for
//! messages due now and delayed ones, on lists, partitioned lists and streams; the publish says
//! whether it enqueued ([`Enqueued`]). Each test runs on the model (virtual time) and on the
//! stand's servers; several brokers (each with its own connections, as separate processes have)
//! publish and several apps consume.

use crate::harness;

use std::time::Duration;

use fred::prelude::*;
use harness::proxy::Proxy;
use harness::{Env, on};
use ruststream::prelude::*;
use ruststream::redis::error::PubSubError;
use ruststream::{Enqueued, list, stream};

on!(
    [memory, memory_cluster, standalone, cluster] multi_thread:
    concurrent_publishes_of_one_id_enqueue_it_once,
    the_window_ends_and_the_id_is_published_again,
    a_delayed_unique_message_holds_its_window,
    a_stream_destination_holds_the_window,
    a_partitioned_destination_holds_the_window_across_partitions,
    a_window_holds_across_priority_levels,
);

on!([memory, standalone] a_unique_publish_is_refused_where_it_cannot_hold);

on!([standalone] a_publish_whose_reply_is_lost_counts_its_message_once);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

const Q: &str = "{uq}";
const WINDOW: Duration = Duration::from_secs(60);

/// The harness's recorder, acknowledging everything.
type Seen = harness::Seen<Job>;

/// Publishes job `n` as id `id`, unique for `window`.
async fn publish_unique(broker: &RedisBroker, to: &str, id: &str, window: Duration) -> Enqueued {
    broker
        .publisher()
        .message(&Job { n: 0 })
        .to(to)
        .id(id)
        .unique_for(window)
        .publish()
        .await
        .expect("publish")
}

/// The sum of what `results` enqueued, and of their duplicates.
fn totals(results: &[Enqueued]) -> (usize, usize) {
    results
        .iter()
        .fold((0, 0), |(e, d), r| (e + r.enqueued, d + r.duplicates))
}

async fn concurrent_publishes_of_one_id_enqueue_it_once(env: &Env) {
    let seen = Seen::default();
    let mut apps = Vec::new();
    for _ in 0..2 {
        let source = RedisList::new(Q).reliable().concurrency(4);
        let handler = seen.clone();
        apps.push(
            env.start(
                RustStream::new(AppInfo::new("unique", "0.0.0"))
                    .shutdown_timeout(Duration::from_secs(1))
                    .with_broker(env.broker_with(|b| b), move |b| {
                        b.include(subscriber(source, handler).build());
                    }),
            )
            .await,
        );
    }
    // Three publishing processes, five publishes each of one id, at once.
    let brokers: Vec<RedisBroker> = (0..3).map(|_| env.broker_with(|b| b)).collect();
    let calls = brokers
        .iter()
        .flat_map(|b| (0..5).map(move |_| publish_unique(b, Q, "order-1", WINDOW)));
    let results = futures::future::join_all(calls).await;
    assert_eq!(totals(&results), (1, 14), "one of 15 publishes enqueued");
    assert_eq!(
        results.iter().filter(|r| r.is_enqueued()).count(),
        1,
        "exactly one publish says it enqueued: {results:?}"
    );
    env.eventually("the one message handled", async || seen.count() == 1)
        .await;
    env.eventually("nothing left queued or claimed", async || {
        env.llen(Q).await == 0 && env.llen(&format!("{Q}.processing")).await == 0
    })
    .await;
    // Another id is not held by the first one's window.
    let other = publish_unique(&brokers[0], Q, "order-2", WINDOW).await;
    assert!(other.is_enqueued(), "a second id has its own window");
    env.eventually("the second id handled", async || seen.count() == 2)
        .await;
    for app in apps {
        env.stop(app).await;
    }
    assert_eq!(seen.count(), 2, "each id handled once");
}

async fn the_window_ends_and_the_id_is_published_again(env: &Env) {
    let window = Duration::from_millis(300);
    let (a, b) = (env.broker_with(|b| b), env.broker_with(|b| b));
    assert!(publish_unique(&a, Q, "tick", window).await.is_enqueued());
    let again = publish_unique(&b, Q, "tick", window).await;
    assert_eq!((again.enqueued, again.duplicates), (0, 1));
    let mark = env.key(&format!("{Q}.unique:tick"));
    let ttl: i64 = env.client.pttl(&mark).await.expect("PTTL");
    assert!(
        ttl > 0 && ttl <= 300,
        "the id's mark expires with the window: {ttl}"
    );
    assert_eq!(env.llen(Q).await, 1);
    env.advance(window).await;
    env.eventually("the window ended", async || {
        !env.client.exists::<bool, _>(&mark).await.expect("EXISTS")
    })
    .await;
    assert!(
        publish_unique(&b, Q, "tick", window).await.is_enqueued(),
        "after its window the id is published again"
    );
    assert_eq!(env.llen(Q).await, 2);
}

async fn a_delayed_unique_message_holds_its_window(env: &Env) {
    let seen = Seen::default();
    let source = RedisList::new(Q).reliable();
    let handler = seen.clone();
    let app = env
        .start_with(move |b| {
            b.include(subscriber(source, handler).build());
        })
        .await;
    let other = env.broker_with(|b| b);
    let delayed = env
        .broker()
        .publisher()
        .message(&Job { n: 1 })
        .to(Q)
        .id("report")
        .unique_for(WINDOW)
        .delay(Duration::from_millis(200))
        .publish()
        .await
        .expect("publish");
    assert!(delayed.is_enqueued(), "scheduled");
    // While it waits, neither a delayed nor an immediate publish of the id goes in.
    let waiting = other
        .publisher()
        .message(&Job { n: 2 })
        .to(Q)
        .id("report")
        .unique_for(WINDOW)
        .delay(Duration::from_millis(10))
        .publish()
        .await
        .expect("publish");
    assert_eq!((waiting.enqueued, waiting.duplicates), (0, 1));
    assert!(
        !publish_unique(&other, Q, "report", WINDOW)
            .await
            .is_enqueued()
    );
    env.advance(Duration::from_millis(200)).await;
    env.eventually("the delayed message handled", async || seen.count() == 1)
        .await;
    // Delivered, it no longer waits in the delayed set, and its window still holds.
    assert_eq!(env.zcard(&format!("{Q}.delayed")).await, 0);
    assert!(
        !publish_unique(&other, Q, "report", WINDOW)
            .await
            .is_enqueued()
    );
    env.stop(app).await;
    assert_eq!(seen.jobs(), [(Job { n: 1 }, 1)], "handled once");
    assert_eq!(env.llen(Q).await, 0);
}

async fn a_stream_destination_holds_the_window(env: &Env) {
    let key = "{uqs}";
    let brokers: Vec<RedisBroker> = (0..2)
        .map(|_| env.broker_with(|b| b.route(key, stream::Publish::new().maxlen(1000))))
        .collect();
    let mut results = Vec::new();
    for b in &brokers {
        for _ in 0..3 {
            results.push(publish_unique(b, key, "evt-1", WINDOW).await);
        }
    }
    assert_eq!(totals(&results), (1, 5));
    let len: i64 = env.client.xlen(env.key(key)).await.expect("XLEN");
    assert_eq!(len, 1, "one entry in the stream");
}

async fn a_partitioned_destination_holds_the_window_across_partitions(env: &Env) {
    let key = "jobs";
    let brokers: Vec<RedisBroker> = (0..2)
        .map(|_| env.broker_with(|b| b.route(key, list::Publish::new().partitions(4))))
        .collect();
    let mut results = Vec::new();
    for id in ["a", "b", "c"] {
        for b in &brokers {
            for _ in 0..4 {
                results.push(publish_unique(b, key, id, WINDOW).await);
            }
        }
    }
    assert_eq!(totals(&results), (3, 21), "each of three ids enqueued once");
    let mut total = 0;
    for i in 0..4 {
        total += env.llen(&format!("{{{key}:{i}}}")).await;
    }
    assert_eq!(total, 3, "one message per id over all partitions");
}

async fn a_unique_publish_is_refused_where_it_cannot_hold(env: &Env) {
    let broker = env.broker_with(|b| b.route("news", ruststream::pubsub::Publish::new()));
    let err = broker
        .publisher()
        .message(&Job { n: 0 })
        .to("news")
        .id("x")
        .unique_for(WINDOW)
        .publish()
        .await
        .expect_err("pub/sub stores nothing to hold a window with");
    assert!(
        matches!(
            harness::pubsub_refusal(&err),
            PubSubError::CannotBeUnique { channel } if channel == "news"
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("without .unique_for"),
        "the error says how to fix it: {err}"
    );
    let err = env
        .broker()
        .publisher()
        .message(&Job { n: 0 })
        .to(Q)
        .unique_for(WINDOW)
        .publish()
        .await
        .expect_err("a window needs an id");
    let config = harness::config_error(&err);
    assert_eq!(config.option, ".unique_for(..)", "{err}");
    assert!(config.fix.contains(".id("), "{err}");
    assert_eq!(env.llen(Q).await, 0, "nothing published");
}

// A publish sent again after its reply was lost (fred re-sends on a new connection) finds its
// own token on the id's mark: it reports the message it enqueued, once, and does not enqueue it
// twice.
async fn a_publish_whose_reply_is_lost_counts_its_message_once(env: &Env) {
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    let broker = RedisBroker::standalone(proxy.url()).prefix(&env.prefix);
    proxy.cut_after(format!("{Q}.unique:lost-1").as_bytes());
    let sent = tokio::time::timeout(harness::WAIT, publish_unique(&broker, Q, "lost-1", WINDOW))
        .await
        .expect("the publish returns once re-sent");
    assert_eq!(proxy.cuts(), 1, "the first reply was lost");
    assert!(
        sent.is_enqueued(),
        "the re-sent publish reports its own message: {sent:?}"
    );
    assert_eq!(env.llen(Q).await, 1, "enqueued once");
    let later = publish_unique(&env.broker(), Q, "lost-1", WINDOW).await;
    assert!(!later.is_enqueued(), "another publish is a duplicate");
}

async fn a_window_holds_across_priority_levels(env: &Env) {
    let key = "{uqp}";
    let broker = env.broker_with(|b| b.route(key, list::Publish::new().priorities(3)));
    let mut results = Vec::new();
    for level in [2, 0, 1, 2] {
        let sent = broker
            .publisher()
            .message(&Job {
                n: u32::from(level),
            })
            .to(key)
            .id("urgent-1")
            .unique_for(WINDOW)
            .priority(level)
            .publish()
            .await
            .expect("publish");
        results.push(sent);
    }
    assert_eq!(
        totals(&results),
        (1, 3),
        "one id, one window, whatever the level"
    );
    assert_eq!(
        env.llen(&format!("{key}.p2")).await,
        1,
        "on the first publish's level"
    );
    assert_eq!(
        env.llen(key).await + env.llen(&format!("{key}.p1")).await,
        0
    );
}
