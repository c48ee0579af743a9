//! Lists: reliable (ack, retry, retry_after, drop, dead letters, decode failures), recovery of
//! stale claims, simple lists, publishing with a TTL and with a delay.

use std::time::Duration;

use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::{PublishPolicy, RunningApp, subscriber};
use ruststream_core::Broker as _;
use tokio::time::Instant;

use super::*;
use crate::harness::{Env, on};

on!(
    [memory, standalone]
    reliable_acks_in_order,
    reliable_retry,
    reliable_retry_after,
    reliable_drop_to_dead_letters,
    reliable_max_attempts,
    undecodable_and_raw_values,
    recovery_after_min_idle,
    recovery_frames_a_raw_value,
    simple_ack_drop_and_retry,
    publish_with_ttl_expires_the_queue,
    delayed_publish,
);

async fn reliable_acks_in_order(env: &Env) {
    let (rec, app) = start_planned(
        env,
        RedisList::new("q").reliable().concurrency(1),
        always_ack,
    )
    .await;
    publish(env, "q", &[Job { n: 1 }, Job { n: 2 }, Job { n: 3 }]).await;
    wait_seen(env, &rec, 3).await;
    let seen = rec.seen();
    assert_eq!(
        seen.iter().map(|s| s.n).collect::<Vec<_>>(),
        [1, 2, 3],
        "FIFO"
    );
    assert_eq!(rec.attempts(), [1, 1, 1]);
    env.eventually("processing list emptied", async || {
        env.llen("q.processing").await == 0
    })
    .await;
    env.stop(app).await;
    assert_eq!(env.keys().await, Vec::<String>::new(), "nothing left");
}

async fn reliable_retry(env: &Env) {
    let (rec, app) = start_planned(
        env,
        RedisList::new("q").reliable().retry(Backoff::immediate()),
        retry_once,
    )
    .await;
    publish(env, "q", &[Job { n: 1 }]).await;
    wait_seen(env, &rec, 2).await;
    let seen = rec.seen();
    assert_eq!(rec.attempts(), [1, 2]);
    assert_eq!(seen[0].id, seen[1].id, "a retry keeps the message id");
    env.eventually("settled", async || env.keys().await.is_empty())
        .await;
    env.stop(app).await;
}

async fn reliable_retry_after(env: &Env) {
    let (rec, app) = start_planned(env, RedisList::new("q").reliable(), retry_after_300ms).await;
    publish(env, "q", &[Job { n: 1 }]).await;
    wait_seen(env, &rec, 1).await;
    env.eventually("the retry waits in the delayed set", async || {
        env.zcard("q.delayed").await == 1
    })
    .await;
    wait_seen(env, &rec, 2).await;
    let seen = rec.seen();
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(1800),
        "retried after {waited:?}, asked 300 ms"
    );
    assert_eq!(rec.attempts(), [1, 2]);
    env.eventually("delayed set and payloads emptied", async || {
        env.keys().await.is_empty()
    })
    .await;
    env.stop(app).await;
}

async fn reliable_drop_to_dead_letters(env: &Env) {
    let (rec, app) = start_planned(env, RedisList::new("q").reliable(), drop_it).await;
    publish(env, "q", &[Job { n: 4 }]).await;
    wait_seen(env, &rec, 1).await;
    env.eventually("a dead letter", async || env.llen("q.dead").await == 1)
        .await;
    let dead = env.frames("q.dead").await;
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("dropped")
    );
    assert_eq!(
        (dead[0].attempt, dead[0].id.as_str()),
        (1, rec.seen()[0].id.as_str())
    );
    assert_eq!(&dead[0].payload[..], job_json(4).as_bytes());
    assert_eq!(env.keys().await, ["q.dead"]);
    env.stop(app).await;
}

async fn reliable_max_attempts(env: &Env) {
    let rec = Rec::planned(always_retry);
    let r = rec.clone();
    let app = env
        .start_with(|b| {
            b.include(
                subscriber(
                    RedisList::new("q")
                        .reliable()
                        .max_attempts(2)
                        .retry(Backoff::immediate()),
                    r,
                )
                .build(),
            );
        })
        .await;
    publish(env, "q", &[Job { n: 5 }]).await;
    env.eventually("a dead letter", async || env.llen("q.dead").await == 1)
        .await;
    assert_eq!(rec.attempts(), [1, 2]);
    let dead = env.frames("q.dead").await;
    assert_eq!(
        (
            dead[0].headers.get("reason").map(String::as_str),
            dead[0].attempt
        ),
        (Some("max-attempts"), 2)
    );
    env.stop(app).await;
}

async fn undecodable_and_raw_values(env: &Env) {
    let (rec, app) = start_planned(
        env,
        RedisList::new("q").reliable().concurrency(1),
        always_ack,
    )
    .await;
    // As `redis-cli LPUSH` would: no frame, no headers.
    let _: i64 = env
        .client
        .lpush(env.key("q"), vec!["not json", job_json(7).as_str()])
        .await
        .expect("LPUSH");
    env.eventually("a dead letter", async || env.llen("q.dead").await == 1)
        .await;
    wait_seen(env, &rec, 1).await;
    let dead = env.frames("q.dead").await;
    let reason = dead[0].headers.get("reason").cloned().unwrap_or_default();
    assert!(reason.starts_with("decode"), "reason: {reason}");
    assert_eq!(&dead[0].payload[..], b"not json");
    let seen = rec.seen();
    assert_eq!((seen[0].n, seen[0].attempt), (7, 1));
    assert!(!seen[0].id.is_empty(), "a raw value gets an id");
    env.stop(app).await;
}

// ---------------------------------------------------------------------------------------------
// Recovery: the recovery set, min_idle, recovery_ttl.
// ---------------------------------------------------------------------------------------------

fn recoverable() -> RedisList {
    RedisList::new("{r}")
        .reliable()
        .min_idle(Duration::from_millis(300))
        .recovery_zset("{r}.claims")
        .recovery_ttl(Duration::from_secs(5))
}

/// A worker whose handler never finishes, stopped at once: its claim stays behind, as a
/// crashed worker's does (a live worker keeps its claims alive, so only a gone one is swept).
async fn dying_worker(env: &Env, rec: &Rec) -> RunningApp {
    let r = rec.clone();
    env.start(
        env.app(|b| {
            b.include(subscriber(recoverable(), r).build());
        })
        .shutdown_timeout(Duration::from_millis(20)),
    )
    .await
}

/// A second worker of the same queue, sharing `rec`.
async fn second_worker(env: &Env, rec: &Rec) -> RunningApp {
    let r = rec.clone();
    env.start_with(|b| {
        b.include(subscriber(recoverable(), r).build());
    })
    .await
}

async fn recovery_after_min_idle(env: &Env) {
    let rec = Rec::planned(hang_first);
    let dying = dying_worker(env, &rec).await;
    publish(env, "{r}", &[Job { n: 8 }]).await;
    wait_seen(env, &rec, 1).await;
    env.eventually("the claim is recorded", async || {
        env.zcard("{r}.claims").await == 1
    })
    .await;
    assert_eq!(env.llen("{r}.processing").await, 1);
    let ttl = env.pttl("{r}.claims").await;
    assert!(ttl > 0 && ttl <= 5000, "recovery_ttl armed: {ttl}");
    env.stop(dying).await;
    let app = second_worker(env, &rec).await;
    wait_seen(env, &rec, 2).await;
    let seen = rec.seen();
    assert_eq!(rec.attempts(), [1, 2], "recovery counts an attempt");
    assert_eq!(seen[0].id, seen[1].id);
    // Not before min_idle (less the moment between the claim and the handler's start).
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(2000),
        "recovered after {waited:?}, min_idle 300 ms"
    );
    env.eventually("claims and processing emptied", async || {
        env.zcard("{r}.claims").await == 0 && env.llen("{r}.processing").await == 0
    })
    .await;
    env.stop(app).await;
}

async fn recovery_frames_a_raw_value(env: &Env) {
    let rec = Rec::planned(hang_first);
    let dying = dying_worker(env, &rec).await;
    let _: i64 = env
        .client
        .lpush(env.key("{r}"), job_json(9))
        .await
        .expect("LPUSH");
    wait_seen(env, &rec, 1).await;
    env.stop(dying).await;
    let app = second_worker(env, &rec).await;
    wait_seen(env, &rec, 2).await;
    let seen = rec.seen();
    assert_eq!((seen[1].n, seen[1].attempt), (9, 2));
    env.stop(app).await;
}

// ---------------------------------------------------------------------------------------------
// Simple lists.
// ---------------------------------------------------------------------------------------------

async fn simple_ack_drop_and_retry(env: &Env) {
    fn plan(_: u32) -> Act {
        Act::Ack
    }
    let ack = Rec::planned(plan);
    let dropped = Rec::planned(drop_it);
    let retried = Rec::planned(always_retry);
    let (a, d, r) = (ack.clone(), dropped.clone(), retried.clone());
    let app = env
        .start_with(|b| {
            b.include(subscriber(RedisList::new("sa"), a).build());
            b.include(subscriber(RedisList::new("sd"), d).build());
            b.include(subscriber(RedisList::new("sr"), r).build());
        })
        .await;
    for key in ["sa", "sd", "sr"] {
        publish(env, key, &[Job { n: 1 }]).await;
    }
    wait_seen(env, &ack, 1).await;
    wait_seen(env, &dropped, 1).await;
    wait_seen(env, &retried, 1).await;
    env.eventually("the drop's dead letter", async || {
        env.llen("sd.dead").await == 1
    })
    .await;
    // At most once: a simple list's retry has nothing to put back.
    env.advance(Duration::from_millis(1500)).await;
    assert_eq!(retried.count(), 1);
    let dead = env.frames("sd.dead").await;
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("dropped")
    );
    assert_eq!(env.keys().await, ["sd.dead"]);
    env.stop(app).await;
}

// ---------------------------------------------------------------------------------------------
// Publishing: TTL, delayed delivery.
// ---------------------------------------------------------------------------------------------

async fn publish_with_ttl_expires_the_queue(env: &Env) {
    env.broker().connect().await.expect("connect");
    let policy = PublishPolicy::List(list::Publish::new().ttl(Duration::from_millis(500)));
    let msg = ruststream::OutMessage::new("t", job_json(1).into());
    env.broker()
        .publish_with(&policy, vec![msg])
        .await
        .expect("publish");
    assert_eq!(env.llen("t").await, 1);
    let ttl = env.pttl("t").await;
    assert!(ttl > 0 && ttl <= 500, "ttl armed: {ttl}");
    env.advance(Duration::from_millis(700)).await;
    assert!(!env.exists("t").await, "the queue expired");
    assert_eq!(env.pttl("t").await, -2);
    env.broker().close().await;
}

async fn delayed_publish(env: &Env) {
    let (rec, app) = start_planned(env, RedisList::new("d").reliable(), always_ack).await;
    let sent = Instant::now();
    let p = env.broker().publisher();
    for _ in 0..2 {
        // The same id twice: the second waits on the first's schedule.
        p.message(&Job { n: 3 })
            .to("d")
            .id("once")
            .delay(Duration::from_millis(300))
            .publish()
            .await
            .expect("publish");
    }
    assert_eq!(env.zcard("d.delayed").await, 1);
    env.advance(Duration::from_millis(150)).await;
    if sent.elapsed() < Duration::from_millis(280) {
        assert_eq!(rec.count(), 0, "not before it is due");
    }
    wait_seen(env, &rec, 1).await;
    let late = rec.seen()[0].at - sent;
    // The publish's wake-up (PUBLISH on the delayed set) makes the reader wait for this entry
    // rather than for its next poll.
    assert!(
        late >= Duration::from_millis(300) && late < Duration::from_millis(900),
        "delivered after {late:?}, asked 300 ms"
    );
    env.advance(Duration::from_millis(1200)).await;
    assert_eq!(rec.count(), 1, "one schedule per id");
    assert_eq!(rec.seen()[0].id, "once");
    assert_eq!(env.keys().await, Vec::<String>::new());
    env.stop(app).await;
}
