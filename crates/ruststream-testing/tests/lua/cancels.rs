//! Cancelling by id through the typed calls (`CancelList`, the claim's `Gate::cancels`,
//! `SettleList`): every answer of `cancel.lua` and its resend, the claim dropping a cancelled
//! entry, and the race of a cancel and a settle in both orders.

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::CancelOutcome;
use ruststream_redis::{
    Call, CancelKeys, CancelList, Claim, Dest, Gate, Op, Record, SettleKeys, SettleList,
};

use crate::on_both;

fn frame(id: &str) -> Bytes {
    ruststream_redis::frame::encode_parts(id, 1, &ruststream_core::Headers::new(), b"{}")
}

fn keys(prefix: &str) -> (impl Fn(&str) -> String + '_, CancelKeys) {
    let key = move |s: &str| format!("{{{prefix}}}q{s}");
    let ck = CancelKeys {
        record: key(".cancels"),
        channel: key(".cancel"),
        delayed: key(".delayed"),
        payloads: key(".delayed.payloads"),
        levels: vec![key("")],
        processing: Some(key(".processing")),
    };
    (key, ck)
}

/// Each answer twice (the second as a resent call): missing on an empty queue, removed from the
/// delayed set, signalled in the processing list, marked with entries queued; then what the
/// keys hold: the record, the delayed set's size.
async fn answers(
    client: Client,
    prefix: String,
) -> (Vec<Option<CancelOutcome>>, Vec<(String, String)>, i64) {
    let (key, ck) = keys(&prefix);
    let cancel = async |id: &str| {
        CancelList { keys: &ck, id }
            .call(&client)
            .await
            .expect("cancel runs")
    };
    let mut out = vec![cancel("x").await, cancel("x").await];
    let _: i64 = client
        .zadd(&ck.delayed, None, None, false, false, (1.0, "d"))
        .await
        .unwrap();
    let _: i64 = client.hset(&ck.payloads, ("d", frame("d"))).await.unwrap();
    out.extend([cancel("d").await, cancel("d").await]);
    let _: i64 = client.lpush(key(".processing"), frame("r")).await.unwrap();
    out.extend([cancel("r").await, cancel("r").await]);
    let _: i64 = client.lpush(key(""), frame("q")).await.unwrap();
    out.extend([cancel("q").await, cancel("q").await]);
    let mut record: Vec<(String, String)> = client
        .hgetall::<std::collections::HashMap<String, String>, _>(&ck.record)
        .await
        .unwrap()
        .into_iter()
        .collect();
    record.sort();
    let delayed: i64 = client.zcard(&ck.delayed).await.unwrap();
    let _: i64 = client
        .del(vec![
            ck.record.clone(),
            ck.delayed.clone(),
            ck.payloads.clone(),
            key(""),
            key(".processing"),
        ])
        .await
        .unwrap_or(0);
    (out, record, delayed)
}

#[tokio::test]
async fn the_cancel_answers_the_same_on_the_model_and_on_redis_and_a_resend_the_same_again() {
    use CancelOutcome::{Marked, NotFound, Removed, Signalled};
    let record = [("d", "removed"), ("q", "marked"), ("r", "signalled")]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .to_vec();
    let expect = (
        [
            NotFound, NotFound, Removed, Removed, Signalled, Signalled, Marked, Marked,
        ]
        .map(Some)
        .to_vec(),
        record,
        0,
    );
    on_both("cancel", expect, answers).await;
}

/// A queue of `a b c` with `b` marked: the claim through the cancel gate takes `a c`, and `b`
/// is gone (nothing queued, two claimed).
async fn sifted(client: Client, prefix: String) -> (Vec<Vec<u8>>, i64, i64) {
    let (key, ck) = keys(&prefix);
    let _: i64 = client
        .lpush(key(""), vec![frame("a"), frame("b"), frame("c")])
        .await
        .unwrap();
    let marked = CancelList { keys: &ck, id: "b" }
        .call(&client)
        .await
        .expect("cancel");
    assert_eq!(marked, Some(CancelOutcome::Marked));
    let levels = vec![key("")];
    let record = Record::List {
        processing: key(".processing"),
    };
    let gates = [Gate::cancels(ck.record.clone())];
    let got = Claim {
        levels: &levels,
        record: &record,
        gates: &gates,
        max: 5,
        first_seq: 0,
    }
    .call(&client)
    .await
    .expect("claim");
    let ids = got
        .values
        .iter()
        .map(|v| {
            ruststream_redis::frame::Frame::decode(v.clone())
                .id
                .into_bytes()
        })
        .collect();
    let queued: i64 = client.llen(key("")).await.unwrap();
    let claimed: i64 = client.llen(key(".processing")).await.unwrap();
    let _: i64 = client
        .del(vec![ck.record.clone(), key(""), key(".processing")])
        .await
        .unwrap_or(0);
    (ids, queued, claimed)
}

#[tokio::test]
async fn the_claim_drops_a_cancelled_entry_on_the_model_and_on_redis() {
    on_both(
        "cancelsift",
        (vec![b"a".to_vec(), b"c".to_vec()], 0, 2),
        sifted,
    )
    .await;
}

/// Two claimed entries asking for a retry: `c` cancelled before its settle (the settle only
/// removes it: nothing goes back), `s` settled before its cancel (it goes back; the cancel then
/// finds it queued: marked). Returns the cancel's answer and the queue's ids afterwards.
async fn race(
    client: Client,
    prefix: String,
) -> (
    Option<CancelOutcome>,
    Option<CancelOutcome>,
    Vec<String>,
    i64,
) {
    let (key, ck) = keys(&prefix);
    let _: i64 = client
        .lpush(key(".processing"), vec![frame("c"), frame("s")])
        .await
        .unwrap();
    let first = CancelList { keys: &ck, id: "c" }
        .call(&client)
        .await
        .expect("cancel");
    let settle_keys = SettleKeys {
        processing: key(".processing"),
        dead: key(".dead"),
        delayed: key(".delayed"),
        payloads: key(".delayed.payloads"),
        record: key(".settles"),
        cancels: ck.record.clone(),
    };
    let dest = Dest::list(vec![key("")]);
    let retry = |id: &str| (frame(id), None, Op::Retry { frame: frame(id) });
    let owned = SettleList {
        keys: &settle_keys,
        dest: &dest,
        token: Some("t".into()),
        entries: vec![retry("c"), retry("s")],
    }
    .call(&client)
    .await
    .expect("settle");
    assert_eq!(owned.owned, 2);
    let after = CancelList { keys: &ck, id: "s" }
        .call(&client)
        .await
        .expect("cancel");
    let queued: Vec<Bytes> = client.lrange(key(""), 0, -1).await.unwrap();
    let ids = queued
        .into_iter()
        .map(|v| ruststream_redis::frame::Frame::decode(v).id)
        .collect();
    let claimed: i64 = client.llen(key(".processing")).await.unwrap();
    let _: i64 = client
        .del(vec![
            ck.record.clone(),
            key(""),
            key(".processing"),
            key(".settles"),
        ])
        .await
        .unwrap_or(0);
    (first, after, ids, claimed)
}

#[tokio::test]
async fn a_cancel_and_a_settle_race_atomically_in_both_orders_on_the_model_and_on_redis() {
    let expect = (
        Some(CancelOutcome::Signalled),
        Some(CancelOutcome::Marked),
        vec!["s".to_owned()],
        0,
    );
    on_both("cancelrace", expect, race).await;
}
