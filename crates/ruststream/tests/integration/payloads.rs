//! What a list subscription does with what it reads: an undecodable payload goes to the
//! dead-letter list with its reason (or, without one, is removed) and reading goes on; a raw
//! `LPUSH` is a payload without headers; published headers reach the handler's context; a payload
//! over `max_payload_bytes` is dead-lettered unread, on a list and on a stream. On the in-memory
//! model, the standalone server and the cluster, with the job type and helpers of `lists.rs`.

use crate::harness;
use crate::lists::{Job, Probe, app_with, publish};

use fred::bytes::Bytes;
use harness::{Env, WAIT, on, start, stop, wait_until};
use ruststream::prelude::*;

on!(
    [memory, standalone, cluster] multi_thread:
    garbage_on_a_reliable_list_is_dead_lettered_and_reading_goes_on,
    garbage_on_a_simple_list_is_dead_lettered_and_reading_goes_on,
    garbage_without_a_dead_letter_list_is_removed,
    a_raw_lpush_is_a_payload_without_headers,
    published_headers_reach_the_context,
    a_payload_over_the_limit_is_dead_lettered_from_a_list,
    a_payload_over_the_limit_is_dead_lettered_from_a_stream,
    a_zero_payload_limit_is_refused_at_startup,
);

// 1 ------------------------------------------------------------------------------------------
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

// 2 ------------------------------------------------------------------------------------------

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

// 3 ------------------------------------------------------------------------------------------

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

// 4 ------------------------------------------------------------------------------------------

/// A payload of 20 bytes, over the limit of 16; `{"n":N}` payloads are under it.
const LARGE: &str = r#"{"n":1,"pad":"xxxx"}"#;

/// Asserts the one dead letter of `dead`: the large payload, unread, with reason `too-large`.
async fn the_large_one_is_dead(env: &Env, dead: &str) {
    let dead = env.frames(dead).await;
    assert_eq!(dead.len(), 1, "one dead letter");
    let reason = dead[0].headers.get("reason").cloned().unwrap_or_default();
    assert_eq!(
        reason, "too-large: 20 bytes, more than max_payload_bytes 16",
        "reason"
    );
    assert_eq!(dead[0].payload, Bytes::from_static(LARGE.as_bytes()));
}

async fn a_payload_over_the_limit_is_dead_lettered_from_a_list(env: &Env) {
    let broker = env.broker();
    let probe = Probe::acking();
    let source = RedisList::new("{jobs}").reliable().max_payload_bytes(16);
    let app = start(app_with(&broker, source, &probe)).await;
    env.lpush_raw("{jobs}", LARGE).await;
    publish(&broker, "{jobs}", 3).await;
    wait_until(
        "the small one handled, the large one dead",
        WAIT,
        async || probe.count() == 1 && env.llen("{jobs}.dead").await == 1,
    )
    .await;
    wait_until("the processing list to empty", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;
    stop(app).await;

    assert_eq!(
        probe.ns(),
        [3],
        "only the small payload reached the handler"
    );
    the_large_one_is_dead(env, "{jobs}.dead").await;
}

async fn a_payload_over_the_limit_is_dead_lettered_from_a_stream(env: &Env) {
    let broker = env.broker();
    let probe = Probe::acking();
    let handler = probe.clone();
    let source = RedisStream::new("{ev}").group("g").max_payload_bytes(16);
    let app = RustStream::new(crate::lists::info()).with_broker(broker.clone(), move |b| {
        b.include(subscriber(source, handler).build());
    });
    let app = start(app).await;
    for payload in [LARGE, r#"{"n":4}"#] {
        env.xadd_raw("{ev}", payload, &[]).await;
    }
    wait_until(
        "the small one handled, the large one dead",
        WAIT,
        async || probe.count() == 1 && env.llen("{ev}.dead").await == 1,
    )
    .await;
    stop(app).await;

    assert_eq!(
        probe.ns(),
        [4],
        "only the small payload reached the handler"
    );
    the_large_one_is_dead(env, "{ev}.dead").await;
}

async fn a_zero_payload_limit_is_refused_at_startup(env: &Env) {
    let source = RedisList::new("{jobs}").reliable().max_payload_bytes(0);
    let app = env.app(move |b| {
        b.include(subscriber(source, Probe::acking()).build());
    });
    let e = env.refusal(app).await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("max_payload_bytes", Some("{jobs}"))
    );
    assert!(e.fix.contains(".max_payload_bytes(1 << 20)"), "{e}");
}
