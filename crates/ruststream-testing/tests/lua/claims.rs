//! The claim scripts through their typed calls (`Claim`, `StreamRead`) with their gates: the
//! pause and the concurrency cap.

use fred::prelude::*;
use ruststream_testing::MemoryRedis;

use crate::{fastrand_suffix, key, on_both, redis};

/// A claim of up to 5 entries from `levels` through `gates`.
fn claim_of<'a>(
    levels: &'a [String],
    record: &'a ruststream_redis::testing::Record,
    gates: &'a [ruststream_redis::testing::Gate],
) -> ruststream_redis::testing::Claim<'a> {
    ruststream_redis::testing::Claim {
        levels,
        record,
        gates,
        max: 5,
        first_seq: 0,
        once: false,
        sweep_by: None,
    }
}

/// The claim pipeline's script through its typed call (`ruststream_redis::testing::Claim`, the same the
/// readers use): the pause gate lets nothing through, then the levels are taken highest first
/// into the processing list. Returns what each call gave: (closed gate, values).
async fn typed_claim(client: Client, prefix: String) -> Vec<(Option<String>, Vec<Vec<u8>>)> {
    use ruststream_redis::testing::{Call, Gate, Record};
    let key = |s: &str| key(&prefix, &format!("q{s}"));
    let levels = vec![key(""), key(".p1")];
    let paused = key(".paused");
    let _: i64 = client.rpush(&levels[0], vec!["a", "b"]).await.unwrap();
    let _: i64 = client.rpush(&levels[1], "c").await.unwrap();
    let () = client.set(&paused, "op", None, None, false).await.unwrap();
    let record = Record::List {
        processing: key(".processing"),
    };
    let gates = [Gate::paused(paused.clone())];
    let claim = claim_of(&levels, &record, &gates);
    let mut out = Vec::new();
    for unpause in [true, false] {
        let got = claim.call(&client).await.expect("the claim runs");
        out.push((got.closed, got.values.iter().map(|v| v.to_vec()).collect()));
        if unpause {
            let _: i64 = client.del(&paused).await.unwrap();
        }
    }
    let mut keys = claim.build().0;
    keys.push(key(".processing"));
    let _: i64 = client.del(keys).await.unwrap_or(0);
    out
}

#[tokio::test]
async fn the_typed_claim_call_gives_the_same_claims_on_the_model_and_on_redis() {
    let expect = vec![
        (Some("paused".to_owned()), Vec::new()),
        (None, vec![b"c".to_vec(), b"b".to_vec(), b"a".to_vec()]),
    ];
    on_both("claim", expect, typed_claim).await;
}

/// A claim's sweep runs only by its deadline in the server's clock (`sweep_by`): `a` claimed
/// (min_idle 0: stale at once), a claim whose deadline passed sweeps nothing, one within it
/// sweeps `a` back (its attempt raised) and claims it again. Returns each sweeping claim's
/// (recovered, claimed).
async fn sweep_deadline(client: Client, prefix: String) -> Vec<(u64, usize)> {
    use ruststream_redis::testing::{Call, Record};
    let key = |s: &str| key(&prefix, &format!("q{s}"));
    let levels = vec![key("")];
    let _: i64 = client.rpush(&levels[0], "a").await.unwrap();
    let record = Record::Claims {
        processing: key(".processing"),
        zset: key(".claims"),
        reader: "r".to_owned(),
        min_idle_ms: 0,
        ttl_ms: 0,
        most: 128,
    };
    let first = claim_of(&levels, &record, &[]).call(&client).await.unwrap();
    assert_eq!(first.values.len(), 1, "a claimed");
    let time: Vec<String> = client
        .custom(fred::cmd!("TIME"), Vec::<Value>::new())
        .await
        .unwrap();
    let now_ms: u64 = time[0].parse::<u64>().unwrap() * 1000;
    let mut out = Vec::new();
    for by in [now_ms - 60_000, now_ms + 60_000] {
        let mut claim = claim_of(&levels, &record, &[]);
        claim.sweep_by = Some(by);
        let got = claim.call(&client).await.expect("the claim runs");
        out.push((got.recovered, got.values.len()));
    }
    crate::batches::clean(&client, &prefix).await;
    out
}

#[tokio::test]
async fn a_claim_sweeps_only_by_its_deadline_on_the_model_and_on_redis() {
    let expect = vec![(0, 0), (1, 1)];
    on_both("sweepby", expect, sweep_deadline).await;
}

/// The claim and the stream read send their scripts by hash and read their replies as RESP
/// frames (`custom_raw`): on a server that lost its scripts (`SCRIPT FLUSH`, a restart) each
/// gets `NOSCRIPT`, loads its script, sends it again and takes what it would have taken; a
/// script's error reply is still an error of its kind.
#[tokio::test]
async fn a_claim_and_a_stream_read_load_their_scripts_again_after_a_flush() {
    use ruststream_redis::testing::{Call, Record, StreamRead};
    let _alone = crate::SCRIPT_CACHE.write().await;
    let Some(client) = crate::connect().await else {
        return;
    };
    let prefix = format!("flush{}", fastrand_suffix());
    let levels = vec![key(&prefix, "q")];
    let _: i64 = client.rpush(&levels[0], vec!["a", "b"]).await.unwrap();
    let () = client.script_flush(false).await.unwrap();
    let got = claim_of(&levels, &Record::Pop, &[])
        .call(&client)
        .await
        .expect("the claim runs after NOSCRIPT");
    assert_eq!(got.values, vec!["b", "a"]);
    let stream = key(&prefix, "s");
    let _: Value = client
        .custom(
            fred::cmd!("XGROUP"),
            vec!["CREATE", stream.as_str(), "g", "0", "MKSTREAM"],
        )
        .await
        .unwrap();
    let _: Value = client
        .custom(
            fred::cmd!("XADD"),
            vec![stream.as_str(), "*", "payload", "x", "rs.id", "m1"],
        )
        .await
        .unwrap();
    let () = client.script_flush(false).await.unwrap();
    let cancels = key(&prefix, "s.cancels");
    let read = StreamRead {
        stream: &stream,
        group: "g",
        consumer: "c",
        cancels: &cancels,
        gates: &[],
        max: 5,
    };
    let got = read
        .call(&client)
        .await
        .expect("the read runs after NOSCRIPT");
    let entries = got.entries();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (entries[0].1.id.as_str(), &entries[0].1.payload[..]),
        ("m1", &b"x"[..])
    );
    // The list as the stream's key: the read's type check answers an error, which stays one.
    let wrong = StreamRead {
        stream: &levels[0],
        ..read
    };
    let _: i64 = client.rpush(&levels[0], "z").await.unwrap();
    let e = wrong
        .call(&client)
        .await
        .expect_err("a list is not a stream");
    assert_eq!(e.kind(), ruststream_core::ErrorKind::WrongType, "{e}");
    let _: i64 = client
        .del(vec![levels[0].clone(), stream])
        .await
        .unwrap_or(0);
}

/// What the concurrency cap's gate let two claims of each kind take: (closed gate, how many
/// taken, how many held back).
type CapRun = Vec<(Option<String>, usize, u64)>;

/// The concurrency cap (`Gate::cap_list`, `Gate::cap_group`) through the typed calls: a list
/// capped at 3 with 2 entries in its processing list takes 1 of 5 and then none (the cap
/// closed, the 4 left held back); a group capped at 2 reads 2 of 5 and then none (3 held back).
async fn typed_cap(client: &Client, prefix: &str) -> CapRun {
    use ruststream_redis::testing::{Call, Gate, Record, StreamRead};
    let key = |s: &str| format!("{{{prefix}}}q{s}");
    let levels = vec![key("")];
    let processing = key(".processing");
    let _: i64 = client
        .rpush(&levels[0], vec!["a", "b", "c", "d", "e"])
        .await
        .unwrap();
    let _: i64 = client.rpush(&processing, vec!["x", "y"]).await.unwrap();
    let record = Record::List {
        processing: processing.clone(),
    };
    let gates = [Gate::cap_list(processing.clone(), 3)];
    let claim = claim_of(&levels, &record, &gates);
    let mut out = Vec::new();
    for _ in 0..2 {
        let got = claim.call(client).await.expect("the claim runs");
        out.push((got.closed, got.values.len(), got.held.entries));
    }
    let stream = key(".stream");
    let _: Value = client
        .custom(
            fred::cmd!("XGROUP"),
            vec!["CREATE", stream.as_str(), "g", "0", "MKSTREAM"],
        )
        .await
        .unwrap();
    for i in 0..5 {
        let _: Value = client
            .custom(
                fred::cmd!("XADD"),
                vec![stream.as_str(), "*", "n", &i.to_string()],
            )
            .await
            .unwrap();
    }
    let gates = [Gate::cap_group(stream.clone(), "g", 2)];
    let read = StreamRead {
        stream: &stream,
        group: "g",
        consumer: "c",
        cancels: &format!("{stream}.cancels"),
        gates: &gates,
        max: 5,
    };
    for _ in 0..2 {
        let got = read.call(client).await.expect("the read runs");
        let (closed, held) = (got.closed.clone(), got.held.entries);
        let n = got.entries().len();
        out.push((closed, n, held));
    }
    let _: i64 = client
        .del(vec![levels[0].clone(), processing, stream])
        .await
        .unwrap_or(0);
    out
}

#[tokio::test]
async fn the_cap_gate_takes_the_same_on_the_model_and_on_redis() {
    let model = MemoryRedis::new();
    let client = model.client().expect("a model client");
    client.init().await.expect("init");
    let cap = Some("cap".to_owned());
    // A claim the cap cut short counts what stayed queued, up to what it wanted more.
    let expect = vec![(None, 1, 4), (cap.clone(), 0, 4), (None, 2, 3), (cap, 0, 3)];
    assert_eq!(typed_cap(&client, "cap-model").await, expect);
    let Some(redis) = redis().await else {
        return;
    };
    let prefix = format!("rscap-{}-{}", std::process::id(), fastrand_suffix());
    assert_eq!(typed_cap(&redis, &prefix).await, expect);
    let _ = redis.quit().await;
}
