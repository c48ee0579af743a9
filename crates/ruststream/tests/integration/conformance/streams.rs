//! Streams with consumer groups: ack, retry, retry_after, drop; and the group commands
//! themselves (pending entries, delivery counts, claims) with raw commands.

use std::time::Duration;

use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::subscriber;

use super::*;
use crate::harness::{Env, on};

on!(
    [memory, standalone]
    stream_ack_retry_drop,
    stream_retry_after,
    stream_pending_entries_and_delivery_counts,
);

async fn xpending_count(env: &Env, key: &str, group: &str) -> i64 {
    match env
        .cmd("XPENDING", vec![env.key(key).into(), group.into()])
        .await
        .expect("XPENDING")
    {
        Value::Array(v) => v.first().and_then(Value::as_i64).unwrap_or(-1),
        other => panic!("XPENDING: {other:?}"),
    }
}

async fn xlen(env: &Env, key: &str) -> i64 {
    env.client.xlen(env.key(key)).await.expect("XLEN")
}

async fn stream_ack_retry_drop(env: &Env) {
    let ack = Rec::planned(always_ack);
    let retried = Rec::planned(retry_once);
    let dropped = Rec::planned(drop_it);
    let (a, r, d) = (ack.clone(), retried.clone(), dropped.clone());
    let app = env
        .start_with(|b| {
            b.include(subscriber(RedisStream::new("sa").group("g"), a).build());
            b.include(
                subscriber(
                    RedisStream::new("sr")
                        .group("g")
                        .retry(Backoff::immediate()),
                    r,
                )
                .build(),
            );
            b.include(subscriber(RedisStream::new("sd").group("g"), d).build());
        })
        .await;
    for key in ["sa", "sr", "sd"] {
        publish(env, key, &[Job { n: 2 }]).await;
    }
    wait_seen(env, &ack, 1).await;
    wait_seen(env, &retried, 2).await;
    wait_seen(env, &dropped, 1).await;
    assert_eq!(retried.attempts(), [1, 2]);
    let seen = retried.seen();
    assert_eq!(seen[0].id, seen[1].id, "a retry keeps the message id");
    env.eventually("every entry acknowledged", async || {
        xpending_count(env, "sa", "g").await == 0
            && xpending_count(env, "sr", "g").await == 0
            && xpending_count(env, "sd", "g").await == 0
    })
    .await;
    assert_eq!(
        (
            xlen(env, "sa").await,
            xlen(env, "sr").await,
            xlen(env, "sd").await
        ),
        (1, 2, 1),
        "a retry is a new entry"
    );
    env.eventually("the drop's dead letter", async || {
        env.llen("sd.dead").await == 1
    })
    .await;
    let dead = env.frames("sd.dead").await;
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("dropped")
    );
    env.stop(app).await;
}

async fn stream_retry_after(env: &Env) {
    let (rec, app) = start_planned(env, RedisStream::new("s").group("g"), retry_after_300ms).await;
    publish(env, "s", &[Job { n: 6 }]).await;
    wait_seen(env, &rec, 2).await;
    let seen = rec.seen();
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(1800),
        "retried after {waited:?}, asked 300 ms"
    );
    assert_eq!(
        (rec.attempts(), seen[0].id == seen[1].id),
        (vec![1, 2], true)
    );
    env.eventually("acknowledged, moved from the delayed set", async || {
        xpending_count(env, "s", "g").await == 0 && !env.exists("s.delayed").await
    })
    .await;
    assert_eq!(xlen(env, "s").await, 2);
    env.stop(app).await;
}

/// Groups, pending entries and delivery counts with raw commands.
async fn stream_pending_entries_and_delivery_counts(env: &Env) {
    let k = env.key("raw");
    let s = |v: &str| Value::from(v.to_owned());
    env.cmd(
        "XGROUP",
        vec![s("CREATE"), s(&k), s("g"), s("0"), s("MKSTREAM")],
    )
    .await
    .expect("XGROUP CREATE");
    let busy = env
        .cmd(
            "XGROUP",
            vec![s("CREATE"), s(&k), s("g"), s("0"), s("MKSTREAM")],
        )
        .await
        .expect_err("a second CREATE");
    assert!(busy.details().starts_with("BUSYGROUP"), "{busy:?}");
    for v in ["1", "2"] {
        env.cmd("XADD", vec![s(&k), s("*"), s("a"), s(v)])
            .await
            .expect("XADD");
    }
    let read = |id: &'static str| {
        vec![
            s("GROUP"),
            s("g"),
            s("c1"),
            s("COUNT"),
            s("10"),
            s("STREAMS"),
            s(&k),
            s(id),
        ]
    };
    let new = env
        .cmd("XREADGROUP", read(">"))
        .await
        .expect("XREADGROUP >");
    assert_eq!(entries(&new).len(), 2);
    let again = env
        .cmd("XREADGROUP", read(">"))
        .await
        .expect("XREADGROUP >");
    assert!(again.is_null(), "nothing new: {again:?}");
    let history = env
        .cmd("XREADGROUP", read("0"))
        .await
        .expect("XREADGROUP 0");
    let ids = entries(&history);
    assert_eq!(ids.len(), 2, "the consumer's pending entries");
    let pending = env
        .cmd("XPENDING", vec![s(&k), s("g"), s("-"), s("+"), s("10")])
        .await
        .expect("XPENDING");
    let counts: Vec<(String, i64)> = pending
        .into_array()
        .into_iter()
        .map(|p| {
            let p = p.into_array();
            (
                p[1].as_string().unwrap_or_default(),
                p[3].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(
        counts,
        [("c1".to_owned(), 2), ("c1".to_owned(), 2)],
        "reading history counts a delivery"
    );
    let acked = env
        .cmd("XACK", vec![s(&k), s("g"), s(&ids[0])])
        .await
        .expect("XACK");
    assert_eq!(acked.as_i64(), Some(1));
    let claimed = env
        .cmd("XCLAIM", vec![s(&k), s("g"), s("c2"), s("0"), s(&ids[1])])
        .await
        .expect("XCLAIM");
    assert_eq!(claimed.into_array().len(), 1);
    let summary = env
        .cmd("XPENDING", vec![s(&k), s("g")])
        .await
        .expect("XPENDING")
        .into_array();
    assert_eq!(summary[0].as_i64(), Some(1));
    let per_consumer = summary[3].clone().into_array();
    let first = per_consumer[0].clone().into_array();
    assert_eq!(first[0].as_string().as_deref(), Some("c2"));
    let nogroup = env
        .cmd(
            "XREADGROUP",
            vec![s("GROUP"), s("nope"), s("c"), s("STREAMS"), s(&k), s(">")],
        )
        .await
        .expect_err("an unknown group");
    assert!(nogroup.details().starts_with("NOGROUP"), "{nogroup:?}");
}

/// The ids of an `XREADGROUP` reply's entries.
fn entries(reply: &Value) -> Vec<String> {
    let mut ids = Vec::new();
    if let Value::Array(streams) = reply {
        for s in streams {
            if let Value::Array(kv) = s
                && let Some(Value::Array(es)) = kv.get(1)
            {
                for e in es {
                    if let Value::Array(parts) = e
                        && let Some(id) = parts.first().and_then(Value::as_string)
                    {
                        ids.push(id);
                    }
                }
            }
        }
    }
    ids
}
