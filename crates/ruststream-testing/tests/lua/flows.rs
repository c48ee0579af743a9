//! The flow scripts through their typed calls (`StartFlow`, `MarkSent`, `ChildDone`): a record
//! written once and a resent start answering what is left to publish; a child's end recorded
//! once (a resent report answers 0); the last end enqueuing the parent through `back.lua`, once;
//! a dead child under `fail` enqueuing the parent with the header naming it.

use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::ChildOutcome;
use ruststream_redis::{Call, ChildDone, Dest, MarkSent, StartFlow};

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
    let start = StartFlow {
        record: &record,
        id: "f",
        parent: parent(),
        policy,
        max_age: Duration::from_secs(60),
        children: vec!["a".into(), "b".into()],
    };
    let first = start.call(&client).await.unwrap();
    let marked = MarkSent {
        record: &record,
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
    let _: i64 = client.del(vec![record, queue]).await.unwrap();
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
