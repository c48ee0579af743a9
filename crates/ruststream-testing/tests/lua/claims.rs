//! The claim scripts through their typed calls (`Claim`, `StreamRead`) with their gates: the
//! pause and the concurrency cap.

use fred::prelude::*;
use ruststream_testing::MemoryRedis;

use crate::{fastrand_suffix, key, on_both, redis};

/// A claim of up to 5 entries from `levels` through `gates`.
fn claim_of<'a>(
    levels: &'a [String],
    record: &'a ruststream_redis::Record,
    gates: &'a [ruststream_redis::Gate],
) -> ruststream_redis::Claim<'a> {
    ruststream_redis::Claim {
        levels,
        record,
        gates,
        max: 5,
        first_seq: 0,
    }
}

/// The claim pipeline's script through its typed call (`ruststream_redis::Claim`, the same the
/// readers use): the pause gate lets nothing through, then the levels are taken highest first
/// into the processing list. Returns what each call gave: (closed gate, values).
async fn typed_claim(client: Client, prefix: String) -> Vec<(Option<String>, Vec<Vec<u8>>)> {
    use ruststream_redis::{Call, Gate, Record};
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

/// What the concurrency cap's gate let two claims of each kind take: (closed gate, how many
/// taken, how many held back).
type CapRun = Vec<(Option<String>, usize, u64)>;

/// The concurrency cap (`Gate::cap_list`, `Gate::cap_group`) through the typed calls: a list
/// capped at 3 with 2 entries in its processing list takes 1 of 5 and then none (the cap
/// closed, the 4 left held back); a group capped at 2 reads 2 of 5 and then none (3 held back).
async fn typed_cap(client: &Client, prefix: &str) -> CapRun {
    use ruststream_redis::{Call, Gate, Record, StreamRead};
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
        let n = match &got.reply {
            Value::Array(streams) => match streams.first() {
                Some(Value::Array(kv)) => match kv.get(1) {
                    Some(Value::Array(entries)) => entries.len(),
                    _ => 0,
                },
                _ => 0,
            },
            _ => 0,
        };
        out.push((got.closed, n, got.held.entries));
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
