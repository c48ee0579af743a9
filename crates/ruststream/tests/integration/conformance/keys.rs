//! Keys, expiry and delayed sets with raw commands, and the cluster's slot rule.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::bytes::Bytes;
use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::redis::frame::Frame;
use ruststream::{Publisher, subscriber};
use ruststream_core::Broker as _;

use super::*;
use crate::harness::metrics::prometheus;
use crate::harness::{Env, on};

on!(
    [memory, standalone]
    lists_sets_and_expiry,
    delayed_order_and_idempotence,
);

on!([memory_cluster, cluster] cluster_slot_rule);

async fn lists_sets_and_expiry(env: &Env) {
    let (l, z, h) = (env.key("l"), env.key("z"), env.key("h"));
    let _: i64 = env.client.lpush(&l, vec!["a", "b"]).await.expect("LPUSH");
    let _: bool = env.client.pexpire(&l, 10_000, None).await.expect("PEXPIRE");
    let _: i64 = env.client.lpush(&l, "c").await.expect("LPUSH");
    assert!(env.pttl("l").await > 0, "a push keeps the expiry");
    let popped: Vec<String> = env.client.rpop(&l, Some(5)).await.expect("RPOP");
    assert_eq!(popped, ["a", "b", "c"]);
    assert_eq!(
        (env.exists("l").await, env.pttl("l").await),
        (false, -2),
        "an emptied list is gone, with its expiry"
    );
    let s = |v: &str| Value::from(v.to_owned());
    env.cmd(
        "ZADD",
        vec![
            s(&z),
            s("1700000000000"),
            s("m1"),
            s("1.5"),
            s("m0"),
            s("1.5"),
            s("a"),
        ],
    )
    .await
    .expect("ZADD");
    let r = env
        .cmd(
            "ZRANGEBYSCORE",
            vec![
                s(&z),
                s("-inf"),
                s("+inf"),
                s("WITHSCORES"),
                s("LIMIT"),
                s("0"),
                s("10"),
            ],
        )
        .await
        .expect("ZRANGEBYSCORE");
    let got: Vec<String> = r
        .into_array()
        .into_iter()
        .filter_map(|v| v.as_string())
        .collect();
    assert_eq!(got, ["a", "1.5", "m0", "1.5", "m1", "1700000000000"]);
    let wrong = env
        .client
        .llen::<i64, _>(&z)
        .await
        .expect_err("LLEN of a zset");
    assert!(wrong.details().starts_with("WRONGTYPE"), "{wrong:?}");
    let _: i64 = env.client.hset(&h, ("f", "v")).await.expect("HSET");
    let set: i64 = env
        .cmd("HSETNX", vec![s(&h), s("f"), s("w")])
        .await
        .expect("HSETNX")
        .as_i64()
        .unwrap_or(-1);
    assert_eq!(set, 0);
    let _: i64 = env.client.hdel(&h, "f").await.expect("HDEL");
    assert!(!env.exists("h").await, "an emptied hash is gone");
}

/// `(count, sum)` of the delivery lateness recorded for the (full) queue name `queue`.
fn lateness(queue: &str) -> (f64, f64) {
    let text = prometheus().render();
    let label = format!("queue=\"{queue}\"");
    let sample = |name: &str| {
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(&label))
            .find_map(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    (
        sample("ruststream_delivery_lateness_seconds_count"),
        sample("ruststream_delivery_lateness_seconds_sum"),
    )
}

/// Publishes `Job { n }` with id `id`, due at `at`, to `to`.
async fn publish_at(p: &Publisher, to: &str, id: &str, at: SystemTime, n: u32) {
    p.message(&Job { n })
        .to(to)
        .id(id)
        .at(at)
        .publish()
        .await
        .expect("a delayed publish");
}

/// `ZSCORE` of `member` in the (full) key `zset`.
async fn zscore(env: &Env, zset: &str, member: &str) -> Option<f64> {
    env.client.zscore(zset, member).await.expect("ZSCORE")
}

/// The frame waiting under `id` in the payload hash of the (full) delayed set `zset`.
async fn waiting(env: &Env, zset: &str, id: &str) -> Frame {
    let raw: Option<Bytes> = env
        .client
        .hget(format!("{zset}.payloads"), id)
        .await
        .expect("HGET");
    Frame::decode(raw.unwrap_or_else(|| panic!("{id} waits in {zset}.payloads")))
}

/// Delayed entries through the public API: each waits in its destination's delayed set under
/// its id, due at the time it was given; an id already waiting keeps its first schedule; a
/// subscription's reader moves the due ones, earliest due first in line (a list's consuming end),
/// a stream's as entries with the frame's fields, records each one's lateness, and leaves those
/// not yet due.
async fn delayed_order_and_idempotence(env: &Env) {
    let prometheus = prometheus();
    let broker = env.broker().route("{j}s", stream::Publish::new());
    let p = broker.publisher();
    let epoch = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
    // Published out of due order: `c` (due at 2000) before `a` (due at 1000), both long due;
    // `d` an hour from now. `b` (due at 3000) goes to a stream.
    publish_at(&p, "{j}", "c", epoch(2000), 1).await;
    publish_at(&p, "{j}", "a", epoch(1000), 1).await;
    p.message(&Job { n: 1 })
        .to("{j}")
        .id("d")
        .delay(Duration::from_secs(3600))
        .publish()
        .await
        .expect("a delayed publish");
    publish_at(&p, "{j}s", "b", epoch(3000), 1).await;
    let (list_set, stream_set) = (
        broker.delayed_set_key("{j}"),
        broker.delayed_set_key("{j}s"),
    );
    let scores = async || {
        (
            zscore(env, &list_set, "a").await,
            zscore(env, &list_set, "c").await,
            zscore(env, &stream_set, "b").await,
        )
    };
    assert_eq!(scores().await, (Some(1000.0), Some(2000.0), Some(3000.0)));
    let zcard = async |k: &str| -> i64 { env.client.zcard(k).await.expect("ZCARD") };
    assert_eq!((zcard(&list_set).await, zcard(&stream_set).await), (3, 1));

    // Ids already waiting keep their schedule and their payload.
    for (to, id) in [("{j}", "a"), ("{j}", "c"), ("{j}s", "b")] {
        publish_at(&p, to, id, epoch(500), 2).await;
    }
    assert_eq!(
        scores().await,
        (Some(1000.0), Some(2000.0), Some(3000.0)),
        "ids already waiting keep their schedule"
    );
    assert_eq!((zcard(&list_set).await, zcard(&stream_set).await), (3, 1));
    let a = waiting(env, &list_set, "a").await;
    assert_eq!(
        (a.id.as_str(), a.attempt, &a.payload[..]),
        ("a", 1, job_json(1).as_bytes())
    );

    // One handler at a time that never finishes: the list's reader moves the due entries, then
    // claims one, from the consuming end, and stops there.
    let (held, streamed) = (Rec::planned(|_| Act::Hang), Rec::planned(always_ack));
    let (h, s) = (held.clone(), streamed.clone());
    let app = env
        .start_with(|m| {
            // Without recovery, so the keys left are the delayed sets' (a claims set is not).
            m.include(
                subscriber(
                    RedisList::new("{j}")
                        .reliable()
                        .no_recovery()
                        .concurrency(1),
                    h,
                )
                .build(),
            );
            m.include(subscriber(RedisStream::new("{j}s").group("g"), s).build());
        })
        .await;
    wait_seen(env, &held, 1).await;
    wait_seen(env, &streamed, 1).await;
    let ids = async |key: &str| -> Vec<String> {
        env.frames(key).await.into_iter().map(|f| f.id).collect()
    };
    env.eventually("the claim is in the processing list", async || {
        ids("{j}.processing").await == ["a"]
    })
    .await;
    assert_eq!(held.seen()[0].id, "a", "the earliest due is taken first");
    assert_eq!(ids("{j}").await, ["c"], "the next waits in the queue");
    let left: Vec<String> = env
        .client
        .zrange(&list_set, 0, -1, None, false, None, false)
        .await
        .expect("ZRANGE");
    assert_eq!(left, ["d"], "not due yet: still waiting");
    // The stream got `b` as an entry with the frame's fields (its first payload).
    let entries: Value = env
        .cmd(
            "XRANGE",
            vec![env.key("{j}s").into(), "-".into(), "+".into()],
        )
        .await
        .expect("XRANGE");
    let fields: Vec<String> = entries.into_array()[0].clone().into_array()[1]
        .clone()
        .into_array()
        .into_iter()
        .filter_map(|v| v.as_string())
        .collect();
    assert_eq!(
        fields,
        ["rs.id", "b", "rs.attempt", "1", "payload", &job_json(1)]
    );
    assert_eq!(streamed.seen()[0].id, "b");
    // Each moved entry's lateness is recorded: two for the list, one for the stream.
    let (list_late, stream_late) = (lateness(&env.key("{j}")), lateness(&env.key("{j}s")));
    assert_eq!(
        (list_late.0, stream_late.0),
        (2.0, 1.0),
        "{}",
        prometheus.render()
    );
    assert!(
        list_late.1 > 0.0 && stream_late.1 > 0.0,
        "due decades ago: {list_late:?} {stream_late:?}"
    );
    env.stop(app).await;
    assert_eq!(
        env.keys().await,
        [
            "{j}",
            "{j}.delayed",
            "{j}.delayed.payloads",
            "{j}.processing",
            "{j}s"
        ],
        "the stream's delayed set and payloads are gone"
    );
}

// ---------------------------------------------------------------------------------------------
// Cluster: the slot rule.
// ---------------------------------------------------------------------------------------------

/// The slot rule for delayed sets: a delayed set and its payload hash are used together (by the
/// scripts that schedule and move), so they must share a slot; an untagged name's derived keys
/// are put in the queue's slot.
async fn cluster_slot_rule(env: &Env) {
    // Untagged, `jobs.delayed` and `jobs.delayed.payloads` hash to two slots: a command on both
    // is refused.
    let split = env
        .cmd(
            "LMOVE",
            vec![
                env.key("jobs.delayed").into(),
                env.key("jobs.delayed.payloads").into(),
                "RIGHT".into(),
                "LEFT".into(),
            ],
        )
        .await
        .expect_err("keys in two slots");
    // The server says CROSSSLOT; fred says so first when the two slots are on different nodes.
    assert!(
        split.details().starts_with("CROSSSLOT")
            || split
                .details()
                .contains("must belong to the same cluster node"),
        "{split:?}"
    );
    let tagged = env
        .cmd(
            "LMOVE",
            vec![
                env.key("{jobs}.delayed").into(),
                env.key("{jobs}.delayed.payloads").into(),
                "RIGHT".into(),
                "LEFT".into(),
            ],
        )
        .await
        .expect("keys in one slot");
    assert!(tagged.is_null(), "nothing to move: {tagged:?}");
    // Through the broker: a tagged queue's delayed set is `{jobs}.delayed`, its entry scheduled.
    let broker = env.broker();
    broker.connect().await.expect("connect");
    let p = broker.publisher();
    for to in ["{jobs}", "jobs"] {
        p.message(&Job { n: 1 })
            .to(to)
            .delay(Duration::from_secs(60))
            .publish()
            .await
            .unwrap_or_else(|e| panic!("a delayed publish to {to}: {e}"));
    }
    assert_eq!(broker.delayed_set_key("{jobs}"), env.key("{jobs}.delayed"));
    assert_eq!(
        (
            env.zcard("{jobs}.delayed").await,
            env.hlen("{jobs}.delayed.payloads").await
        ),
        (1, 1),
        "scheduled in the tagged queue's slot"
    );
    // The delayed set of an untagged queue is derived into the queue's slot.
    let delayed = broker.delayed_set_key("jobs");
    let payloads = format!("{delayed}.payloads");
    let queue_slot = fred::util::redis_keyslot(env.key("jobs").as_bytes());
    for k in [&delayed, &payloads] {
        assert_eq!(
            fred::util::redis_keyslot(k.as_bytes()),
            queue_slot,
            "{k} in the queue's slot"
        );
    }
    let n: i64 = env.client.zcard(&delayed).await.expect("ZCARD");
    let h: i64 = env.client.hlen(&payloads).await.expect("HLEN");
    assert_eq!((n, h), (1, 1), "scheduled in {delayed}");
    broker.close().await;
    // Outside the test's prefix (the tag comes first): not removed by the cleanup.
    for k in [delayed, payloads] {
        let _: i64 = env.client.del(k).await.expect("DEL");
    }
}
