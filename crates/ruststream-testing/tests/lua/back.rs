//! Every way back to a queue (`back.lua`) through the typed calls of the scripts that use it.

use std::time::Duration;

use fred::prelude::*;
use ruststream_testing::MemoryRedis;

use crate::Reply::{self, Int, List};
use crate::{fastrand_suffix, redis, reply, t};

/// A frame of message `id` with the given headers (`rs.priority` puts it on a level).
fn frame(id: &str, headers: &[(&str, &str)]) -> bytes::Bytes {
    let mut h = ruststream_core::Headers::new();
    for (k, v) in headers {
        h.insert((*k).to_owned(), (*v).to_owned());
    }
    ruststream_redis::frame::encode_parts(id, 1, &h, b"{}")
}

/// Every way back to a queue through its typed call (the same the settlers, the mover, the
/// operator and the publisher use), all through `back.lua`: a retry goes onto its own level, a
/// due delayed entry onto its own level, a dead letter back onto a stream as fields with its
/// reason in `dead-history`, a unique publish once per window onto its level. Returns what each
/// key holds afterwards.
async fn the_way_back(client: &Client, prefix: &str) -> Vec<Reply> {
    use ruststream_redis::testing::{
        Call, Dest, Later, MoveDue, Op, PublishUnique, Requeue, ScheduleLater, SettleKeys,
        SettleList, Taken, UniqueBatch,
    };
    let key = |s: &str| format!("{{{prefix}}}q{s}");
    let levels = vec![key(""), key(".p1")];
    let dest = Dest::list(levels.clone());
    let high = frame("h", &[("rs.priority", "1")]);
    let low = frame("l", &[]);
    let _: i64 = client
        .lpush(key(".processing"), vec![high.clone(), low.clone()])
        .await
        .unwrap();
    let keys = SettleKeys {
        processing: key(".processing"),
        dead: key(".dead"),
        delayed: key(".delayed"),
        payloads: key(".delayed.payloads"),
        record: key(".settles"),
        cancels: key(".cancels"),
    };
    let settled = SettleList {
        keys: &keys,
        dest: &dest,
        token: Some("t1".into()),
        entries: vec![
            (
                high.clone(),
                None,
                Op::Retry {
                    frame: high.clone(),
                },
            ),
            (low.clone(), None, Op::Ack),
        ],
    }
    .call(client)
    .await
    .expect("the settle runs");
    let later = [Later {
        due: ruststream_core::Due::In(Duration::ZERO),
        id: "d".into(),
        frame: frame("d", &[("rs.priority", "1")]),
        unique: None,
    }];
    let scheduled = ScheduleLater {
        set: &keys.delayed,
        payloads: &keys.payloads,
        token: "t2",
        entries: &later,
    }
    .call(client)
    .await
    .expect("the schedule runs");
    let moved = MoveDue {
        set: &keys.delayed,
        payloads: &keys.payloads,
        dead: Some(&keys.dead),
        bound: ruststream_redis::DeadBound::default(),
        publishing: &key(".flows.publishing"),
        grace: std::time::Duration::from_secs(30),
        dest: &dest,
        most: 10,
    }
    .call(client)
    .await
    .expect("the mover runs");
    let _: i64 = client
        .lpush(
            &keys.dead,
            frame("x", &[("reason", "max-attempts"), ("dead-at", "1000")]),
        )
        .await
        .unwrap();
    let stream = Dest::Stream {
        key: key(".s"),
        bound: "maxlen:10".into(),
    };
    let requeued = Requeue {
        dead: &keys.dead,
        dest: &stream,
        take: Taken::Oldest(5),
    }
    .call(client)
    .await
    .expect("the requeue runs");
    let mut batch = UniqueBatch::default();
    for _ in 0..2 {
        batch.frame(
            key(".unique:u"),
            Duration::from_secs(60),
            Value::Bytes(frame("u", &[("rs.priority", "1")])),
        );
    }
    let published = PublishUnique {
        dest: &dest,
        token: "t3",
        batch: &batch,
    }
    .call(client)
    .await
    .expect("the unique publish runs");
    let mut out = vec![
        Int(settled.owned),
        Int(scheduled as i64),
        Int(moved.moved),
        Int(requeued),
        Int(published as i64),
    ];
    for l in &levels {
        out.push(reply(client.lrange(l, 0, -1).await));
    }
    let fields: Result<Value, _> = client
        .custom(
            fred::cmd!("XRANGE"),
            vec![key(".s"), "-".to_owned(), "+".to_owned()],
        )
        .await;
    // The entry's id differs between the two: keep its fields only.
    out.push(match reply(fields) {
        List(entries) => List(
            entries
                .into_iter()
                .map(|e| match e {
                    List(mut parts) if parts.len() == 2 => parts.remove(1),
                    other => other,
                })
                .collect(),
        ),
        other => other,
    });
    let mut all: Vec<String> = levels.clone();
    for s in [
        ".processing",
        ".dead",
        ".delayed",
        ".delayed.payloads",
        ".settles",
        ".s",
        ".unique:u",
    ] {
        all.push(key(s));
    }
    let _: i64 = client.del(all).await.unwrap_or(0);
    out
}

#[tokio::test]
async fn every_way_back_to_a_queue_gives_the_same_queues_on_the_model_and_on_redis() {
    let model = MemoryRedis::new();
    let client = model.client().expect("a model client");
    client.init().await.expect("init");
    let got = the_way_back(&client, "back-model").await;
    // Both claims owned (an ack and a retry); one scheduled, moved, requeued; the unique
    // publish counts both of its messages (one publish's token) and enqueues one.
    assert_eq!(
        &got[..5],
        &[Int(2), Int(1), Int(1), Int(1), Int(2)],
        "{got:?}"
    );
    assert_eq!(got[5], List(Vec::new()), "level 0 gets nothing: {got:?}");
    let List(high) = &got[6] else {
        panic!("level 1 is a list: {got:?}")
    };
    assert_eq!(
        high.len(),
        3,
        "the retry, the due entry and the unique publish: {got:?}"
    );
    let List(stream) = &got[7] else {
        panic!("the stream's entries: {got:?}")
    };
    let fields = [
        "rs.id",
        "x",
        "rs.attempt",
        "1",
        "dead-history",
        "max-attempts",
        "payload",
        "{}",
    ];
    assert_eq!(
        stream,
        &[List(fields.iter().map(|f| t(f)).collect())],
        "the dead letter as a stream entry, its reason in its history, its dead-at dropped"
    );
    let Some(redis) = redis().await else {
        return;
    };
    let prefix = format!("rsback-{}-{}", std::process::id(), fastrand_suffix());
    assert_eq!(the_way_back(&redis, &prefix).await, got);
    let _ = redis.quit().await;
}
