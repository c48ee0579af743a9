//! A reliable list's recovery records, one a claimed batch (`list/claim.lua`, `list/settle.lua`,
//! `list/lease.lua`): equal values in one batch and a settle sent twice, the sweep of a batch in
//! parts and of a member of the per-entry form, orphans beyond one sweep, the batch lists' ttl,
//! keys of another type. Each on the model and on Redis, with the same result. The settles'
//! tests (equal values, interleaved and mixed runs, a lost batch list) are `settles.rs`.

mod settles;

use bytes::Bytes;
use fred::prelude::*;
use ruststream_redis::testing::{
    Call, Claim, Claimed, Dest, InBatch, Lease, Op, Record, SettleKeys, SettleList,
};

use crate::{key, on_both};

/// The keys of queue `q` under `prefix`.
fn keys(prefix: &str) -> impl Fn(&str) -> String {
    let prefix = prefix.to_owned();
    move |s: &str| key(&prefix, &format!("q{s}"))
}

/// A recovery record for `q` under `prefix`: reader `r`, sweeping claims older than `min_idle_ms`,
/// at most `most` a run, with a recovery-set ttl of `ttl_ms`.
fn record(prefix: &str, min_idle_ms: u64, ttl_ms: u64, most: u32) -> Record {
    let key = keys(prefix);
    Record::Claims {
        processing: key(".processing"),
        zset: key(".claims"),
        reader: "r".to_owned(),
        min_idle_ms,
        ttl_ms,
        most,
    }
}

/// One claim of up to `max` entries of `q`, its claims numbered from `first_seq`.
async fn claim(
    client: &Client,
    levels: &[String],
    record: &Record,
    max: usize,
    first_seq: u64,
) -> Claimed {
    claim_by(client, levels, record, max, first_seq, None)
        .await
        .expect("the claim runs")
}

/// [`claim`] with the sweep's deadline `sweep_by` (server ms), and its error kept.
async fn claim_by(
    client: &Client,
    levels: &[String],
    record: &Record,
    max: usize,
    first_seq: u64,
    sweep_by: Option<u64>,
) -> ruststream_core::Result<Claimed> {
    Claim {
        levels,
        record,
        gates: &[],
        max,
        first_seq,
        once: false,
        sweep_by,
    }
    .call(client)
    .await
}

/// The member of `claimed`'s batch, by reader `r`.
fn member(claimed: &Claimed) -> Bytes {
    let mut m = format!("r:{}.", claimed.first_seq).into_bytes();
    m.extend_from_slice(&claimed.run);
    Bytes::from(m)
}

/// Pushes `values` onto the queue `levels[0]`, claims `max` entries with `record`, and returns
/// the claim's batch member.
async fn claimed_batch(
    client: &Client,
    levels: &[String],
    values: Vec<&str>,
    record: &Record,
    max: usize,
    first_seq: u64,
) -> Bytes {
    let _: i64 = client.lpush(&levels[0], values).await.unwrap();
    member(&claim(client, levels, record, max, first_seq).await)
}

/// Entry `index` of batch `member`.
fn at(member: &Bytes, index: usize) -> InBatch {
    InBatch {
        member: member.clone(),
        index,
    }
}

/// Acks `value`, entry `index` of batch `member`; how many claims were still owned.
async fn ack(client: &Client, prefix: &str, value: &str, member: &Bytes, index: usize) -> i64 {
    acks(client, prefix, &[(value, at(member, index))])
        .await
        .expect("the settle runs")
}

/// Acks each `(value, place)` in one settle call, its error kept.
async fn acks(client: &Client, prefix: &str, entries: &[(&str, InBatch)]) -> Result<i64, String> {
    let entries: Vec<_> = entries
        .iter()
        .map(|(value, place)| (*value, place.clone(), Op::Ack))
        .collect();
    settle_call(client, prefix, &entries, |_| {}).await
}

/// Settles each `(value, place, op)` in one settle call, its arguments first changed by
/// `tamper`; how many claims were still owned, its error kept.
async fn settle_call(
    client: &Client,
    prefix: &str,
    entries: &[(&str, InBatch, Op)],
    tamper: impl FnOnce(&mut Vec<Value>),
) -> Result<i64, String> {
    let key = keys(prefix);
    let settle_keys = SettleKeys {
        processing: key(".processing"),
        dead: key(".dead"),
        delayed: key(".delayed"),
        payloads: key(".delayed.payloads"),
        record: key(".claims"),
        cancels: key(".cancels"),
    };
    let call = SettleList {
        keys: &settle_keys,
        dest: &Dest::list(vec![key("")]),
        token: None,
        entries: entries
            .iter()
            .map(|(value, place, op)| {
                (
                    Bytes::copy_from_slice(value.as_bytes()),
                    Some(place.clone()),
                    op.clone(),
                )
            })
            .collect(),
    };
    let (keys, mut args) = call.build();
    tamper(&mut args);
    let reply: Value = call
        .script()
        .evalsha_with_reload(client, keys, args)
        .await
        .map_err(|e| e.to_string())?;
    Ok(call.parse(reply).owned)
}

/// The name of batch `member`'s list (`<set>:<member>`; its marks are `<name>:s`).
fn batch_key(prefix: &str, member: &Bytes) -> String {
    format!(
        "{}:{}",
        keys(prefix)(".claims"),
        String::from_utf8_lossy(member)
    )
}

/// The length of batch `member`'s list and how many of its entries are marked settled.
async fn batch_len(client: &Client, prefix: &str, member: &Bytes) -> (i64, usize) {
    let name = batch_key(prefix, member);
    let marks: Option<Bytes> = client.get(format!("{name}:s")).await.unwrap();
    (
        client.llen(&name).await.unwrap(),
        marks.map_or(0, |m| m.iter().filter(|&&b| b == b'1').count()),
    )
}

/// Deletes `q`'s keys and the batch lists and marks its set names.
pub(crate) async fn clean(client: &Client, prefix: &str) {
    let key = keys(prefix);
    let members: Vec<String> = client
        .zrange(key(".claims"), 0, -1, None, false, None, false)
        .await
        .unwrap_or_default();
    let mut all: Vec<String> = members
        .iter()
        .flat_map(|m| {
            let batch = format!("{}:{m}", key(".claims"));
            [format!("{batch}:s"), batch]
        })
        .collect();
    all.extend([key(""), key(".processing"), key(".claims")]);
    let _: i64 = client.del(all).await.unwrap_or(0);
}

/// Five entries claimed in one batch, `b` of them acked, and a per-entry member
/// (`<reader>:<seq>.<run>:<value>`), all stale (min_idle 0), swept three a run: that member's
/// value and `a`, `c` (`b` is marked settled), then `d`, `e` and the batch with its marks.
/// Returns per sweeping run (recovered, set size, the batch's length and marks, queue length,
/// processing length).
async fn sweep_in_parts(client: Client, prefix: String) -> Vec<(u64, i64, (i64, usize), i64, i64)> {
    let key = keys(&prefix);
    let levels = vec![key("")];
    let _: i64 = client
        .lpush(&levels[0], vec!["a", "b", "c", "d", "e"])
        .await
        .unwrap();
    let record = record(&prefix, 0, 0, 3);
    let claimed = claim(&client, &levels, &record, 5, 0).await;
    assert_eq!(
        claimed.values,
        [&b"a"[..], b"b", b"c", b"d", b"e"].map(Bytes::from_static)
    );
    let batch = member(&claimed);
    assert_eq!(ack(&client, &prefix, "b", &batch, 1).await, 1);
    let _: i64 = client.lpush(key(".processing"), "z").await.unwrap();
    let _: i64 = client
        .zadd(
            key(".claims"),
            None,
            None,
            false,
            false,
            (1.0, "old:1.1.0:z"),
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..3 {
        let swept = claim(&client, &levels, &record, 0, 100).await;
        out.push((
            swept.recovered,
            client.zcard(key(".claims")).await.unwrap(),
            batch_len(&client, &prefix, &batch).await,
            client.llen(key("")).await.unwrap(),
            client.llen(key(".processing")).await.unwrap(),
        ));
    }
    // Each went back as a frame with its attempt raised, the payload last.
    let back: Vec<Bytes> = client.lrange(key(""), 0, -1).await.unwrap();
    let mut payloads: Vec<u8> = back.iter().filter_map(|v| v.last().copied()).collect();
    payloads.sort_unstable();
    assert_eq!(payloads, b"acdez", "all but the acked b");
    clean(&client, &prefix).await;
    out
}

#[tokio::test]
async fn a_sweep_takes_a_long_batch_in_parts_and_members_of_the_earlier_form_on_the_model_and_on_redis()
 {
    let expect = vec![
        (3, 1, (5, 3), 3, 2),
        (2, 0, (0, 0), 5, 0),
        (0, 0, (0, 0), 5, 0),
    ];
    on_both("batchsweep", expect, sweep_in_parts).await;
}

/// Five entries in a processing list whose recovery set is gone, and one waiting: a claim that
/// puts back as many orphans as one run may (3) takes nothing, as more may be left; the next puts
/// back the last two and takes. Returns per claim (recovered, taken).
async fn orphans(client: Client, prefix: String) -> Vec<(u64, usize)> {
    let key = keys(&prefix);
    let levels = vec![key("")];
    let _: i64 = client.lpush(&levels[0], "n").await.unwrap();
    let _: i64 = client
        .lpush(key(".processing"), vec!["o1", "o2", "o3", "o4", "o5"])
        .await
        .unwrap();
    let record = record(&prefix, 60_000, 0, 3);
    let mut out = Vec::new();
    for seq in [0, 10] {
        let got = claim(&client, &levels, &record, 10, seq).await;
        out.push((got.recovered, got.values.len()));
    }
    let left: i64 = client.llen(key(".processing")).await.unwrap();
    assert_eq!(left, 6, "every entry is claimed again");
    clean(&client, &prefix).await;
    out
}

#[tokio::test]
async fn orphans_beyond_one_sweep_all_come_back_on_the_model_and_on_redis() {
    on_both("batchorphans", vec![(3, 0), (2, 6)], orphans).await;
}

/// With a recovery ttl of 10 s, a claimed batch's list expires in twice that, its marks (written
/// by a settle) with it, the set in the ttl; a lease renews them, and every batch list and marks
/// of the set, not only its own. Returns whether each ttl is in its window: the list's after the
/// claim, the marks' after the settle, the list's and the marks' after the lease, the set's.
async fn batch_ttl(client: Client, prefix: String) -> (bool, bool, bool, bool, bool) {
    let key = keys(&prefix);
    let levels = vec![key("")];
    let record = record(&prefix, 5_000, 10_000, 128);
    let batch = claimed_batch(&client, &levels, vec!["a", "b"], &record, 5, 0).await;
    let name = batch_key(&prefix, &batch);
    let marks = format!("{name}:s");
    let in_window = |ms: i64, lo: i64, hi: i64| ms > lo && ms <= hi;
    let claimed_ttl: i64 = client.pttl(&name).await.unwrap();
    assert_eq!(ack(&client, &prefix, "a", &batch, 0).await, 1);
    let marked_ttl: i64 = client.pttl(&marks).await.unwrap();
    let _: i64 = client.pexpire(&name, 1_000, None).await.unwrap();
    let _: i64 = client.pexpire(&marks, 1_000, None).await.unwrap();
    // Another worker's lease, holding none of this batch's claims: the batch waits in the set
    // for a sweep (its worker may be dead), and the set the lease keeps alive must not outlive
    // its list.
    let other = Bytes::from_static(b"other:1.1.1");
    let moved = Lease {
        zset: &key(".claims"),
        ttl_ms: 10_000,
        members: std::slice::from_ref(&other),
    }
    .call(&client)
    .await
    .expect("the lease runs");
    assert_eq!(moved, 0, "a member not in the set is not added");
    let leased_ttl: i64 = client.pttl(&name).await.unwrap();
    let leased_marks_ttl: i64 = client.pttl(&marks).await.unwrap();
    let set_ttl: i64 = client.pttl(key(".claims")).await.unwrap();
    clean(&client, &prefix).await;
    (
        in_window(claimed_ttl, 10_000, 20_000),
        in_window(marked_ttl, 10_000, 20_000),
        in_window(leased_ttl, 10_000, 20_000),
        in_window(leased_marks_ttl, 10_000, 20_000),
        in_window(set_ttl, 5_000, 10_000),
    )
}

#[tokio::test]
async fn a_batch_list_and_its_marks_outlive_the_set_and_any_workers_lease_renews_them_on_the_model_and_on_redis()
 {
    on_both("batchttl", (true, true, true, true, true), batch_ttl).await;
}

/// Two orphans in a processing list whose recovery set is gone, and one entry waiting: a claim
/// that reaches Redis past its sweep's deadline sweeps nothing and so takes nothing (its record
/// would make the set again and hide the orphans from every later sweep); the next claim, in
/// time, puts them back and takes. Returns per claim (recovered, taken), and whether the set
/// existed after the late one.
async fn late_orphans(client: Client, prefix: String) -> (Vec<(u64, usize)>, bool) {
    let key = keys(&prefix);
    let levels = vec![key("")];
    let _: i64 = client.lpush(&levels[0], "n").await.unwrap();
    let _: i64 = client
        .lpush(key(".processing"), vec!["o1", "o2"])
        .await
        .unwrap();
    let record = record(&prefix, 60_000, 0, 128);
    let mut out = Vec::new();
    let late = claim_by(&client, &levels, &record, 10, 0, Some(0))
        .await
        .expect("the late claim runs");
    out.push((late.recovered, late.values.len()));
    let set: i64 = client.exists(key(".claims")).await.unwrap();
    let again = claim(&client, &levels, &record, 10, 10).await;
    out.push((again.recovered, again.values.len()));
    clean(&client, &prefix).await;
    (out, set == 1)
}

#[tokio::test]
async fn a_late_claim_takes_nothing_while_orphans_wait_on_the_model_and_on_redis() {
    on_both("batchlate", (vec![(0, 0), (2, 3)], false), late_orphans).await;
}

/// Two claimed batches, `a b` and `c`, the second's list replaced by a string: the sweep of
/// both (stale) and a settle of `a` and `c` each fail before their first write, though the first
/// batch alone would go through. Returns (the sweep failed, the settle failed, queue,
/// processing and set sizes after both).
async fn foreign_batch_key(client: Client, prefix: String) -> (bool, bool, i64, i64, i64) {
    let key = keys(&prefix);
    let levels = vec![key("")];
    let _: i64 = client.lpush(&levels[0], vec!["a", "b", "c"]).await.unwrap();
    let record = record(&prefix, 0, 0, 128);
    let first = claim(&client, &levels, &record, 2, 0).await;
    let second = claim_by(&client, &levels, &record, 1, 10, Some(0))
        .await
        .expect("the second claim runs, sweeping nothing");
    let (m1, m2) = (member(&first), member(&second));
    let name = batch_key(&prefix, &m2);
    let _: i64 = client.del(&name).await.unwrap();
    let _: () = client.set(&name, "x", None, None, false).await.unwrap();
    let swept = claim_by(&client, &levels, &record, 1, 20, None).await;
    let settled = acks(&client, &prefix, &[("a", at(&m1, 0)), ("c", at(&m2, 0))]).await;
    let swept_error = swept.as_ref().err().map(ToString::to_string);
    for text in [swept_error.as_ref(), settled.as_ref().err()]
        .into_iter()
        .flatten()
    {
        assert!(
            text.contains("WRONGTYPE") && text.contains(&name),
            "the error names the key: {text}"
        );
    }
    let sizes = (
        client.llen(key("")).await.unwrap(),
        client.llen(key(".processing")).await.unwrap(),
        client.zcard(key(".claims")).await.unwrap(),
    );
    let _: i64 = client.del(&name).await.unwrap();
    clean(&client, &prefix).await;
    (swept.is_err(), settled.is_err(), sizes.0, sizes.1, sizes.2)
}

#[tokio::test]
async fn a_foreign_key_in_a_batch_lists_place_fails_the_sweep_and_the_settle_whole_on_the_model_and_on_redis()
 {
    on_both("batchforeign", (true, true, 0, 3, 2), foreign_batch_key).await;
}
