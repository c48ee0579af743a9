//! Every outcome is visible: what a source cannot honour is logged and counted, what is
//! discarded is logged, and what cannot be read is dead-lettered with the part named.

use std::time::Duration;

use fred::bytes::{BufMut, Bytes, BytesMut};
use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::redis::frame::MAGIC;

use super::common::*;
use crate::harness::{Env, on, stop};

// Standalone only: the counters are process-wide and labelled by subscription, not by key.
on!([standalone] a_simple_lists_ignored_retries_and_panics_are_logged_and_counted);

on!(
    [standalone, cluster]
    a_drop_without_a_dead_letter_list_is_logged,
    a_frame_with_a_header_key_that_is_not_utf8_is_dead_lettered_whole_with_the_part_named,
);

// The fault: a simple list cannot redeliver, so a retry, a retry_after or a panic there must not
// vanish without a log and a metric.
async fn a_simple_lists_ignored_retries_and_panics_are_logged_and_counted(env: &Env) {
    logs::capture();
    prometheus();
    // A key no other test of this binary uses: it is the metrics' `subscription` label.
    const QUIET: &str = "{ignored-outcomes}";
    let rec = Rec::deciding(|job, _, _| match job.n {
        0 => settle(HandlerOutcome::retry()),
        1 => settle(HandlerOutcome::retry_after(Duration::from_secs(1))),
        2 => Box::pin(async { panic!("handler panics on purpose") }),
        _ => ack(),
    });
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(subscriber(RedisList::new(QUIET).block(Duration::from_millis(200)), r).build());
    })
    .await;
    publish(env, QUIET, &jobs(4)).await;
    let sub = format!("subscription=\"{QUIET}\"");
    eventually("three ignored, one acked", async || {
        sample("ruststream_handled_total", &[&sub, "outcome=\"ignored\""]) == Some(3.0)
            && sample("ruststream_handled_total", &[&sub, "outcome=\"ack\""]) == Some(1.0)
    })
    .await;
    let warned = logs::lines_with(&["WARN", "the retry is ignored", QUIET]);
    assert_eq!(warned.len(), 3, "{warned:#?}");
    assert!(
        warned
            .iter()
            .any(|l| l.contains("retry (panic or timeout)")),
        "the panic is named: {warned:#?}"
    );
    assert_eq!(rec.count(), 4, "popped: nothing is delivered again");
    assert!(env.keys().await.is_empty(), "{:?}", env.keys().await);
    stop(app).await;
}

// The fault: a drop on a list with no_dead_letter() removes the message; it must not do so without
// a log.
async fn a_drop_without_a_dead_letter_list_is_logged(env: &Env) {
    logs::capture();
    let drop_all = || Rec::deciding(|_, _, _| settle(HandlerOutcome::drop()));
    for (key, reliable) in [("{reliable}", true), ("{simple}", false)] {
        let mut source = RedisList::new(key)
            .no_dead_letter()
            .block(Duration::from_millis(200));
        if reliable {
            source = source.reliable();
        }
        let rec = drop_all();
        let r = rec.clone();
        let app = worker(env, |b| {
            b.include(subscriber(source, r).build());
        })
        .await;
        let id = format!("{}-{key}-dropped", env.prefix);
        env.broker()
            .publisher()
            .message(&Job { n: 1 })
            .to(key)
            .id(&id)
            .publish()
            .await
            .unwrap();
        eventually("the discarded message is logged", async || {
            !logs::lines_with(&["WARN", "no dead-letter list", &id, "dropped"]).is_empty()
        })
        .await;
        eventually("and removed", async || env.keys().await.is_empty()).await;
        assert_eq!(rec.count(), 1, "{key}");
        stop(app).await;
    }
}

// The fault: a frame with one header key that is not UTF-8 must be dead-lettered with a reason
// naming that part, not a bare `decode: expected value`.
async fn a_frame_with_a_header_key_that_is_not_utf8_is_dead_lettered_whole_with_the_part_named(
    env: &Env,
) {
    const Q: &str = "{jobs}";
    let mut v = BytesMut::new();
    v.put_slice(MAGIC);
    v.put_u32(1);
    v.put_u16(3);
    v.put_slice(b"m-1");
    v.put_u16(2);
    for (key, val) in [(&b"ok"[..], &b"fine"[..]), (&b"\xff"[..], &b"x"[..])] {
        v.put_u16(u16::try_from(key.len()).unwrap());
        v.put_slice(key);
        v.put_u32(u32::try_from(val.len()).unwrap());
        v.put_slice(val);
    }
    v.put_slice(br#"{"n":1}"#);
    let value: Bytes = v.freeze();
    let _: i64 = env.client.lpush(env.key(Q), value.clone()).await.unwrap();
    let rec = Rec::acking();
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(
            subscriber(
                RedisList::new(Q)
                    .reliable()
                    .block(Duration::from_millis(200)),
                r,
            )
            .build(),
        );
    })
    .await;
    let dead = format!("{Q}.dead");
    eventually("dead-lettered", async || env.llen(&dead).await == 1).await;
    let frames = dead_frames(env, &dead).await;
    assert_eq!(
        frames[0].headers.get("reason").map(String::as_str),
        Some("decode: frame: the key of header #2 is not UTF-8")
    );
    assert_eq!(
        frames[0].payload, value,
        "the dead letter's payload is the whole original value"
    );
    assert_eq!(rec.count(), 0, "the handler never sees it");
    eventually("nothing left claimed", async || {
        env.llen(&format!("{Q}.processing")).await == 0
    })
    .await;
    stop(app).await;
}
