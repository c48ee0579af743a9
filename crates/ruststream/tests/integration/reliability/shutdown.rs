//! A bounded shutdown: a settle that keeps failing (its dead-letter key holds a string) is
//! abandoned `shutdown_timeout` after the stop, its entry stays claimed, one log line says
//! where, and the entry comes back through recovery once the key is fixed.

use std::time::{Duration, Instant};

use ruststream::RunningApp;
use ruststream::prelude::*;

use super::common::*;
use crate::harness::{Env, bounded, on, start, stop};

on!(
    [standalone, cluster]
    a_list_settle_that_keeps_failing_is_abandoned_at_shutdown,
    a_stream_settle_that_keeps_failing_is_abandoned_at_shutdown,
);

const Q: &str = "{stuck}";
const S: &str = "{stuck-s}";

/// The shutdown timeout of the stuck worker.
const TIMEOUT: Duration = Duration::from_millis(500);

/// How soon an abandoned entry comes back: longer than the stuck worker runs, so its own sweep
/// does not take the entry back before it stops.
const MIN_IDLE: Duration = Duration::from_secs(3);

/// Shuts `app` down, failing the test unless that takes at most [`TIMEOUT`] + 1 s.
async fn bounded_shutdown(app: RunningApp) {
    let started = Instant::now();
    bounded(
        "a shutdown with a settle that keeps failing",
        TIMEOUT + Duration::from_secs(1),
        app.shutdown(),
    )
    .await
    .expect("the app shuts down");
    println!("shutdown took {:?}", started.elapsed());
}

// The fault: a drop's settle that keeps failing is retried with backoff for 20 tries (over a
// minute); `shutdown()` must not wait for it past `shutdown_timeout` (500 ms here).
async fn a_list_settle_that_keeps_failing_is_abandoned_at_shutdown(env: &Env) {
    logs::capture();
    let dead = env.key(&format!("{Q}.dead"));
    set_string(env, &format!("{Q}.dead")).await;
    let list = || {
        RedisList::new(Q)
            .reliable()
            .min_idle(MIN_IDLE)
            .block(Duration::from_millis(200))
    };
    let rec = Rec::deciding(|_, _, _| settle(HandlerOutcome::drop()));
    let r = rec.clone();
    let app = start(app_on(env.broker_with(|b| b), TIMEOUT, |b| {
        b.include(subscriber(list(), r).build());
    }))
    .await;
    publish(env, Q, &[Job { n: 1 }]).await;
    eventually("the settle is refused", async || {
        !logs::lines_with(&["settle failed", &dead]).is_empty()
    })
    .await;
    bounded_shutdown(app).await;
    let processing = env.key(&format!("{Q}.processing"));
    let said = logs::lines_with(&["1 settles abandoned at shutdown", &processing, "min_idle"]);
    assert_eq!(said.len(), 1, "one line says what stays where: {said:?}");
    assert_eq!(
        env.llen(&format!("{Q}.processing")).await,
        1,
        "still claimed"
    );
    assert_eq!(env.zcard(&format!("{Q}.claims")).await, 1, "its claim kept");
    assert_eq!(rec.seen(), seen(&[(1, 1)]));
    // Fixed: a new worker recovers the entry after min_idle.
    del(env, &format!("{Q}.dead")).await;
    let again = Rec::acking();
    let a = again.clone();
    let app = start(app_on(env.broker_with(|b| b), TIMEOUT, |b| {
        b.include(subscriber(list(), a).build());
    }))
    .await;
    eventually("recovered and handled", async || {
        again.count() == 1 && env.llen(&format!("{Q}.processing")).await == 0
    })
    .await;
    assert_eq!(again.seen(), seen(&[(1, 2)]), "the second attempt");
    stop(app).await;
}

async fn a_stream_settle_that_keeps_failing_is_abandoned_at_shutdown(env: &Env) {
    logs::capture();
    let dead = env.key(&format!("{S}.dead"));
    set_string(env, &format!("{S}.dead")).await;
    let stream = || {
        RedisStream::new(S)
            .group("g")
            .min_idle(MIN_IDLE)
            .block(Duration::from_millis(200))
    };
    let rec = Rec::deciding(|_, _, _| settle(HandlerOutcome::drop()));
    let r = rec.clone();
    let app = start(app_on(env.broker_with(|b| b), TIMEOUT, |b| {
        b.include(subscriber(stream(), r).build());
    }))
    .await;
    let broker = env.broker_with(|b| b.route(S, stream::Publish::new()));
    broker.connect().await.unwrap();
    broker
        .publisher()
        .message(&Job { n: 1 })
        .to(S)
        .publish()
        .await
        .unwrap();
    eventually("the settle is refused", async || {
        !logs::lines_with(&["settle failed", &dead]).is_empty()
    })
    .await;
    bounded_shutdown(app).await;
    let said = logs::lines_with(&[
        "1 settles abandoned at shutdown",
        "pending in group `g`",
        &env.key(S),
    ]);
    assert_eq!(said.len(), 1, "one line says what stays where: {said:?}");
    assert_eq!(pending_count(env, S, "g").await, 1, "still pending");
    del(env, &format!("{S}.dead")).await;
    let again = Rec::acking();
    let a = again.clone();
    let app = start(app_on(env.broker_with(|b| b), TIMEOUT, |b| {
        b.include(subscriber(stream(), a).build());
    }))
    .await;
    eventually("recovered and handled", async || {
        again.count() == 1 && pending_count(env, S, "g").await == 0
    })
    .await;
    assert_eq!(again.seen(), seen(&[(1, 2)]), "the second attempt");
    stop(app).await;
}
