//! What outlives a bound: entries whose recovery set expired go back to the queue, and handlers
//! slower than `min_idle` (list and stream) are handled once, their claims kept by their leases.

use std::time::Duration;

use ruststream::prelude::*;

use crate::harness::{Env, on, stop};
use crate::reliability::common::*;

use super::{Q, S, k, publish_stream};

on!(
    [standalone, cluster]
    entries_outliving_an_expired_recovery_set_go_back_to_the_queue,
    a_handler_slower_than_min_idle_is_handled_once,
    a_stream_handler_slower_than_min_idle_is_handled_once,
);

// ---------------------------------------------------------------------------------------------
// Expired recovery sets, slow handlers, raw values.

// The fault: recovery_ttl expires the recovery set but not the processing list. Once the workers
// have been down longer than the ttl, their claimed entries must still come back.
async fn entries_outliving_an_expired_recovery_set_go_back_to_the_queue(env: &Env) {
    let source = || {
        RedisList::new(Q)
            .reliable()
            .recovery_zset(k(".claims"))
            .min_idle(Duration::from_millis(200))
            .recovery_ttl(Duration::from_millis(600))
            .block(Duration::from_millis(200))
    };
    let hung = Rec::deciding(|_, _, _| hang());
    let h = hung.clone();
    let app = worker(env, |b| {
        b.include(subscriber(source(), h).build());
    })
    .await;
    publish(env, Q, &jobs(3)).await;
    eventually("all three claimed", async || hung.count() == 3).await;
    stop(app).await; // The workers are gone; their claims stay.
    eventually("the recovery set expired", async || {
        !env.exists(&k(".claims")).await
    })
    .await;
    assert_eq!(env.llen(&k(".processing")).await, 3);
    let rec = Rec::acking();
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(subscriber(source(), r).build());
    })
    .await;
    eventually("recovered and handled", async || {
        rec.count() == 3 && env.keys().await.is_empty()
    })
    .await;
    assert_eq!(rec.sorted(), seen(&[(0, 2), (1, 2), (2, 2)]));
    stop(app).await;
}

/// Sleeps `d`, then acks.
fn slow(d: Duration) -> Verdict {
    Box::pin(async move {
        tokio::time::sleep(d).await;
        Ok(())
    })
}

const MIN_IDLE: Duration = Duration::from_millis(500);

// The fault: a handler slower than min_idle swept and redelivered while still running spends an
// attempt each time: a message that succeeds every time would end in the dead letters with
// max-attempts. Leases keep a live handler's claim.
async fn a_handler_slower_than_min_idle_is_handled_once(env: &Env) {
    let rec = Rec::deciding(|_, _, _| slow(3 * MIN_IDLE));
    let source = || {
        RedisList::new(Q)
            .reliable()
            .min_idle(MIN_IDLE)
            .max_attempts(3)
            .block(Duration::from_millis(100))
    };
    // Two workers: either may sweep the other's claims.
    let (r1, r2) = (rec.clone(), rec.clone());
    let one = worker(env, |b| {
        b.include(subscriber(source(), r1).build());
    })
    .await;
    let two = worker(env, |b| {
        b.include(subscriber(source(), r2).build());
    })
    .await;
    publish(env, Q, &[Job { n: 1 }]).await;
    eventually("settled", async || {
        rec.count() >= 1
            && env.llen(Q).await == 0
            && env.llen(&k(".processing")).await == 0
            && env.zcard(&k(".claims")).await == 0
    })
    .await;
    assert_eq!(rec.seen(), seen(&[(1, 1)]), "handled once, on attempt 1");
    assert!(
        !env.exists(&k(".dead")).await,
        "nothing in the dead letters"
    );
    assert!(env.keys().await.is_empty(), "acked: {:?}", env.keys().await);
    stop(one).await;
    stop(two).await;
}

// The stream's sweep must keep away from a live consumer's entries just the same.
async fn a_stream_handler_slower_than_min_idle_is_handled_once(env: &Env) {
    let rec = Rec::deciding(|_, _, _| slow(3 * MIN_IDLE));
    let source = |name: &str| {
        RedisStream::new(S)
            .group("g")
            .consumer(name)
            .min_idle(MIN_IDLE)
            .max_attempts(3)
            .block(Duration::from_millis(100))
    };
    let (r1, r2) = (rec.clone(), rec.clone());
    let one = worker(env, |b| {
        b.include(subscriber(source("one"), r1).build());
    })
    .await;
    let two = worker(env, |b| {
        b.include(subscriber(source("two"), r2).build());
    })
    .await;
    publish_stream(env, &[Job { n: 1 }]).await;
    eventually("handled and acked", async || {
        rec.count() >= 1 && pending_count(env, S, "g").await == 0
    })
    .await;
    assert_eq!(rec.seen(), seen(&[(1, 1)]), "handled once, on attempt 1");
    assert_eq!(env.llen(&format!("{S}.dead")).await, 0);
    stop(one).await;
    stop(two).await;
}
