//! The typed calls of the scripts other than the claim's and the way back's.

use std::time::Duration;

use fred::prelude::*;

use crate::{key, on_both};

/// `operate/oldest_claim.lua` through `OldestClaim`: the claim time is read from each member
/// (a batch's `<reader>:<seq>.<seconds>.<microseconds>`, or the per-entry form with `:<value>`),
/// not from its score; a member of another shape names none. Returns each call's reply.
async fn oldest_claim(client: Client, prefix: String) -> Vec<(u64, Option<i64>)> {
    use ruststream_redis::testing::{Call, OldestClaim};
    let zset = key(&prefix, "q.claims");
    let members = vec![
        (1.0, "junk"),
        (3.0, "r1:2.1600000000.999999:b"),
        (5.0, "r1:1.1700000000.250000:a"),
        (7.0, "r2:3.1500000000.000005"),
    ];
    let mut out = Vec::new();
    let none = OldestClaim {
        zset: &zset,
        most: 10,
    };
    out.push(none.call(&client).await.expect("oldest_claim.lua runs"));
    let _: i64 = client
        .zadd(&zset, None, None, false, false, members)
        .await
        .unwrap();
    for most in [1, 2, 10] {
        let call = OldestClaim { zset: &zset, most };
        out.push(call.call(&client).await.expect("oldest_claim.lua runs"));
    }
    let _: i64 = client.del(&zset).await.unwrap_or(0);
    out
}

#[tokio::test]
async fn the_typed_oldest_claim_call_gives_the_same_reply_on_the_model_and_on_redis() {
    let expect = vec![
        (0, None),
        (1, None),
        (2, Some(1_600_000_000_999)),
        (4, Some(1_500_000_000_000)),
    ];
    on_both("oldest", expect, oldest_claim).await;
}

/// `operate/delayed.lua` through `ChangeDelayed`: a promote of the earliest takes only the
/// entries not yet due, a cancel by id counts the ids it found, a cancel of the earliest takes
/// the lowest score (the overdue entry, below the promoted ones' server time). Returns each
/// call's count, then the set's members and the hash's fields left.
async fn change_delayed(client: Client, prefix: String) -> (Vec<usize>, Vec<String>, Vec<String>) {
    use ruststream_redis::testing::{Call, ChangeDelayed, DelayedChange, DelayedPick};
    let set = key(&prefix, "q.delayed");
    let payloads = key(&prefix, "q.delayed.payloads");
    let future = 9.0e12;
    let entries = vec![(future, "a"), (future + 1.0, "b"), (1.0, "c")];
    let _: i64 = client
        .zadd(&set, None, None, false, false, entries)
        .await
        .unwrap();
    let fields = vec![("a", "fa"), ("b", "fb"), ("c", "fc")];
    let _: i64 = client.hset(&payloads, fields).await.unwrap();
    let calls = [
        (DelayedChange::Promote, DelayedPick::Earliest(10)),
        (DelayedChange::Promote, DelayedPick::Earliest(10)),
        (DelayedChange::Cancel, DelayedPick::Ids(&["a", "zz"])),
        (DelayedChange::Cancel, DelayedPick::Earliest(1)),
    ];
    let mut counts = Vec::new();
    for (change, pick) in calls {
        let call = ChangeDelayed {
            set: &set,
            payloads: &payloads,
            change,
            pick,
        };
        counts.push(call.call(&client).await.expect("delayed.lua runs"));
    }
    let left: Vec<String> = client
        .zrange(&set, 0, -1, None, false, None, false)
        .await
        .unwrap();
    let mut fields: Vec<String> = client.hkeys(&payloads).await.unwrap();
    fields.sort();
    let _: i64 = client.del(vec![set, payloads]).await.unwrap_or(0);
    (counts, left, fields)
}

#[tokio::test]
async fn the_typed_delayed_change_call_gives_the_same_reply_on_the_model_and_on_redis() {
    let expect = (vec![2, 0, 1, 1], vec!["b".to_owned()], vec!["b".to_owned()]);
    on_both("delayed", expect, change_delayed).await;
}

/// A periodic script's reply.
#[derive(Debug, PartialEq)]
enum Periodic {
    /// A registration's: the last fired tick.
    Registered(Option<u64>),
    /// A fired tick's: whether the stored one moved.
    Fired(bool),
}

/// `periodic/register.lua` and `periodic/fired.lua` through `RegisterPeriodic` and
/// `PeriodicFired`: the last tick only moves forward, and a registration reads it; a job whose
/// keep-until time passed (`gone`, marked so by hand) is forgotten by the next registration,
/// and one registered by an older version (`old`, no seen field) is given a keep time. Returns
/// each call's reply, the definition stored, and the registry's and seen hash's names.
async fn periodic(
    client: Client,
    prefix: String,
) -> (Vec<Periodic>, String, Vec<String>, Vec<String>) {
    use Periodic::{Fired, Registered};
    use ruststream_redis::testing::{Call, PERIODIC_KEEP, PeriodicFired, RegisterPeriodic};
    let registry = key(&prefix, "ruststream:periodic");
    let last = key(&prefix, "ruststream:periodic.last");
    let seen = key(&prefix, "ruststream:periodic.seen");
    let register = |definition| RegisterPeriodic {
        registry: &registry,
        last: &last,
        seen: &seen,
        name: "nightly",
        definition,
        keep: PERIODIC_KEEP,
    };
    let fired = |tick| PeriodicFired {
        registry: &registry,
        last: &last,
        seen: &seen,
        name: "nightly",
        tick,
        keep: PERIODIC_KEEP,
    };
    let mut out = vec![Registered(
        register("{\"v\":1}").call(&client).await.unwrap(),
    )];
    for tick in [1000, 900, 1000] {
        out.push(Fired(fired(tick).call(&client).await.unwrap()));
    }
    out.push(Registered(
        register("{\"v\":2}").call(&client).await.unwrap(),
    ));
    out.push(Fired(fired(2000).call(&client).await.unwrap()));
    let _: i64 = client.hset(&registry, ("gone", "{}")).await.unwrap();
    let _: i64 = client.hset(&last, ("gone", "5")).await.unwrap();
    let _: i64 = client.hset(&seen, ("gone", "1000")).await.unwrap();
    let _: i64 = client.hset(&registry, ("old", "{}")).await.unwrap();
    out.push(Registered(
        register("{\"v\":2}").call(&client).await.unwrap(),
    ));
    let definition: String = client.hget(&registry, "nightly").await.unwrap();
    let mut names: Vec<String> = client.hkeys(&registry).await.unwrap();
    names.sort();
    let mut seen_names: Vec<String> = client.hkeys(&seen).await.unwrap();
    seen_names.sort();
    let lasts: Vec<String> = client.hkeys(&last).await.unwrap();
    assert_eq!(lasts, ["nightly"], "the gone job's last tick is forgotten");
    let _: i64 = client.del(vec![registry, last, seen]).await.unwrap_or(0);
    (out, definition, names, seen_names)
}

#[tokio::test]
async fn the_typed_periodic_calls_give_the_same_replies_on_the_model_and_on_redis() {
    use Periodic::{Fired, Registered};
    let names = vec!["nightly".to_owned(), "old".to_owned()];
    let expect = (
        vec![
            Registered(None),
            Fired(true),
            Fired(false),
            Fired(false),
            Registered(Some(1000)),
            Fired(true),
            Registered(Some(2000)),
        ],
        "{\"v\":2}".to_owned(),
        names.clone(),
        names,
    );
    on_both("periodic", expect, periodic).await;
}

/// `list/push_ttl.lua` through `PushTtl`: pushes onto the left in order (more than one `LPUSH`
/// batch of 1,000 too) and sets the ttl. Returns each call's length, the list's first and last
/// values, and whether its ttl is set and at most the one given.
async fn push_ttl(client: Client, prefix: String) -> (Vec<i64>, Vec<String>, bool) {
    use ruststream_redis::testing::{Call, PushTtl};
    let list = key(&prefix, "q");
    let ttl = Duration::from_secs(60);
    let many: Vec<Value> = (0..1500).map(|i| Value::from(format!("m{i}"))).collect();
    let mut lens = Vec::new();
    for values in [vec![Value::from("a"), Value::from("b")], many] {
        let push = PushTtl {
            list: &list,
            ttl,
            values: &values,
        };
        lens.push(push.call(&client).await.expect("push_ttl.lua runs"));
    }
    let first: Vec<String> = client.lrange(&list, 0, 0).await.unwrap();
    let last: Vec<String> = client.lrange(&list, -2, -1).await.unwrap();
    let pttl: i64 = client.pttl(&list).await.unwrap();
    let _: i64 = client.del(&list).await.unwrap_or(0);
    let ends = first.into_iter().chain(last).collect();
    (lens, ends, pttl > 0 && pttl <= 60_000)
}

#[tokio::test]
async fn the_typed_push_ttl_call_gives_the_same_reply_on_the_model_and_on_redis() {
    let expect = (
        vec![2, 1502],
        vec!["m1499".to_owned(), "b".to_owned(), "a".to_owned()],
        true,
    );
    on_both("pushttl", expect, push_ttl).await;
}

/// `list/lease.lua` through `Lease`: moves the scores of the members still in the recovery set
/// (more than one `ZADD` batch of 500 members), never adds one back, and sets the set's ttl.
/// Returns how many moved, the set's size, whether the gone member is absent, and whether the
/// ttl is set.
async fn lease(client: Client, prefix: String) -> (u64, u64, bool, bool) {
    use bytes::Bytes;
    use ruststream_redis::testing::{Call, Lease};
    let zset = key(&prefix, "q.claims");
    let held: Vec<String> = (0..700).map(|i| format!("r1:{i}.1.0:v{i}")).collect();
    let scored: Vec<(f64, String)> = held.iter().map(|m| (1.0, m.clone())).collect();
    let _: i64 = client
        .zadd(&zset, None, None, false, false, scored)
        .await
        .unwrap();
    let mut members: Vec<Bytes> = held.into_iter().map(Bytes::from).collect();
    members.push(Bytes::from_static(b"r1:9999.1.0:gone"));
    let call = Lease {
        zset: &zset,
        ttl_ms: 60_000,
        members: &members,
    };
    let moved = call.call(&client).await.expect("lease.lua runs");
    let size: u64 = client.zcard(&zset).await.unwrap();
    let gone: Option<f64> = client.zscore(&zset, "r1:9999.1.0:gone").await.unwrap();
    let pttl: i64 = client.pttl(&zset).await.unwrap();
    let _: i64 = client.del(&zset).await.unwrap_or(0);
    (moved, size, gone.is_none(), pttl > 0 && pttl <= 60_000)
}

#[tokio::test]
async fn the_typed_lease_call_gives_the_same_reply_on_the_model_and_on_redis() {
    on_both("lease", (700, 700, true, true), lease).await;
}

/// `job.lua` through `WriteJob`: progress until a result or a failure, which is final (the
/// first one wins). Returns each write's reply, then each record's `progress`, `result`,
/// `error` and `state`, and whether the ttl is set.
async fn job(client: Client, prefix: String) -> (Vec<bool>, Vec<Vec<Option<String>>>, bool) {
    use bytes::Bytes;
    use ruststream_redis::testing::{Call, JobKind, WriteJob};
    let done = key(&prefix, "job:done");
    let failed = key(&prefix, "job:failed");
    let ttl = Duration::from_secs(60);
    let writes = [
        (&done, JobKind::Progress, "1"),
        (&done, JobKind::Result, "\"r\""),
        (&done, JobKind::Progress, "2"),
        (&done, JobKind::Failed, "late"),
        (&failed, JobKind::Failed, "why"),
        (&failed, JobKind::Result, "\"r\""),
    ];
    let mut wrote = Vec::new();
    for (key, kind, value) in writes {
        let value = Bytes::from_static(value.as_bytes());
        let write = WriteJob {
            key,
            kind,
            value: &value,
            ttl,
        };
        wrote.push(write.call(&client).await.expect("job.lua runs"));
    }
    let mut records = Vec::new();
    for key in [&done, &failed] {
        let fields = vec!["progress", "result", "error", "state"];
        records.push(client.hmget(key, fields).await.unwrap());
    }
    let pttl: i64 = client.pttl(&done).await.unwrap();
    let _: i64 = client.del(vec![done, failed]).await.unwrap_or(0);
    (wrote, records, pttl > 0 && pttl <= 60_000)
}

#[tokio::test]
async fn the_typed_job_write_call_gives_the_same_reply_on_the_model_and_on_redis() {
    let s = |v: &str| Some(v.to_owned());
    let expect = (
        vec![true, true, false, false, true, false],
        vec![
            vec![s("1"), s("\"r\""), None, s("done")],
            vec![None, None, s("why"), s("failed")],
        ],
        true,
    );
    on_both("job", expect, job).await;
}

/// `stream/trim.lua` through `TrimAcked`: nothing without the stream or its groups, nothing
/// while a group has read nothing, then what every group has acknowledged below the lowest id
/// one still needs (a pending entry, or a last-delivered one). Redis's `XTRIM MINID ~` drops
/// whole macro nodes only (of 100 entries, `stream-node-max-entries`' default), the model drops
/// what an exact trim would: the threshold is put at the 101st entry, the first of the second
/// node, where the two agree. Returns each call's reply.
async fn trim_acked(client: Client, prefix: String) -> Vec<(u64, String)> {
    use ruststream_redis::testing::{Call, TrimAcked};
    let stream = key(&prefix, "events");
    let trim = TrimAcked { stream: &stream };
    let mut out = vec![trim.call(&client).await.expect("trim.lua runs")];
    for i in 1..=101 {
        let id = format!("1-{i}");
        let _: String = client
            .xadd(&stream, false, None, id.as_str(), ("f", "v"))
            .await
            .unwrap();
    }
    out.push(trim.call(&client).await.expect("trim.lua runs"));
    let () = client
        .xgroup_create(&stream, "reader", "0", false)
        .await
        .unwrap();
    out.push(trim.call(&client).await.expect("trim.lua runs"));
    let _: Value = client
        .xreadgroup("reader", "c", Some(101), None, false, &stream, ">")
        .await
        .unwrap();
    let acked: Vec<String> = (1..=100).map(|i| format!("1-{i}")).collect();
    let _: i64 = client.xack(&stream, "reader", acked).await.unwrap();
    let () = client
        .xgroup_create(&stream, "late", "1-101", false)
        .await
        .unwrap();
    for _ in 0..2 {
        out.push(trim.call(&client).await.expect("trim.lua runs"));
    }
    let _: i64 = client.del(&stream).await.unwrap_or(0);
    out
}

#[tokio::test]
async fn the_typed_trim_call_gives_the_same_reply_on_the_model_and_on_redis() {
    let t = |n, id: &str| (n, id.to_owned());
    let expect = vec![
        t(0, ""),
        t(0, ""),
        t(0, "0-0"),
        t(100, "1-101"),
        t(0, "1-101"),
    ];
    on_both("trim", expect, trim_acked).await;
}

/// `stream/forget_consumers.lua` through `ForgetConsumers`: of `me` (the caller), `me-2` (its
/// second reader), `gone` (nothing pending) and `busy` (one entry pending), all idle past the
/// bound, only `gone` is
/// removed; a missing group removes nothing. Returns each call's reply and the names left.
async fn forget_consumers(client: Client, prefix: String) -> (Vec<u64>, Vec<String>) {
    use ruststream_redis::testing::{Call, ForgetConsumers};
    let stream = key(&prefix, "s");
    let _: String = client
        .xadd(&stream, false, None, "1-1", ("f", "v"))
        .await
        .unwrap();
    let () = client
        .xgroup_create(&stream, "g", "0", false)
        .await
        .unwrap();
    for c in ["me", "me-2", "gone"] {
        let _: i64 = client.xgroup_createconsumer(&stream, "g", c).await.unwrap();
    }
    let _: Value = client
        .xreadgroup("g", "busy", Some(1), None, false, &stream, ">")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let call = |group| ForgetConsumers {
        stream: &stream,
        group,
        consumer: "me",
        readers: 2,
        idle: Duration::from_millis(1),
        most: 16,
    };
    let mut out = Vec::new();
    for group in ["g", "g", "nogroup"] {
        out.push(
            call(group)
                .call(&client)
                .await
                .expect("forget_consumers.lua runs"),
        );
    }
    let consumers: Value = client
        .custom(fred::cmd!("XINFO"), vec!["CONSUMERS", &stream, "g"])
        .await
        .unwrap();
    let mut names: Vec<String> = match consumers {
        Value::Array(cs) => cs
            .into_iter()
            .filter_map(|c| match c {
                Value::Array(f) => f.get(1).and_then(Value::as_string),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    names.sort();
    let _: i64 = client.del(&stream).await.unwrap_or(0);
    (out, names)
}

#[tokio::test]
async fn the_typed_forget_consumers_call_gives_the_same_reply_on_the_model_and_on_redis() {
    let expect = (
        vec![1, 0, 0],
        vec!["busy".to_owned(), "me".to_owned(), "me-2".to_owned()],
    );
    on_both("forgetconsumers", expect, forget_consumers).await;
}
