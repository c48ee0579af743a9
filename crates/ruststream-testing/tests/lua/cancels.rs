//! Cancelling by id through the typed calls (`CancelList`, the claim's `Gate::cancels`,
//! `SettleList`): every answer of `cancel.lua` and its resend, the claim dropping a cancelled
//! entry, and the race of a cancel and a settle in both orders; the same for a stream read by a
//! group (`CancelStream`, `StreamRead`'s cancel record, `SettleStream`).

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::CancelOutcome;
use ruststream_redis::testing::{
    Call, CancelKeys, CancelList, CancelStream, Claim, Dest, Gate, Op, Record, SettleKeys,
    SettleList, SettleStream, StreamCancelKeys, StreamRead,
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
        steps: key(".steps:"),
    };
    (key, ck)
}

/// What the cancel record `key` holds, sorted.
async fn record_of(client: &Client, key: &str) -> Vec<(String, String)> {
    let mut record: Vec<(String, String)> = client
        .hgetall::<std::collections::HashMap<String, String>, _>(key)
        .await
        .unwrap()
        .into_iter()
        .collect();
    record.sort();
    record
}

/// Puts message `id` in the delayed set `set` and its payload hash.
async fn delay(client: &Client, set: &str, payloads: &str, id: &str) {
    let _: i64 = client
        .zadd(set, None, None, false, false, (1.0, id))
        .await
        .unwrap();
    let _: i64 = client.hset(payloads, (id, frame(id))).await.unwrap();
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
    delay(&client, &ck.delayed, &ck.payloads, "d").await;
    out.extend([cancel("d").await, cancel("d").await]);
    let _: i64 = client.lpush(key(".processing"), frame("r")).await.unwrap();
    out.extend([cancel("r").await, cancel("r").await]);
    let _: i64 = client.lpush(key(""), frame("q")).await.unwrap();
    out.extend([cancel("q").await, cancel("q").await]);
    let record = record_of(&client, &ck.record).await;
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
        once: false,
        sweep_by: None,
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

fn stream_keys(prefix: &str) -> StreamCancelKeys {
    let key = |s: &str| format!("{{{prefix}}}s{s}");
    StreamCancelKeys {
        record: key(".cancels"),
        channel: key(".cancel"),
        delayed: key(".delayed"),
        payloads: key(".delayed.payloads"),
        stream: key(""),
        steps: key(".steps:"),
    }
}

/// Creates group `g` on the stream of `sk` (from `$`) and adds one entry per id, as a
/// publisher writes them.
async fn stream_with(client: &Client, sk: &StreamCancelKeys, ids: &[&str]) {
    let _: Value = client
        .custom(
            fred::cmd!("XGROUP"),
            vec!["CREATE", sk.stream.as_str(), "g", "$", "MKSTREAM"],
        )
        .await
        .unwrap();
    for id in ids {
        xadd(client, &sk.stream, id).await;
    }
}

/// Adds an entry of message `id` to `stream`, as a publisher writes it.
async fn xadd(client: &Client, stream: &str, id: &str) {
    let _: Value = client
        .custom(
            fred::cmd!("XADD"),
            vec![stream, "*", "rs.id", id, "rs.attempt", "1", "payload", "{}"],
        )
        .await
        .unwrap();
}

/// One `read.lua` call of consumer `c` through the stream's cancel record: the ids of the
/// entries it delivered.
async fn read_ids(client: &Client, sk: &StreamCancelKeys, max: usize) -> Vec<(String, String)> {
    let got = StreamRead {
        stream: &sk.stream,
        group: "g",
        consumer: "c",
        cancels: &sk.record,
        gates: &[],
        max,
    }
    .call(client)
    .await
    .expect("the read runs");
    got.entries()
        .into_iter()
        .map(|(eid, frame)| (String::from_utf8_lossy(&eid).into_owned(), frame.id))
        .collect()
}

/// The `(entry id, rs.id)` of each entry of a list of entries (as `XRANGE` replies).
fn entry_ids(entries: Value) -> Vec<(String, String)> {
    let Value::Array(entries) = entries else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries {
        let Value::Array(parts) = e else { continue };
        let mut parts = parts.into_iter();
        let eid = parts.next().and_then(|v| v.as_string()).unwrap_or_default();
        let fields: Vec<String> = match parts.next() {
            Some(Value::Array(f)) => f.into_iter().filter_map(|v| v.as_string()).collect(),
            _ => Vec::new(),
        };
        let mid = fields
            .chunks(2)
            .find(|c| c[0] == "rs.id")
            .map(|c| c[1].clone())
            .unwrap_or_default();
        out.push((eid, mid));
    }
    out
}

/// How many entries are pending in group `g`.
async fn pending(client: &Client, sk: &StreamCancelKeys) -> i64 {
    let v: Value = client
        .custom(fred::cmd!("XPENDING"), vec![sk.stream.as_str(), "g"])
        .await
        .unwrap();
    match v {
        Value::Array(items) => items.first().and_then(Value::as_i64).unwrap_or(-1),
        _ => -1,
    }
}

async fn clean_stream(client: &Client, sk: &StreamCancelKeys) {
    let _: i64 = client
        .del(vec![
            sk.record.clone(),
            sk.delayed.clone(),
            sk.payloads.clone(),
            sk.stream.clone(),
        ])
        .await
        .unwrap_or(0);
}

/// Each answer twice (the second as a resent call): marked with an entry the group has not
/// read, missing once the group has read it (the answer to a resend comes from the record), removed from the delayed set, signalled while pending in the group, marked while not
/// read yet; then the record, the delayed set's size, what a read delivers (nothing: the marked
/// entry is acked there) and what is pending (the running one only).
async fn stream_answers(
    client: Client,
    prefix: String,
) -> (
    Vec<Option<CancelOutcome>>,
    Vec<(String, String)>,
    i64,
    usize,
    i64,
) {
    let sk = stream_keys(&prefix);
    let cancel = async |id: &str| {
        CancelStream { keys: &sk, id }
            .call(&client)
            .await
            .expect("cancel runs")
    };
    stream_with(&client, &sk, &["r"]).await;
    let mut out = vec![cancel("x").await, cancel("x").await];
    assert_eq!(
        read_ids(&client, &sk, 5).await.len(),
        1,
        "r is read: pending"
    );
    out.extend([cancel("y").await]);
    delay(&client, &sk.delayed, &sk.payloads, "d").await;
    out.extend([cancel("d").await, cancel("d").await]);
    out.extend([cancel("r").await, cancel("r").await]);
    xadd(&client, &sk.stream, "q").await;
    out.extend([cancel("q").await, cancel("q").await]);
    let record = record_of(&client, &sk.record).await;
    let delayed: i64 = client.zcard(&sk.delayed).await.unwrap();
    let delivered = read_ids(&client, &sk, 5).await.len();
    let pending = pending(&client, &sk).await;
    clean_stream(&client, &sk).await;
    (out, record, delayed, delivered, pending)
}

#[tokio::test]
async fn the_stream_cancel_answers_the_same_on_the_model_and_on_redis_and_a_resend_the_same_again()
{
    use CancelOutcome::{Marked, NotFound, Removed, Signalled};
    let record = [
        ("d", "removed"),
        ("q", "marked"),
        ("r", "signalled"),
        ("x", "marked"),
    ]
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .to_vec();
    let expect = (
        [
            Marked, Marked, NotFound, Removed, Removed, Signalled, Signalled, Marked, Marked,
        ]
        .map(Some)
        .to_vec(),
        record,
        0,
        0,
        1,
    );
    on_both("cancelstream", expect, stream_answers).await;
}

/// A stream of `a b c`, `b` marked before the group reads: the read delivers `a c`, acks `b`
/// (nothing of it pending), and a read of a batch of only cancelled entries delivers nothing.
async fn stream_sifted(client: Client, prefix: String) -> (Vec<String>, i64, Vec<String>, i64) {
    let sk = stream_keys(&prefix);
    stream_with(&client, &sk, &["a", "b", "c"]).await;
    // Marks `id`, reads; what was delivered (the message ids) and what is pending then.
    let mark_and_read = async |id: &str| {
        let marked = CancelStream { keys: &sk, id }.call(&client).await;
        assert_eq!(marked.expect("cancel"), Some(CancelOutcome::Marked));
        let read = read_ids(&client, &sk, 5).await;
        let ids: Vec<String> = read.into_iter().map(|e| e.1).collect();
        (ids, pending(&client, &sk).await)
    };
    let (first, after_first) = mark_and_read("b").await;
    xadd(&client, &sk.stream, "d").await;
    let (second, after_second) = mark_and_read("d").await;
    clean_stream(&client, &sk).await;
    (first, after_first, second, after_second)
}

#[tokio::test]
async fn the_stream_read_acks_a_cancelled_entry_on_the_model_and_on_redis() {
    let expect = (vec!["a".to_owned(), "c".to_owned()], 2, Vec::new(), 2);
    on_both("cancelstreamsift", expect, stream_sifted).await;
}

/// Two pending entries asking for a retry: `c` cancelled before its settle (only acked: nothing
/// goes back), `s` settled before its cancel (it goes back; the cancel then finds it unread:
/// marked). Returns the two answers, the ids of the stream's entries afterwards, and what is
/// pending.
async fn stream_race(
    client: Client,
    prefix: String,
) -> (
    Option<CancelOutcome>,
    Option<CancelOutcome>,
    Vec<String>,
    i64,
) {
    let sk = stream_keys(&prefix);
    stream_with(&client, &sk, &["c", "s"]).await;
    let read = read_ids(&client, &sk, 5).await;
    let first = CancelStream { keys: &sk, id: "c" }
        .call(&client)
        .await
        .expect("cancel");
    let dest = Dest::Stream {
        key: sk.stream.clone(),
        bound: String::new(),
    };
    let entries = read
        .iter()
        .map(|(eid, mid)| {
            let op = Op::Retry { frame: frame(mid) };
            (Bytes::from(eid.clone()), op)
        })
        .collect();
    let settled = SettleStream {
        dest: &dest,
        group: "g",
        dead: &sk.stream,
        delayed: &sk.delayed,
        payloads: &sk.payloads,
        cancels: &sk.record,
        entries,
    }
    .call(&client)
    .await
    .expect("settle");
    assert_eq!(settled.owned, 2);
    let after = CancelStream { keys: &sk, id: "s" }
        .call(&client)
        .await
        .expect("cancel");
    let all: Value = client
        .custom(fred::cmd!("XRANGE"), vec![sk.stream.as_str(), "-", "+"])
        .await
        .unwrap();
    let ids = entry_ids(all).into_iter().map(|e| e.1).collect();
    let pending = pending(&client, &sk).await;
    clean_stream(&client, &sk).await;
    (first, after, ids, pending)
}

#[tokio::test]
async fn a_stream_cancel_and_a_settle_race_atomically_in_both_orders_on_the_model_and_on_redis() {
    let expect = (
        Some(CancelOutcome::Signalled),
        Some(CancelOutcome::Marked),
        vec!["c".to_owned(), "s".to_owned(), "s".to_owned()],
        0,
    );
    on_both("cancelstreamrace", expect, stream_race).await;
}
