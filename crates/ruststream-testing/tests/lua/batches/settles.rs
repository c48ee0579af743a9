//! Settles of claimed batches: interleaved batches and equal values each settled once, a lost
//! batch list, mixed ops over interleaved batches, and runs that do not match their entries
//! refused before any write. Each on the model and on Redis, with the same result.

use bytes::Bytes;
use fred::prelude::*;
use ruststream_redis::testing::Op;

use crate::on_both;

use super::{
    ack, acks, at, batch_key, batch_len, claim, claimed_batch, clean, keys, member, record,
    settle_call,
};

/// Two claims, `a0 a1 a2` and `b0 b1`; one settle acks `b1 a0 a2 b0` (interleaved, with a gap:
/// three runs), then is sent again, then `a1` alone. Returns each call's owned count with the
/// processing list's and the set's sizes after it.
async fn runs(client: Client, prefix: String) -> Vec<(i64, i64, i64)> {
    let key = keys(&prefix);
    let levels = vec![key("")];
    let record = record(&prefix, 60_000, 0, 128);
    let a = claimed_batch(&client, &levels, vec!["a0", "a1", "a2"], &record, 3, 10).await;
    let b = claimed_batch(&client, &levels, vec!["b0", "b1"], &record, 2, 20).await;
    let mixed = [
        ("b1", at(&b, 1)),
        ("a0", at(&a, 0)),
        ("a2", at(&a, 2)),
        ("b0", at(&b, 0)),
    ];
    let mut out = Vec::new();
    for entries in [&mixed[..], &mixed[..], &[("a1", at(&a, 1))][..]] {
        let owned = acks(&client, &prefix, entries)
            .await
            .expect("the settle runs");
        let processing: i64 = client.llen(key(".processing")).await.unwrap();
        let set: i64 = client.zcard(key(".claims")).await.unwrap();
        out.push((owned, processing, set));
    }
    clean(&client, &prefix).await;
    out
}

#[tokio::test]
async fn a_settle_of_interleaved_batches_marks_each_claim_once_on_the_model_and_on_redis() {
    on_both("batchruns", vec![(4, 1, 1), (0, 1, 1), (1, 0, 0)], runs).await;
}

/// `v`, `v`, `w` claimed at once, one batch: each `v` is its own claim by its index. An ack
/// sent twice (its reply lost) settles one claim, not the other `v`'s; the batch leaves the set
/// with its last entry. Returns (the batch list's length and marks after the claim, each ack's
/// owned count with the processing list's and the set's sizes after it).
async fn equal_values(client: Client, prefix: String) -> ((i64, usize), Vec<(i64, i64, i64)>) {
    let key = keys(&prefix);
    let levels = vec![key("")];
    let _: i64 = client.lpush(&levels[0], vec!["v", "v", "w"]).await.unwrap();
    let record = record(&prefix, 60_000, 0, 128);
    let claimed = claim(&client, &levels, &record, 5, 10).await;
    assert_eq!(
        claimed.values,
        [&b"v"[..], b"v", b"w"].map(Bytes::from_static)
    );
    let batch = member(&claimed);
    let lens = batch_len(&client, &prefix, &batch).await;
    let mut acks = Vec::new();
    for (value, index) in [("v", 0), ("v", 0), ("v", 1), ("w", 2)] {
        let owned = ack(&client, &prefix, value, &batch, index).await;
        let processing: i64 = client.llen(key(".processing")).await.unwrap();
        let set: i64 = client.zcard(key(".claims")).await.unwrap();
        acks.push((owned, processing, set));
    }
    assert_eq!(
        batch_len(&client, &prefix, &batch).await,
        (0, 0),
        "a settled batch leaves no list and no marks"
    );
    clean(&client, &prefix).await;
    (lens, acks)
}

#[tokio::test]
async fn equal_values_claimed_at_once_are_settled_each_once_on_the_model_and_on_redis() {
    let expect = ((3, 0), vec![(1, 2, 1), (0, 2, 1), (1, 1, 1), (1, 0, 0)]);
    on_both("batchequal", expect, equal_values).await;
}

/// `v`, `v` claimed in one batch whose list is then lost (deleted by hand, or evicted): an ack
/// sent twice (its reply lost) still settles one claim once, by its mark, and not the other
/// `v`'s; the marks expire in 10 minutes, as nothing else would delete them; the member, kept
/// by the settles (with no list, they cannot tell the batch is done), goes at the sweep with
/// its marks. Returns (each ack's owned count with the processing list's size after it, the
/// marks' ttl in its window, the set's size and whether the marks exist after the sweep).
async fn lost_batch_list(client: Client, prefix: String) -> (Vec<(i64, i64)>, bool, i64, bool) {
    let key = keys(&prefix);
    let levels = vec![key("")];
    let live = record(&prefix, 60_000, 0, 128);
    let batch = claimed_batch(&client, &levels, vec!["v", "v"], &live, 5, 0).await;
    let name = batch_key(&prefix, &batch);
    let _: i64 = client.del(&name).await.unwrap();
    let mut acks = Vec::new();
    for index in [0, 0, 1] {
        let owned = ack(&client, &prefix, "v", &batch, index).await;
        acks.push((owned, client.llen(key(".processing")).await.unwrap()));
    }
    let ttl: i64 = client.pttl(format!("{name}:s")).await.unwrap();
    let sweep = record(&prefix, 0, 0, 128);
    let _ = claim(&client, &levels, &sweep, 0, 10).await;
    let set: i64 = client.zcard(key(".claims")).await.unwrap();
    let marks: i64 = client.exists(format!("{name}:s")).await.unwrap();
    clean(&client, &prefix).await;
    (acks, ttl > 0 && ttl <= 600_000, set, marks == 1)
}

#[tokio::test]
async fn a_lost_batch_list_still_settles_each_claim_once_on_the_model_and_on_redis() {
    let expect = (vec![(1, 1), (0, 1), (1, 0)], true, 0, false);
    on_both("batchlost", expect, lost_batch_list).await;
}

/// Two claims, `a0 a1 a2` and `b0 b1`; one settle, interleaved, acks `b1 a2 b0` and puts `a0`
/// back as `a0r` (its ops mixed: the settle reads each entry's op and arguments); it is then
/// sent again, then `a1` is acked. Returns each call's owned count with the queue's, the
/// processing list's and the set's sizes after it.
async fn mixed_runs(client: Client, prefix: String) -> Vec<(i64, i64, i64, i64)> {
    let key = keys(&prefix);
    let levels = vec![key("")];
    let record = record(&prefix, 60_000, 0, 128);
    let a = claimed_batch(&client, &levels, vec!["a0", "a1", "a2"], &record, 3, 10).await;
    let b = claimed_batch(&client, &levels, vec!["b0", "b1"], &record, 2, 20).await;
    let retry = Op::Retry {
        frame: Bytes::from_static(b"a0r"),
    };
    let mixed = [
        ("b1", at(&b, 1), Op::Ack),
        ("a0", at(&a, 0), retry),
        ("a2", at(&a, 2), Op::Ack),
        ("b0", at(&b, 0), Op::Ack),
    ];
    let last = [("a1", at(&a, 1), Op::Ack)];
    let mut out = Vec::new();
    for entries in [&mixed[..], &mixed[..], &last[..]] {
        let owned = settle_call(&client, &prefix, entries, |_| {})
            .await
            .expect("the settle runs");
        out.push((
            owned,
            client.llen(key("")).await.unwrap(),
            client.llen(key(".processing")).await.unwrap(),
            client.zcard(key(".claims")).await.unwrap(),
        ));
    }
    clean(&client, &prefix).await;
    out
}

#[tokio::test]
async fn a_settle_of_mixed_ops_over_interleaved_batches_settles_each_claim_once_on_the_model_and_on_redis()
 {
    let expect = vec![(4, 1, 1, 1), (0, 1, 1, 1), (1, 1, 0, 0)];
    on_both("batchmixed", expect, mixed_runs).await;
}

/// Changes the settle's `runs` argument (the one after `ops`, which is `ops`) by `change`.
fn tamper_runs(args: &mut [Value], ops: &[u8], change: impl Fn(&mut Vec<u8>)) {
    let at = args
        .iter()
        .position(|a| matches!(a, Value::Bytes(b) if b.as_ref() == ops))
        .expect("the ops argument");
    let Value::Bytes(runs) = &args[at + 1] else {
        panic!("runs follow ops");
    };
    let mut runs = runs.to_vec();
    change(&mut runs);
    args[at + 1] = Value::Bytes(runs.into());
}

/// `a0 a1 a2` claimed; a settle of `a0 a1` (all acks, and an ack and a retry) whose arguments
/// were changed: a run one entry longer or shorter than `ops`, a run naming a batch that is
/// not among the members, one argument past the last entry. Each is refused before its first
/// write. Returns, for each, whether it was refused with an argument error, and the queue's
/// and the processing list's sizes and the marks set after it.
async fn malformed_runs(client: Client, prefix: String) -> Vec<(bool, i64, i64, usize)> {
    let key = keys(&prefix);
    let levels = vec![key("")];
    let record = record(&prefix, 60_000, 0, 128);
    let a = claimed_batch(&client, &levels, vec!["a0", "a1", "a2"], &record, 3, 10).await;
    let retry = Op::Retry {
        frame: Bytes::from_static(b"a1r"),
    };
    let all_acks = [("a0", at(&a, 0), Op::Ack), ("a1", at(&a, 1), Op::Ack)];
    let mixed = [("a0", at(&a, 0), Op::Ack), ("a1", at(&a, 1), retry)];
    let longer = |r: &mut Vec<u8>| r[7] += 1;
    let shorter = |r: &mut Vec<u8>| r[7] -= 1;
    let no_batch = |r: &mut Vec<u8>| r[1] = 9;
    let mut out = Vec::new();
    for (entries, ops) in [(&all_acks, &b"aa"[..]), (&mixed, &b"ar"[..])] {
        for change in [&longer as &dyn Fn(&mut Vec<u8>), &shorter, &no_batch] {
            let got = settle_call(&client, &prefix, entries, |args| {
                tamper_runs(args, ops, change);
            })
            .await;
            out.push(refused_and_sizes(&client, &prefix, &a, got).await);
        }
        let got = settle_call(&client, &prefix, entries, |args| {
            args.push(Value::from("extra"));
        })
        .await;
        out.push(refused_and_sizes(&client, &prefix, &a, got).await);
    }
    clean(&client, &prefix).await;
    out
}

/// Whether `got` is an argument error (`RSARGS`), with the queue's and the processing list's
/// sizes and batch `member`'s marks.
async fn refused_and_sizes(
    client: &Client,
    prefix: &str,
    member: &Bytes,
    got: Result<i64, String>,
) -> (bool, i64, i64, usize) {
    let key = keys(prefix);
    let refused = got.is_err_and(|e| e.contains("RSARGS"));
    (
        refused,
        client.llen(key("")).await.unwrap(),
        client.llen(key(".processing")).await.unwrap(),
        batch_len(client, prefix, member).await.1,
    )
}

#[tokio::test]
async fn a_settle_whose_runs_do_not_match_its_entries_is_refused_before_any_write_on_the_model_and_on_redis()
 {
    on_both("batchmalformed", vec![(true, 0, 3, 0); 8], malformed_runs).await;
}
