//! A settle removes the step records (`K.steps:<id>`) of the messages it acknowledges (op `A`)
//! or dead-letters (op `X`) in the same script, and keeps those of the messages it retries.

use bytes::Bytes;
use fred::prelude::*;
use ruststream_redis::frame::encode_parts;
use ruststream_redis::{Call, DeadBound, Op, SettleList};

use crate::{key, on_both};

/// Three claims with a step record each, settled as an ack, a dead letter and a retry: which
/// records are left, how many dead letters there are, and what the processing list holds.
async fn settle_with_steps(client: Client, prefix: String) -> (Vec<bool>, i64, i64, i64) {
    let k = |s: &str| key(&prefix, s);
    let claimed: Vec<Bytes> = ["s1", "s2", "s3"]
        .iter()
        .map(|id| encode_parts(id, 1, &Default::default(), b"{}"))
        .collect();
    let _: i64 = client
        .lpush(k("q.processing"), claimed.clone())
        .await
        .expect("LPUSH");
    let records: Vec<String> = ["s1", "s2", "s3"]
        .iter()
        .map(|id| k(&format!("q.steps:{id}")))
        .collect();
    for r in &records {
        let _: i64 = client.hset(r, ("charge", "\"paid\"")).await.expect("HSET");
    }
    let (keys, dest) = crate::dead::list_keys(&prefix);
    let bound = DeadBound {
        max_len: 10,
        max_age: std::time::Duration::from_secs(3600),
    };
    let ops = [
        Op::AckSteps {
            steps: records[0].clone(),
        },
        Op::Dead {
            frame: claimed[1].clone(),
            bound,
            steps: Some(records[1].clone()),
        },
        Op::Retry {
            frame: claimed[2].clone(),
        },
    ];
    SettleList {
        keys: &keys,
        dest: &dest,
        token: Some("t1".into()),
        entries: claimed
            .iter()
            .zip(ops)
            .map(|(c, op)| (c.clone(), None, op))
            .collect(),
    }
    .call(&client)
    .await
    .expect("settle.lua runs");
    let mut left = Vec::new();
    for r in &records {
        let n: i64 = client.exists(r).await.expect("EXISTS");
        left.push(n == 1);
    }
    let dead: i64 = client.llen(k("q.dead")).await.expect("LLEN");
    let queued: i64 = client.llen(k("q")).await.expect("LLEN");
    let processing: i64 = client.llen(k("q.processing")).await.expect("LLEN");
    let mut all = records.clone();
    all.extend(["q", "q.dead", "q.processing", "q.settles"].map(k));
    let _: i64 = client.del(all).await.unwrap_or(0);
    (left, dead, queued, processing)
}

#[tokio::test]
async fn a_settle_removes_the_step_records_of_what_it_acks_or_dead_letters() {
    on_both(
        "settlesteps",
        (vec![false, false, true], 1, 1, 0),
        settle_with_steps,
    )
    .await;
}
