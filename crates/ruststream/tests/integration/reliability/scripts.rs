//! Scripts fail whole: a key of another type, a frame with more headers than one command can
//! take, a Redis at maxmemory. Redis does not roll back a script that fails halfway, so each
//! test checks that the failure changed nothing and that the message gets through once the
//! cause is gone.

use std::time::Duration;

use fred::prelude::*;
use ruststream::RunningApp;
use ruststream::prelude::*;

use super::common::*;
use crate::harness::stand::OwnRedis;
use crate::harness::{Env, bounded, on, start, stop, unique, wait_until};

on!(
    [standalone, cluster]
    a_dead_letter_key_of_another_type_fails_the_settle_whole,
    a_delayed_set_of_another_type_fails_the_settle_whole,
    a_processing_list_or_recovery_set_of_another_type_fails_the_claim_whole,
    a_dead_letter_key_of_another_type_fails_a_stream_settle_whole,
    a_stream_retry_with_too_many_headers_is_dead_lettered,
    a_due_delayed_entry_with_too_many_headers_is_dead_lettered_and_the_stream_read,
);

const Q: &str = "{jobs}";
const S: &str = "{s}";

fn k(suffix: &str) -> String {
    format!("{Q}{suffix}")
}

/// A reliable list on [`Q`] with crash recovery (the default) and a short blocking read.
fn reliable() -> RedisList {
    RedisList::new(Q)
        .reliable()
        .block(Duration::from_millis(200))
}

/// A reliable worker handling with `rec`, one job published while the key `suffix` holds a
/// string: waits until the job's settle is refused naming that key (or, with the fault, the
/// entry leaves the processing list), checks that the refusal wrote nothing (the entry is still
/// claimed, its claim still recorded), then deletes the key and returns the worker.
async fn settle_refused_until_fixed(env: &Env, suffix: &str, rec: &Rec) -> RunningApp {
    logs::capture();
    let bad = env.key(&k(suffix));
    set_string(env, &k(suffix)).await;
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(subscriber(reliable(), r).build());
    })
    .await;
    publish(env, Q, &[Job { n: 1 }]).await;
    eventually("the settle is refused with WRONGTYPE", async || {
        !rec.seen().is_empty()
            && (!logs::lines_with(&["settle failed", "WRONGTYPE", &bad]).is_empty()
                || env.llen(&k(".processing")).await == 0)
    })
    .await;
    assert_eq!(env.llen(&k(".processing")).await, 1, "the claim is kept");
    assert_eq!(
        env.zcard(&k(".claims")).await,
        1,
        "the claim's member is kept"
    );
    del(env, &k(suffix)).await;
    app
}

// The fault: a settle.lua that removes the entry from K.processing and the recovery set, then fails
// its LPUSH to a dead-letter key holding a string (WRONGTYPE), loses the message. The script must
// refuse before its first write.
async fn a_dead_letter_key_of_another_type_fails_the_settle_whole(env: &Env) {
    let rec = Rec::deciding(|_, _, _| settle(HandlerOutcome::drop()));
    let app = settle_refused_until_fixed(env, ".dead", &rec).await;
    // The settle loop tries again: now it goes through.
    eventually("dead-lettered once the key is fixed", async || {
        env.llen(&k(".dead")).await == 1 && env.llen(&k(".processing")).await == 0
    })
    .await;
    assert_eq!(reasons(env, &k(".dead")).await, ["dropped"]);
    assert_eq!(env.zcard(&k(".claims")).await, 0);
    assert_eq!(rec.seen(), seen(&[(1, 1)]), "handled once");
    stop(app).await;
}

// The fault: a retry_after's settle that removes the entry from K.processing, then fails its ZADD
// into a delayed set holding a string (WRONGTYPE), loses the message: it is never retried.
async fn a_delayed_set_of_another_type_fails_the_settle_whole(env: &Env) {
    let rec = Rec::deciding(|_, attempt, _| match attempt {
        1 => settle(HandlerOutcome::retry_after(Duration::from_millis(200))),
        _ => ack(),
    });
    let app = settle_refused_until_fixed(env, ".delayed", &rec).await;
    eventually("retried after its delay and acked", async || {
        rec.count() == 2 && env.keys().await.is_empty()
    })
    .await;
    assert_eq!(rec.seen(), seen(&[(1, 1), (1, 2)]));
    stop(app).await;
}

// The fault: a claim.lua that trims the queue, then fails its LPUSH into a processing list holding
// a string (WRONGTYPE), loses the claimed entries. Both the processing list and the recovery set
// are checked before the first write.
async fn a_processing_list_or_recovery_set_of_another_type_fails_the_claim_whole(env: &Env) {
    logs::capture();
    for (bad, batch) in [(".processing", 0), (".claims", 10)] {
        let bad_key = env.key(&k(bad));
        set_string(env, &k(bad)).await;
        let rec = Rec::acking();
        let r = rec.clone();
        let app = worker(env, |b| {
            b.include(subscriber(reliable(), r).build());
        })
        .await;
        let batch_jobs: Vec<Job> = (batch..batch + 3).map(|n| Job { n }).collect();
        publish(env, Q, &batch_jobs).await;
        // Until the claim is refused, naming the key (or, with the fault, entries leave the queue).
        eventually("the claim is refused with WRONGTYPE", async || {
            !logs::lines_with(&["receive failed", "WRONGTYPE", &bad_key]).is_empty()
                || env.llen(Q).await < 3
        })
        .await;
        assert_eq!(env.llen(Q).await, 3, "{bad}: nothing left the queue");
        assert_eq!(rec.count(), 0);
        del(env, &k(bad)).await;
        eventually("handled once the key is fixed", async || {
            rec.count() == 3 && env.keys().await.is_empty()
        })
        .await;
        let attempts: Vec<u32> = rec.seen().iter().map(|s| s.attempt).collect();
        assert_eq!(attempts, [1, 1, 1], "{bad}");
        stop(app).await;
    }
}

// The fault: a stream settle that runs XACK, then fails its LPUSH to a dead-letter key holding a
// string (WRONGTYPE), acknowledges the entry and never writes its dead letter.
async fn a_dead_letter_key_of_another_type_fails_a_stream_settle_whole(env: &Env) {
    logs::capture();
    let dead_key = format!("{S}.dead");
    let dead = env.key(&dead_key);
    set_string(env, &dead_key).await;
    let rec = Rec::deciding(|_, _, _| settle(HandlerOutcome::drop()));
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(subscriber(stream(), r).build());
    })
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
    // Until the settle is refused, naming the key (or, with the fault, the entry is acknowledged).
    eventually("the settle is refused with WRONGTYPE", async || {
        !logs::lines_with(&["settle failed", "WRONGTYPE", &dead]).is_empty()
            || (rec.count() == 1 && pending_count(env, S, "g").await == 0)
    })
    .await;
    assert_eq!(pending_count(env, S, "g").await, 1, "still pending");
    del(env, &dead_key).await;
    eventually("dead-lettered once the key is fixed", async || {
        env.llen(&dead_key).await == 1 && pending_count(env, S, "g").await == 0
    })
    .await;
    assert_eq!(reasons(env, &dead_key).await, ["dropped"]);
    assert_eq!(rec.seen(), seen(&[(1, 1)]), "handled once");
    stop(app).await;
}

/// `n` headers `h0000: v`, ...
fn many_headers(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("h{i:04}"), "v".to_owned()))
        .collect()
}

/// A stream subscription on [`S`], group `g`, retries at once.
fn stream() -> RedisStream {
    RedisStream::new(S)
        .group("g")
        .block(Duration::from_millis(200))
        .retry(Backoff::immediate())
}

// The fault: the retry of a stream entry with ~4,000 headers that runs XACK, then fails its re-XADD
// in Lua's unpack ("too many results to unpack"), loses the message.
async fn a_stream_retry_with_too_many_headers_is_dead_lettered(env: &Env) {
    let rec = Rec::deciding(|_, attempt, _| match attempt {
        1 => settle(HandlerOutcome::retry()),
        _ => ack(),
    });
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(subscriber(stream(), r).build());
    })
    .await;
    let broker = env.broker_with(|b| b.route(S, stream::Publish::new()));
    broker.connect().await.unwrap();
    broker
        .publisher()
        .message(&Job { n: 7 })
        .to(S)
        .headers(many_headers(4000))
        .publish()
        .await
        .unwrap();
    // Until it is settled (with the fault: acknowledged, and nothing else).
    eventually("settled", async || {
        rec.count() >= 1 && pending_count(env, S, "g").await == 0
    })
    .await;
    assert_eq!(env.llen(&format!("{S}.dead")).await, 1, "dead-lettered");
    let dead = dead_frames(env, &format!("{S}.dead")).await;
    let reason = dead[0].headers.get("reason").cloned().unwrap_or_default();
    assert!(reason.starts_with("too-many-headers"), "{reason}");
    assert_eq!(
        dead[0].headers.len(),
        4003,
        "the dead letter keeps every header, with its reason, dead-at and history"
    );
    let history = dead[0]
        .headers
        .get("rs.history")
        .cloned()
        .unwrap_or_default();
    assert!(history.contains(" dead 1 too-many-headers"), "{history}");
    assert_eq!(
        serde_json::from_slice::<Job>(&dead[0].payload).unwrap(),
        Job { n: 7 }
    );
    assert_eq!(xlen(env, S).await, 1, "no entry was added for the retry");
    assert_eq!(rec.seen(), seen(&[(7, 1)]));
    stop(app).await;
}

// The fault: a delayed message with ~4,000 headers due into a stream makes move_due fail in Lua's
// unpack unless checked first. Every read of that stream would then fail with it, for good.
async fn a_due_delayed_entry_with_too_many_headers_is_dead_lettered_and_the_stream_read(env: &Env) {
    let rec = Rec::acking();
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(subscriber(stream(), r).build());
    })
    .await;
    let broker = env.broker_with(|b| b.route(S, stream::Publish::new()));
    broker.connect().await.unwrap();
    let p = broker.publisher();
    let soon = Duration::from_millis(100);
    p.message(&Job { n: 1 }).to(S).publish().await.unwrap();
    p.message(&Job { n: 2 })
        .to(S)
        .headers(many_headers(4000))
        .delay(soon)
        .publish()
        .await
        .unwrap();
    p.message(&Job { n: 3 })
        .to(S)
        .delay(soon)
        .publish()
        .await
        .unwrap();
    eventually("the big one dead-lettered, the rest handled", async || {
        env.llen(&format!("{S}.dead")).await == 1 && rec.distinct() == 2
    })
    .await;
    // Reading goes on.
    p.message(&Job { n: 4 }).to(S).publish().await.unwrap();
    eventually("a later entry is handled", async || rec.distinct() == 3).await;
    let reason = reasons(env, &format!("{S}.dead")).await;
    assert!(reason[0].starts_with("too-many-headers"), "{reason:?}");
    let dead = dead_frames(env, &format!("{S}.dead")).await;
    assert_eq!(
        serde_json::from_slice::<Job>(&dead[0].payload).unwrap(),
        Job { n: 2 }
    );
    assert_eq!(rec.sorted(), seen(&[(1, 1), (3, 1), (4, 1)]));
    assert_eq!(env.zcard(&format!("{S}.delayed")).await, 0);
    assert_eq!(env.hlen(&format!("{S}.delayed.payloads")).await, 0);
    stop(app).await;
}

// The fault: at maxmemory (noeviction), one due delayed entry makes move_due's RPUSH (a list's) or
// XADD (a stream's) fail without `allow-oom`, and every read fails with it: a queue of 200 is never
// drained (0 of 200 handled).
#[tokio::test]
async fn a_full_redis_still_drains_its_queues_and_refuses_publishes() {
    let dir = std::env::temp_dir().join(unique("oom"));
    std::fs::create_dir_all(&dir).unwrap();
    let redis = OwnRedis::start(dir, OwnRedis::free_port()).await;
    let url = redis.url();
    let broker = || {
        RedisBroker::standalone(url.clone())
            .prefix("oom:")
            .route(S, stream::Publish::new())
    };
    let publishing = broker();
    publishing.connect().await.unwrap();
    let p = publishing.publisher();
    let soon = Duration::from_millis(1);
    p.messages(&jobs(200)).to(Q).publish().await.unwrap();
    p.message(&Job { n: 200 })
        .to(Q)
        .delay(soon)
        .publish()
        .await
        .unwrap();
    // A stream whose consumers ran before Redis filled up: its group exists.
    let raw = crate::harness::stand::node_client(&url).await;
    let _: Value = raw
        .custom(
            fred::cmd!("XGROUP"),
            vec!["CREATE", &format!("oom:{S}"), "g", "0", "MKSTREAM"],
        )
        .await
        .unwrap();
    p.messages(&jobs(100)).to(S).publish().await.unwrap();
    p.message(&Job { n: 100 })
        .to(S)
        .delay(soon)
        .publish()
        .await
        .unwrap();
    // Full: below what Redis uses already, so every write that may grow memory is refused.
    let info: String = raw
        .custom(fred::cmd!("INFO"), vec!["memory"])
        .await
        .unwrap();
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory");
    let _: Value = raw
        .custom(
            fred::cmd!("CONFIG"),
            vec!["SET", "maxmemory-policy", "noeviction"],
        )
        .await
        .unwrap();
    let _: Value = raw
        .custom(
            fred::cmd!("CONFIG"),
            vec![
                "SET".to_owned(),
                "maxmemory".to_owned(),
                (used / 2).to_string(),
            ],
        )
        .await
        .unwrap();
    // A publish into the full Redis fails whole with OOM: LPUSH, and schedule.lua (no flag).
    for delayed in [false, true] {
        let mut m = p.message(&Job { n: 999 }).to(Q);
        if delayed {
            m = m.delay(Duration::from_secs(60));
        }
        let e = m
            .publish()
            .await
            .expect_err("a publish into a full Redis fails");
        assert_eq!(
            e.kind(),
            ruststream::ErrorKind::OutOfMemory,
            "delayed={delayed}: {e}"
        );
    }
    let e = p.message(&Job { n: 999 }).to(S).publish().await;
    assert!(
        e.is_err_and(|e| e.kind() == ruststream::ErrorKind::OutOfMemory),
        "XADD"
    );
    let (rec, from_stream) = (Rec::acking(), Rec::acking());
    let (r, rs) = (rec.clone(), from_stream.clone());
    let app = start(app_on(broker(), Duration::from_millis(100), |b| {
        b.include(subscriber(reliable(), r).build());
        b.include(subscriber(RedisStream::new(S).group("g"), rs).build());
    }))
    .await;
    wait_until("all 201 + 101 handled", Duration::from_secs(20), || async {
        rec.distinct() == 201 && from_stream.distinct() == 101
    })
    .await;
    let llen = |key: String| {
        let raw = raw.clone();
        async move { raw.llen::<i64, _>(format!("oom:{key}")).await.unwrap() }
    };
    wait_until("the queue drained", Duration::from_secs(10), || async {
        llen(Q.to_owned()).await == 0 && llen(k(".processing")).await == 0
    })
    .await;
    let delayed: i64 = raw.zcard(format!("oom:{}", k(".delayed"))).await.unwrap();
    assert_eq!(delayed, 0, "the due delayed entry was moved");
    assert_eq!(rec.count(), 201, "each handled once");
    assert_eq!(from_stream.count(), 101, "each handled once");
    let pending: Value = raw
        .custom(
            fred::cmd!("XPENDING"),
            vec![format!("oom:{S}"), "g".to_owned()],
        )
        .await
        .unwrap();
    assert!(
        matches!(&pending, Value::Array(v) if v.first().and_then(Value::as_i64) == Some(0)),
        "all acknowledged: {pending:?}"
    );
    // Still full: a publish is still refused.
    let e = p.message(&Job { n: 1000 }).to(Q).publish().await;
    assert!(e.is_err_and(|e| e.kind() == ruststream::ErrorKind::OutOfMemory));
    bounded("stop", Duration::from_secs(10), app.shutdown())
        .await
        .unwrap();
    let _ = raw.quit().await;
    drop(redis);
}
