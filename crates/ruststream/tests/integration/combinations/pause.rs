//! A pause is a gate of the claim: once `pause` has returned, a job published is not claimed by
//! either of two instances whose readers were already in their blocking wait, on a simple list, a
//! reliable list and a stream; `resume` lets it through.

use crate::harness;

use harness::{Env, on, start, stop};
use ruststream::Mount;
use ruststream::prelude::*;

use super::{BLOCK, Job, Tally, operator_of, own_app};

on!(
    [memory, standalone, cluster]
    a_pause_holds_a_waiting_simple_list,
    a_pause_holds_a_waiting_reliable_list,
    a_pause_holds_a_waiting_stream,
);

/// Two instances of `mount` read `key`; one job is handled (so both readers are back in their
/// blocking wait); then `pause` returns, a job is published, and for two blocks nobody claims
/// it (`waiting` says it still waits); after `resume` it is handled.
async fn a_pause_holds_waiting_readers(
    env: &Env,
    key: &str,
    mount: impl Fn(&mut Mount<RedisBroker>) + Clone,
    tally: &Tally,
    producer: RedisBroker,
    waiting: impl AsyncFn() -> bool,
) {
    let op = operator_of(env, mount.clone()).await;
    let first = start(own_app(env, mount.clone())).await;
    let second = start(own_app(env, mount)).await;
    producer.connect().await.expect("connect");
    let publisher = producer.publisher();
    publisher
        .message(&Job { n: 0 })
        .to(key)
        .publish()
        .await
        .unwrap();
    env.eventually("the first job is handled", async || tally.has(0))
        .await;

    op.pause(key, "test").await.unwrap();
    publisher
        .message(&Job { n: 1 })
        .to(key)
        .publish()
        .await
        .unwrap();
    // A negative observation needs a window: two blocking reads.
    tokio::time::sleep(2 * BLOCK).await;
    assert!(!tally.has(1), "a paused subscription claimed");
    assert!(waiting().await, "the job still waits on the queue");

    op.resume(key).await.unwrap();
    env.eventually("the job is handled after resume", async || tally.has(1))
        .await;
    assert_eq!(tally.not_once(2), [], "each job handled once");
    stop(first).await;
    stop(second).await;
}

async fn a_pause_holds_a_waiting_simple_list(env: &Env) {
    pause_on_a_list(env, RedisList::new("{ps}")).await;
}

async fn a_pause_holds_a_waiting_reliable_list(env: &Env) {
    pause_on_a_list(env, RedisList::new("{pr}").reliable()).await;
}

async fn pause_on_a_list(env: &Env, list: RedisList) {
    let key = list.key().to_owned();
    let tally = Tally::default();
    let t = tally.clone();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(subscriber(list.clone().block(BLOCK), t.clone()).build());
    };
    let producer = env.broker_with(|b| b);
    a_pause_holds_waiting_readers(env, &key, mount, &tally, producer, async || {
        env.llen(&key).await == 1
    })
    .await;
}

async fn a_pause_holds_a_waiting_stream(env: &Env) {
    let tally = Tally::default();
    let t = tally.clone();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(subscriber(RedisStream::new("{pst}").group("g").block(BLOCK), t.clone()).build());
    };
    let producer = env.broker_with(|b| b.route("{pst}", stream::Publish::new()));
    a_pause_holds_waiting_readers(env, "{pst}", mount, &tally, producer, async || {
        env.pending("{pst}", "g").await == 0
    })
    .await;
}
