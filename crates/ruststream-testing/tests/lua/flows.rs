//! The flow scripts through their typed calls (`StartFlow`, `MarkSent`, `ChildDone`): a record
//! written once and a resent start answering what is left to publish; a child's end recorded
//! once (a resent report answers 0); the last end enqueuing the parent through `back.lua`, once;
//! a dead child under `fail` enqueuing the parent with the header naming it; the publishing set
//! and the plan while children are unsent, and the mover taking a flow for repair once.

use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::ChildOutcome;
use ruststream_redis::DeadBound;
use ruststream_redis::testing::{Call, ChildDone, Dest, MarkSent, MoveDue, StartFlow};

use crate::{key, on_both};

fn parent() -> Bytes {
    ruststream_redis::frame::encode_parts("f", 1, &ruststream_core::Headers::new(), b"{}")
}

/// Starts flow `f` of children `a b` under `policy`, twice; marks `a` sent; reports `a` acked
/// twice and `b` with `b_end` twice. Returns the starts' and marks' answers, the reports', and
/// the parent queue's frames' `rs.flow.failed` header.
async fn flow(
    client: Client,
    prefix: String,
    policy: &'static str,
    b_end: ChildOutcome,
) -> (Vec<Vec<String>>, u64, Vec<u64>, Vec<Option<String>>) {
    let record = key(&prefix, ".flow:f");
    let queue = key(&prefix, "");
    let publishing = key(&prefix, ".flows.publishing");
    let start = StartFlow {
        record: &record,
        publishing: &publishing,
        id: "f",
        parent: parent(),
        plan: Bytes::from_static(b"plan"),
        policy,
        max_age: Duration::from_secs(60),
        children: vec!["a".into(), "b".into()],
    };
    let first = start.call(&client).await.unwrap();
    let marked = MarkSent {
        record: &record,
        publishing: &publishing,
        children: &["a".to_owned()],
    }
    .call(&client)
    .await
    .unwrap();
    let again = start.call(&client).await.unwrap();
    let dest = Dest::list(vec![queue.clone()]);
    let report = |child: &'static str, outcome: ChildOutcome| {
        let (client, record, dest) = (client.clone(), record.clone(), dest.clone());
        async move {
            ChildDone {
                record: &record,
                dest: &dest,
                child,
                outcome: &outcome,
                result: Some(Bytes::from_static(b"7")),
                ttl: Duration::from_secs(60),
            }
            .call(&client)
            .await
            .unwrap()
        }
    };
    let mut reports = vec![
        report("a", ChildOutcome::Acked).await,
        report("a", ChildOutcome::Acked).await,
    ];
    reports.push(report("b", b_end.clone()).await);
    reports.push(report("b", b_end).await);
    let frames: Vec<Bytes> = client.lrange(&queue, 0, -1).await.unwrap();
    let failed = frames
        .into_iter()
        .map(|f| {
            ruststream_redis::frame::Frame::decode(f)
                .headers
                .get("rs.flow.failed")
                .cloned()
        })
        .collect();
    let _: i64 = client.del(vec![record, queue, publishing]).await.unwrap();
    (vec![first, again], marked, reports, failed)
}

#[tokio::test]
async fn the_last_end_enqueues_the_parent_once() {
    let expect = (
        vec![vec!["a".to_owned(), "b".to_owned()], vec!["b".to_owned()]],
        1,
        vec![1, 0, 2, 0],
        vec![None],
    );
    on_both("flowdone", expect, |c, p| {
        flow(c, p, "fail", ChildOutcome::Acked)
    })
    .await;
}

#[tokio::test]
async fn a_dead_child_fails_the_parent_naming_it() {
    let dead = ChildOutcome::Dead {
        reason: "dropped".into(),
    };
    let expect = (
        vec![vec!["a".to_owned(), "b".to_owned()], vec!["b".to_owned()]],
        1,
        vec![1, 0, 2, 0],
        vec![Some("child-failed: b".to_owned())],
    );
    on_both("flowfail", expect, move |c, p| {
        flow(c, p, "fail", dead.clone())
    })
    .await;
}

/// What the publishing set, the plan and the mover say along one flow: start `f` (children `a
/// b`), a repair's start of a flow whose record is gone, the mover before and after the entry
/// is older than the grace and once more, then `a` marked, then `b`.
async fn publishing(client: Client, prefix: String) -> Vec<String> {
    let record = key(&prefix, ".flow:f");
    let publishing = key(&prefix, ".flows.publishing");
    let (set, payloads, queue) = (
        key(&prefix, ".delayed"),
        key(&prefix, ".delayed.payloads"),
        key(&prefix, ""),
    );
    let start = |record: String, plan: &'static [u8]| {
        let (client, publishing) = (client.clone(), publishing.clone());
        async move {
            StartFlow {
                record: &record,
                publishing: &publishing,
                id: "f",
                parent: parent(),
                policy: "fail",
                max_age: Duration::from_secs(60),
                plan: Bytes::from_static(plan),
                children: vec!["a".into(), "b".into()],
            }
            .call(&client)
            .await
            .unwrap()
        }
    };
    let dest = Dest::list(vec![queue.clone()]);
    let mover = || {
        let (client, set, payloads, publishing, dest) = (
            client.clone(),
            set.clone(),
            payloads.clone(),
            publishing.clone(),
            dest.clone(),
        );
        async move {
            MoveDue {
                set: &set,
                payloads: &payloads,
                dead: None,
                bound: DeadBound::default(),
                publishing: &publishing,
                grace: Duration::from_secs(30),
                dest: &dest,
                most: 10,
            }
            .call(&client)
            .await
            .unwrap()
            .repair
        }
    };
    let mark = |child: &'static str| {
        let (client, record, publishing) = (client.clone(), record.clone(), publishing.clone());
        async move {
            MarkSent {
                record: &record,
                publishing: &publishing,
                children: &[child.to_owned()],
            }
            .call(&client)
            .await
            .unwrap()
        }
    };
    let state = || {
        let (client, record, publishing) = (client.clone(), record.clone(), publishing.clone());
        async move {
            let members: Vec<String> = client
                .zrange(&publishing, 0, -1, None, false, None, false)
                .await
                .unwrap();
            let ttl: i64 = client.pttl(&publishing).await.unwrap();
            let plan: Option<String> = client.hget(&record, "plan").await.unwrap();
            format!("{members:?} ttl {} plan {plan:?}", ttl > 0)
        }
    };
    let mut out = vec![format!("{:?}", start(record.clone(), b"plan").await)];
    out.push(state().await);
    out.push(format!(
        "{:?}",
        start(key(&prefix, ".flow:gone"), b"").await
    ));
    out.push(format!("{:?}", mover().await));
    let _: i64 = client
        .zadd(
            &publishing,
            None,
            None,
            false,
            false,
            (1000.0, record.as_str()),
        )
        .await
        .unwrap();
    out.push(format!("{:?}", mover().await));
    out.push(format!("{:?}", mover().await));
    out.push(format!("{}", mark("a").await));
    out.push(state().await);
    out.push(format!("{}", mark("b").await));
    out.push(state().await);
    let _: i64 = client.del(vec![record, publishing]).await.unwrap();
    out
}

#[tokio::test]
async fn a_flow_is_in_the_publishing_set_with_its_plan_until_every_child_is_sent() {
    let expect = |prefix: &str| {
        let record = key(prefix, ".flow:f");
        vec![
            "[\"a\", \"b\"]".to_owned(),
            format!("[{record:?}] ttl true plan Some(\"plan\")"),
            "[]".to_owned(),
            "[]".to_owned(),
            format!("[{record:?}]"),
            "[]".to_owned(),
            "1".to_owned(),
            format!("[{record:?}] ttl true plan Some(\"plan\")"),
            "1".to_owned(),
            "[] ttl false plan None".to_owned(),
        ]
    };
    let model = ruststream_testing::MemoryRedis::new();
    let client = model.client().expect("a model client");
    client.init().await.expect("init");
    assert_eq!(
        publishing(client, "pub-model".into()).await,
        expect("pub-model")
    );
    let Some(redis) = crate::redis().await else {
        return;
    };
    let prefix = format!("rspub-{}-{}", std::process::id(), crate::fastrand_suffix());
    assert_eq!(
        publishing(redis.clone(), prefix.clone()).await,
        expect(&prefix)
    );
}
