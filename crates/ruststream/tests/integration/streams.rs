//! Stream subscriptions with a consumer group: an entry handled and acknowledged, two
//! subscriptions of one group and two readers of one subscription sharing the work, and a
//! producer's routed stream destination. On the in-memory model, the standalone server and the
//! cluster, with the job type and helpers of `lists.rs`.

use crate::harness;
use crate::lists::{Job, info};

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use harness::{Env, WAIT, on, start, stop, wait_until};
use ruststream::prelude::*;

on!(
    [memory, standalone, cluster] multi_thread:
    a_stream_entry_is_handled_and_acknowledged,
    a_routed_stream_destination_gets_xadd_from_a_producer,
);

// Not on the model: the model has no `XINFO`.
on!(
    [standalone, cluster] multi_thread:
    two_subscriptions_of_a_stream_group_split_its_entries,
    two_readers_of_a_stream_subscription_share_its_permits,
);

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
    let busy = crate::dispatch::Busy::default();
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
    env.xadd_raw("events", r#"{"n":5}"#, &[("tenant", "acme")])
        .await;
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
