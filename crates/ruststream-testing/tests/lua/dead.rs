//! The dead-letter list's bound (`dead/trim.lua`) through every script that pushes dead
//! letters: the settles of a list and of a stream, the delayed mover's dead path and the push of
//! transports with nothing to acknowledge. Each dead letter gets one `dead-at` header; the list
//! is trimmed to its most entries exactly, and the oldest that died longer ago than its age are
//! popped, at most 16 a call, stopping at a tail without a `dead-at`.

use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use ruststream_redis::frame::{Frame, encode_parts};
use ruststream_redis::testing::Call;
use ruststream_redis::{DEAD_AT_HEADER, DeadBound};

use crate::{key, on_both};

/// A frame of message `id` with the given headers.
fn frame(id: &str, headers: &[(&str, &str)]) -> Bytes {
    let h = headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    encode_parts(id, 1, &h, b"{}")
}

fn bound(max_len: u64, max_age: Duration) -> DeadBound {
    DeadBound { max_len, max_age }
}

const DAY: Duration = Duration::from_secs(24 * 3600);

/// What a dead-letter list holds, newest first: each one's id and how many `dead-at` headers
/// it has, and whether each `dead-at` is a time after 2020 (the two backends' clocks differ).
async fn held(client: &Client, dead: &str) -> Vec<(String, usize, bool)> {
    let values: Vec<Bytes> = client.lrange(dead, 0, -1).await.expect("LRANGE");
    values
        .into_iter()
        .map(|v| {
            let times = v
                .windows(DEAD_AT_HEADER.len())
                .filter(|w| *w == DEAD_AT_HEADER.as_bytes())
                .count();
            let f = Frame::decode(v);
            let recent = f
                .headers
                .get(DEAD_AT_HEADER)
                .and_then(|t| t.parse::<u64>().ok())
                .is_some_and(|t| t > 1_577_836_800_000);
            (f.id, times, recent)
        })
        .collect()
}

/// `n` dead letters that died at ms 1000 (long ago), pushed oldest first.
async fn ancient(client: &Client, dead: &str, n: usize) {
    let frames: Vec<Bytes> = (0..n)
        .map(|i| frame(&format!("old{i}"), &[(DEAD_AT_HEADER, "1000")]))
        .collect();
    let _: i64 = client.lpush(dead, frames).await.expect("LPUSH");
}

type Pushes = (Vec<u64>, Vec<(String, usize, bool)>);

/// `dead/push.lua` through `PushDead`: the count bound trims exactly, then the age bound pops
/// 16 ancient ones a call, and a raw value at the tail stops it.
async fn push(client: Client, prefix: String) -> Pushes {
    use ruststream_redis::testing::PushDead;
    let dead = key(&prefix, "q.dead");
    let mut trimmed = Vec::new();
    ancient(&client, &dead, 20).await;
    let _: i64 = client.lpush(&dead, "raw").await.expect("LPUSH");
    let long = bound(100, 200 * 365 * DAY);
    let frames = [frame("a", &[(DEAD_AT_HEADER, "5")]), frame("b", &[])];
    let call = |b, frames| PushDead {
        dead: &dead,
        bound: b,
        frames,
    };
    // Nothing died 200 years ago, and 22 < 100.
    trimmed.push(call(long, &frames[..1]).call(&client).await.expect("push"));
    // A day's age: 16 of the 20 ancient ones, then the next call the other 4, then the raw
    // value (no dead-at) stops it.
    let day = bound(100, DAY);
    trimmed.push(call(day, &frames[1..]).call(&client).await.expect("push"));
    trimmed.push(call(day, &[]).call(&client).await.expect("push"));
    trimmed.push(call(day, &[]).call(&client).await.expect("push"));
    // The count: 3 held, bound 2.
    trimmed.push(call(bound(2, DAY), &[]).call(&client).await.expect("push"));
    let out = held(&client, &dead).await;
    let _: i64 = client.del(&dead).await.unwrap_or(0);
    (trimmed, out)
}

#[tokio::test]
async fn the_dead_letter_push_trims_by_count_and_age_the_same_on_the_model_and_on_redis() {
    let expect = (
        vec![0, 16, 4, 0, 1],
        vec![("b".to_owned(), 1, true), ("a".to_owned(), 1, true)],
    );
    on_both("deadpush", expect, push).await;
}

/// The keys of a list settle on queue `q` under `prefix` (the record is a settle-token set),
/// and its queue as the destination.
pub(crate) fn list_keys(
    prefix: &str,
) -> (
    ruststream_redis::testing::SettleKeys,
    ruststream_redis::testing::Dest,
) {
    let k = |s: &str| key(prefix, s);
    let keys = ruststream_redis::testing::SettleKeys {
        processing: k("q.processing"),
        dead: k("q.dead"),
        delayed: k("q.delayed"),
        payloads: k("q.delayed.payloads"),
        record: k("q.settles"),
        cancels: k("q.cancels"),
    };
    (keys, ruststream_redis::testing::Dest::list(vec![k("q")]))
}

/// `list/settle.lua` through `SettleList`: three dead letters onto a list bounded at two; the
/// reply counts the one trimmed, the two newest stay.
async fn list_settle(client: Client, prefix: String) -> (i64, u64, Vec<(String, usize, bool)>) {
    use ruststream_redis::testing::{Op, SettleList};
    let k = |s: &str| key(&prefix, s);
    let claimed: Vec<Bytes> = ["x1", "x2", "x3"].iter().map(|id| frame(id, &[])).collect();
    let _: i64 = client
        .lpush(k("q.processing"), claimed.clone())
        .await
        .expect("LPUSH");
    let (keys, dest) = list_keys(&prefix);
    let settled = SettleList {
        keys: &keys,
        dest: &dest,
        token: Some("t".into()),
        entries: claimed
            .iter()
            .map(|c| {
                let op = Op::Dead {
                    frame: c.clone(),
                    bound: bound(2, DAY),
                    steps: None,
                };
                (c.clone(), None, op)
            })
            .collect(),
    }
    .call(&client)
    .await
    .expect("settle.lua runs");
    let out = held(&client, &keys.dead).await;
    let _: i64 = client
        .del(vec![keys.processing, keys.dead, keys.record])
        .await
        .unwrap_or(0);
    (settled.owned, settled.trimmed, out)
}

#[tokio::test]
async fn a_list_settle_trims_its_dead_letters_the_same_on_the_model_and_on_redis() {
    let expect = (
        3,
        1,
        vec![("x3".to_owned(), 1, true), ("x2".to_owned(), 1, true)],
    );
    on_both("deadlist", expect, list_settle).await;
}

/// `list/settle.lua` with a dead-letter key holding a string: a settle of acks never writes
/// that key, so it goes through; a settle with a drop is refused whole, naming the key, and
/// leaves its claims where they were. Returns the acks' owned count, whether the refusal named
/// the key, and the processing list's length after it.
async fn list_settle_checks_what_it_writes(client: Client, prefix: String) -> (i64, bool, usize) {
    use ruststream_redis::testing::{Op, SettleList};
    let k = |s: &str| key(&prefix, s);
    let claimed: Vec<Bytes> = ["y1", "y2", "y3", "y4"]
        .iter()
        .map(|id| frame(id, &[]))
        .collect();
    let _: i64 = client
        .lpush(k("q.processing"), claimed.clone())
        .await
        .expect("LPUSH");
    let _: () = client
        .set(k("q.dead"), "a string", None, None, false)
        .await
        .expect("SET");
    let (keys, dest) = list_keys(&prefix);
    let settle = |token: &str, entries: &[Bytes], op: &Op| SettleList {
        keys: &keys,
        dest: &dest,
        token: Some(token.into()),
        entries: entries
            .iter()
            .map(|c| (c.clone(), None, op.clone()))
            .collect(),
    };
    let acked = settle("t1", &claimed[..2], &Op::Ack)
        .call(&client)
        .await
        .expect("a settle of acks runs");
    let drop = Op::Dead {
        frame: claimed[2].clone(),
        bound: bound(2, DAY),
        steps: None,
    };
    let refused = settle("t2", &claimed[2..], &drop).call(&client).await;
    let named = refused
        .as_ref()
        .err()
        .is_some_and(|e| e.to_string().contains(&keys.dead));
    let left: usize = client.llen(&keys.processing).await.expect("LLEN");
    let _: i64 = client
        .del(vec![keys.processing, keys.dead, keys.record])
        .await
        .unwrap_or(0);
    (acked.owned, named, left)
}

#[tokio::test]
async fn a_list_settle_checks_the_type_of_only_the_keys_its_ops_write() {
    on_both(
        "settlechecks",
        (2, true, 2),
        list_settle_checks_what_it_writes,
    )
    .await;
}

/// Adds entries `1-1` to `1-n` to `stream` and reads them as consumer `c` of group `g`, so
/// they are pending.
async fn pending_entries(client: &Client, stream: &str, n: u32) {
    for i in 1..=n {
        let _: String = client
            .xadd(stream, false, None, format!("1-{i}").as_str(), ("f", "v"))
            .await
            .expect("XADD");
    }
    let () = client
        .xgroup_create(stream, "g", "0", false)
        .await
        .expect("XGROUP CREATE");
    let _: Value = client
        .xreadgroup("g", "c", Some(10), None, false, stream, ">")
        .await
        .expect("XREADGROUP");
}

/// `stream/settle.lua` with a dead-letter key and a delayed set holding strings: a settle of acks
/// writes neither, so it goes through; a settle with a drop is refused whole, naming the
/// dead-letter key, and leaves its entries pending. Returns the acks' found count, whether the
/// refusal named the key, and how many entries are still pending after it.
async fn stream_settle_checks_what_it_writes(client: Client, prefix: String) -> (i64, bool, usize) {
    use ruststream_redis::testing::{Dest, Op, SettleStream};
    let stream = key(&prefix, "s");
    let dead = key(&prefix, "s.dead");
    let delayed = key(&prefix, "s.delayed");
    pending_entries(&client, &stream, 4).await;
    for k in [&dead, &delayed] {
        let _: () = client
            .set(k, "a string", None, None, false)
            .await
            .expect("SET");
    }
    let dest = Dest::Stream {
        key: stream.clone(),
        bound: String::new(),
    };
    let payloads = key(&prefix, "s.delayed.payloads");
    let cancels = key(&prefix, "s.cancels");
    let settle = |ids: &[&str], op: &Op| SettleStream {
        dest: &dest,
        group: "g",
        dead: &dead,
        delayed: &delayed,
        payloads: &payloads,
        cancels: &cancels,
        entries: ids
            .iter()
            .map(|id| (Bytes::from(id.to_string()), op.clone()))
            .collect(),
    };
    let acked = settle(&["1-1", "1-2"], &Op::Ack)
        .call(&client)
        .await
        .expect("a settle of acks runs");
    let drop = Op::Dead {
        frame: frame("m1-3", &[("reason", "dropped")]),
        bound: bound(10, DAY),
        steps: None,
    };
    let refused = settle(&["1-3", "1-4"], &drop).call(&client).await;
    let named = refused
        .as_ref()
        .err()
        .is_some_and(|e| e.to_string().contains(&dead));
    let pending: Value = client
        .xpending(&stream, "g", ("-", "+", 10))
        .await
        .expect("XPENDING");
    let left = match pending {
        Value::Array(entries) => entries.len(),
        _ => 0,
    };
    let _: i64 = client.del(vec![stream, dead, delayed]).await.unwrap_or(0);
    (acked.owned, named, left)
}

#[tokio::test]
async fn a_stream_settle_checks_the_type_of_only_the_keys_its_ops_write() {
    on_both(
        "streamchecks",
        (2, true, 2),
        stream_settle_checks_what_it_writes,
    )
    .await;
}

/// `stream/settle.lua` through `SettleStream`: two pending entries dead-lettered onto a list
/// that holds ancient ones; a day's age pops those.
async fn stream_settle(client: Client, prefix: String) -> (i64, u64, Vec<(String, usize, bool)>) {
    use ruststream_redis::testing::{Dest, Op, SettleStream};
    let stream = key(&prefix, "s");
    let dead = key(&prefix, "s.dead");
    ancient(&client, &dead, 3).await;
    pending_entries(&client, &stream, 2).await;
    let dest = Dest::Stream {
        key: stream.clone(),
        bound: String::new(),
    };
    let entries = ["1-1", "1-2"]
        .iter()
        .map(|id| {
            let op = Op::Dead {
                frame: frame(&format!("m{id}"), &[("reason", "dropped")]),
                bound: bound(10, DAY),
                steps: None,
            };
            (Bytes::from(id.to_string()), op)
        })
        .collect();
    let settled = SettleStream {
        dest: &dest,
        group: "g",
        dead: &dead,
        delayed: &key(&prefix, "s.delayed"),
        payloads: &key(&prefix, "s.delayed.payloads"),
        cancels: &key(&prefix, "s.cancels"),
        entries,
    }
    .call(&client)
    .await
    .expect("settle.lua runs");
    let out = held(&client, &dead).await;
    let _: i64 = client.del(vec![stream, dead]).await.unwrap_or(0);
    (settled.owned, settled.trimmed, out)
}

#[tokio::test]
async fn a_stream_settle_trims_its_dead_letters_the_same_on_the_model_and_on_redis() {
    let expect = (
        2,
        3,
        vec![("m1-2".to_owned(), 1, true), ("m1-1".to_owned(), 1, true)],
    );
    on_both("deadstream", expect, stream_settle).await;
}

/// `delayed/move_due.lua` through `MoveDue`: a due entry a stream cannot take (more headers
/// than one XADD can) goes to the dead letters, which are then trimmed to one.
async fn move_due(client: Client, prefix: String) -> (i64, u64, Vec<(String, usize, bool)>) {
    use ruststream_redis::testing::{Dest, Later, MoveDue, ScheduleLater};
    let k = |s: &str| key(&prefix, s);
    let dead = k("s.dead");
    ancient(&client, &dead, 2).await;
    let headers: Vec<(String, String)> = (0..4000).map(|i| (format!("h{i}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = headers
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let later = [Later {
        due: ruststream_core::Due::In(Duration::ZERO),
        id: "big".into(),
        frame: frame("big", &many),
        unique: None,
    }];
    let (set, payloads) = (k("s.delayed"), k("s.delayed.payloads"));
    ScheduleLater {
        set: &set,
        payloads: &payloads,
        token: "t",
        entries: &later,
    }
    .call(&client)
    .await
    .expect("schedule.lua runs");
    let dest = Dest::Stream {
        key: k("s"),
        bound: String::new(),
    };
    let moved = MoveDue {
        set: &set,
        payloads: &payloads,
        dead: Some(&dead),
        bound: bound(1, 365 * DAY),
        publishing: &k("s.flows.publishing"),
        grace: std::time::Duration::from_secs(30),
        dest: &dest,
        most: 10,
    }
    .call(&client)
    .await
    .expect("move_due.lua runs");
    let out = held(&client, &dead).await;
    let _: i64 = client.del(vec![dead, set, payloads]).await.unwrap_or(0);
    (moved.dead, moved.trimmed, out)
}

#[tokio::test]
async fn the_movers_dead_path_trims_its_dead_letters_the_same_on_the_model_and_on_redis() {
    let expect = (1, 2, vec![("big".to_owned(), 1, true)]);
    on_both("deadmove", expect, move_due).await;
}
