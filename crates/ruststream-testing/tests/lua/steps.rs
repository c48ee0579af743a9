//! A settle removes the step records (`K.steps:<id>`) of the messages it acknowledges (op `A`)
//! or dead-letters (op `X`) in the same script, and keeps those of the messages it retries; a
//! park for a signal (op `w`) finds a signal recorded already. The wait and the signal scripts.

use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::Signalled;
use ruststream_redis::DeadBound;
use ruststream_redis::frame::encode_parts;
use ruststream_redis::testing::{Call, Op, SettleList};

use crate::{key, on_both};

/// Claims `claimed` pushed onto `q.processing`, settled with `ops` (one each) without recovery.
async fn settle(
    client: &Client,
    prefix: &str,
    claimed: &[Bytes],
    ops: impl IntoIterator<Item = Op>,
) {
    let (keys, dest) = crate::dead::list_keys(prefix);
    let _: i64 = client
        .lpush(key(prefix, "q.processing"), claimed.to_vec())
        .await
        .expect("LPUSH");
    SettleList {
        keys: &keys,
        dest: &dest,
        token: Some("t1".into()),
        entries: claimed
            .iter()
            .zip(ops)
            .map(|(c, op)| (c.clone(), None, op))
            .collect(),
    }
    .call(client)
    .await
    .expect("settle.lua runs");
}

/// Three claims with a step record each, settled as an ack, a dead letter and a retry: which
/// records are left, how many dead letters there are, and what the processing list holds.
async fn settle_with_steps(client: Client, prefix: String) -> (Vec<bool>, i64, i64, i64) {
    let k = |s: &str| key(&prefix, s);
    let claimed: Vec<Bytes> = ["s1", "s2", "s3"]
        .iter()
        .map(|id| encode_parts(id, 1, &Default::default(), b"{}"))
        .collect();
    let records: Vec<String> = ["s1", "s2", "s3"]
        .iter()
        .map(|id| k(&format!("q.steps:{id}")))
        .collect();
    for r in &records {
        let _: i64 = client.hset(r, ("charge", "\"paid\"")).await.expect("HSET");
    }
    let bound = DeadBound {
        max_len: 10,
        max_age: std::time::Duration::from_secs(3600),
    };
    let ops = [
        Op::AckSteps {
            steps: records[0].clone(),
        },
        Op::Dead {
            frame: claimed[1].clone(),
            bound,
            steps: Some(records[1].clone()),
        },
        Op::Retry {
            frame: claimed[2].clone(),
        },
    ];
    settle(&client, &prefix, &claimed, ops).await;
    let mut left = Vec::new();
    for r in &records {
        let n: i64 = client.exists(r).await.expect("EXISTS");
        left.push(n == 1);
    }
    let dead: i64 = client.llen(k("q.dead")).await.expect("LLEN");
    let queued: i64 = client.llen(k("q")).await.expect("LLEN");
    let processing: i64 = client.llen(k("q.processing")).await.expect("LLEN");
    let mut all = records.clone();
    all.extend(["q", "q.dead", "q.processing", "q.settles"].map(k));
    let _: i64 = client.del(all).await.unwrap_or(0);
    (left, dead, queued, processing)
}

#[tokio::test]
async fn a_settle_removes_the_step_records_of_what_it_acks_or_dead_letters() {
    on_both(
        "settlesteps",
        (vec![false, false, true], 1, 1, 0),
        settle_with_steps,
    )
    .await;
}

/// Three claims with a step record each, settled as an ack and a dead letter that keep their
/// records a minute (`K`, `Y`) and a durable sleep of a minute (`s`): whether each kept record
/// lives at most the minute, how many dead letters there are, and who is in the sleeping set.
async fn settle_keeping_steps(client: Client, prefix: String) -> (Vec<bool>, i64, Vec<String>) {
    let k = |s: &str| key(&prefix, s);
    let ids = ["k1", "k2", "k3"];
    let claimed: Vec<Bytes> = ids
        .iter()
        .map(|id| encode_parts(id, 1, &Default::default(), b"{}"))
        .collect();
    let records: Vec<String> = ids.iter().map(|id| k(&format!("q.steps:{id}"))).collect();
    for r in &records {
        let _: i64 = client.hset(r, ("charge", "\"paid\"")).await.expect("HSET");
    }
    let keep = Duration::from_secs(60);
    let ops = [
        Op::AckKeep {
            steps: records[0].clone(),
            keep,
        },
        Op::DeadKeep {
            frame: claimed[1].clone(),
            bound: DeadBound {
                max_len: 10,
                max_age: Duration::from_secs(3600),
            },
            steps: records[1].clone(),
            keep,
        },
        Op::Sleep {
            frame: claimed[2].clone(),
            after: keep,
            id: "k3".into(),
        },
    ];
    settle(&client, &prefix, &claimed, ops).await;
    let mut kept = Vec::new();
    for r in &records[..2] {
        let ttl: i64 = client.pttl(r).await.expect("PTTL");
        kept.push(ttl > 0 && ttl <= 60_000);
    }
    let dead: i64 = client.llen(k("q.dead")).await.expect("LLEN");
    let sleeping: Vec<String> = client
        .zrange(k("q.delayed.sleeping"), 0, -1, None, false, None, false)
        .await
        .expect("ZRANGE");
    let mut all = records.clone();
    all.extend(
        [
            "q",
            "q.dead",
            "q.processing",
            "q.settles",
            "q.delayed",
            "q.delayed.payloads",
            "q.delayed.sleeping",
        ]
        .map(k),
    );
    let _: i64 = client.del(all).await.unwrap_or(0);
    (kept, dead, sleeping)
}

#[tokio::test]
async fn a_settle_keeps_step_records_with_keep_steps_and_indexes_a_sleep() {
    on_both(
        "keepsteps",
        (vec![true, true], 1, vec!["k3".to_owned()]),
        settle_keeping_steps,
    )
    .await;
}

/// `steps/write.lua` through `WriteStep`: a timed step records its result and its timing
/// `t:<name>` (began, took) in one call; the record's fields are bounded at
/// `MAX_STEP_FIELDS`.
async fn write_timed(client: Client, prefix: String) -> (String, i64, bool) {
    use ruststream_redis::testing::WriteStep;
    let record = key(&prefix, "q.steps:t1");
    let write = ruststream_core::StepWrite::Timed {
        value: Bytes::from_static(b"\"paid\""),
        step: "charge".into(),
        took: Duration::from_millis(25),
    };
    let before = now_ms(&client).await;
    let stored = WriteStep {
        key: &record,
        name: "charge",
        write: &write,
    }
    .call(&client)
    .await
    .expect("write.lua runs");
    let timing: String = client.hget(&record, "t:charge").await.expect("HGET");
    let (began, took) = ruststream_core::steps::parse_timing(&timing).expect("a timing");
    let began = i64::try_from(began).expect("ms");
    let _: i64 = client.del(&record).await.unwrap_or(0);
    (
        String::from_utf8_lossy(&stored).into_owned(),
        i64::try_from(took).expect("ms"),
        began >= before - 25 && began <= before + 1000,
    )
}

#[tokio::test]
async fn a_timed_step_records_its_timing_in_the_same_call() {
    on_both("timedstep", ("\"paid\"".to_owned(), 25, true), write_timed).await;
}

/// The server's now, in ms since the epoch.
async fn now_ms(client: &Client) -> i64 {
    let t: Vec<String> = client
        .custom(fred::cmd!("TIME"), Vec::<Value>::new())
        .await
        .expect("TIME");
    t[0].parse::<i64>().expect("s") * 1000 + t[1].parse::<i64>().expect("us") / 1000
}

/// `steps/wait.lua` through `BeginWait`: the first call records the wait with its deadline (an
/// hour from now) and the record's expiry past it; a call made again answers the same deadline;
/// once the signal is recorded, the call answers its payload.
async fn begin_wait(client: Client, prefix: String) -> (bool, bool, bool, Option<Vec<u8>>) {
    use ruststream_core::Waited;
    use ruststream_redis::testing::BeginWait;
    let record = key(&prefix, "q.steps:w1");
    let call = BeginWait {
        key: &record,
        name: "paid",
        timeout: Duration::from_secs(3600),
    };
    let before = now_ms(&client).await;
    let first = call.call(&client).await.expect("wait.lua runs");
    let in_an_hour = matches!(first, Some(Waited::Parked(d))
        if (before + 3_600_000..before + 3_610_000).contains(&i64::try_from(d).unwrap_or(0)));
    let again = call.call(&client).await.expect("wait.lua runs") == first;
    let ttl: i64 = client.pttl(&record).await.expect("PTTL");
    let past_the_wait = ttl > 7 * 24 * 3_600_000;
    let _: i64 = client
        .hset(&record, ("signal:paid", "{\"ok\":1}"))
        .await
        .expect("HSET");
    let signalled = match call.call(&client).await.expect("wait.lua runs") {
        Some(Waited::Signalled(b)) => Some(b.to_vec()),
        _ => None,
    };
    let _: i64 = client.del(&record).await.unwrap_or(0);
    (in_an_hour, again, past_the_wait, signalled)
}

#[tokio::test]
async fn a_wait_records_its_deadline_once_and_reads_a_signal_sent_before_it() {
    on_both(
        "beginwait",
        (true, true, true, Some(b"{\"ok\":1}".to_vec())),
        begin_wait,
    )
    .await;
}

/// `steps/signal.lua` through `SendSignal`, on four messages: one parked for the signal (its
/// delayed entry becomes due now: `Woken`), the same again (`Already`), one not parked (`Kept`,
/// the record expiring), one whose wait's deadline passed (`Late`, nothing recorded). Returns
/// the answers, whether the parked entry is due now, and the late record's field count.
async fn send_signals(client: Client, prefix: String) -> (Vec<Option<Signalled>>, bool, bool, i64) {
    use ruststream_redis::testing::SendSignal;
    let k = |s: &str| key(&prefix, s);
    let (set, payloads) = (k("q.delayed"), k("q.delayed.payloads"));
    let far = now_ms(&client).await + 3_600_000;
    let _: i64 = client
        .hset(k("q.steps:p"), ("wait:paid", far.to_string()))
        .await
        .expect("HSET");
    let _: i64 = client
        .zadd(&set, None, None, false, false, (far as f64, "p"))
        .await
        .expect("ZADD");
    let _: i64 = client.hset(&payloads, ("p", "frame")).await.expect("HSET");
    let _: i64 = client
        .hset(k("q.steps:l"), ("wait:paid", "1000"))
        .await
        .expect("HSET");
    let mut answers = Vec::new();
    for id in ["p", "p", "n", "l"] {
        let record = k(&format!("q.steps:{id}"));
        let call = SendSignal {
            key: &record,
            delayed: (&set, &payloads),
            id,
            name: "paid",
            payload: Bytes::from_static(b"{\"r\":1}"),
        };
        answers.push(call.call(&client).await.expect("signal.lua runs"));
    }
    let due: Option<f64> = client.zscore(&set, "p").await.expect("ZSCORE");
    let due_now = due.is_some_and(|d| d < (far - 3_000_000) as f64);
    let ttl: i64 = client.pttl(k("q.steps:n")).await.expect("PTTL");
    let expires = ttl > 0 && ttl <= 7 * 24 * 3_600_000;
    let late: i64 = client.hlen(k("q.steps:l")).await.expect("HLEN");
    let all = [
        "q.steps:p",
        "q.steps:n",
        "q.steps:l",
        "q.delayed",
        "q.delayed.payloads",
    ]
    .map(k);
    let _: i64 = client.del(all.to_vec()).await.unwrap_or(0);
    (answers, due_now, expires, late)
}

#[tokio::test]
async fn a_signal_wakes_a_parked_message_once_keeps_an_early_one_and_refuses_a_late_one() {
    on_both(
        "sendsignal",
        (
            vec![
                Some(Signalled::Woken),
                Some(Signalled::Already),
                Some(Signalled::Kept),
                Some(Signalled::Late),
            ],
            true,
            true,
            1,
        ),
        send_signals,
    )
    .await;
}

/// A settle parks two messages for a signal (op `w`, an hour): the one whose record holds the
/// signal already is due now, the other in an hour. Returns whether each is due within a minute.
async fn park(client: Client, prefix: String) -> Vec<bool> {
    let k = |s: &str| key(&prefix, s);
    let claimed: Vec<Bytes> = ["w1", "w2"]
        .iter()
        .map(|id| encode_parts(id, 1, &Default::default(), b"{}"))
        .collect();
    let _: i64 = client
        .hset(k("q.steps:w1"), ("signal:paid", "{}"))
        .await
        .expect("HSET");
    let ops = ["w1", "w2"].map(|id| Op::Later {
        frame: encode_parts(id, 1, &Default::default(), b"{}"),
        after: Duration::from_secs(3600),
        id: id.to_owned(),
        wake: Some((k(&format!("q.steps:{id}")), "signal:paid".to_owned())),
    });
    settle(&client, &prefix, &claimed, ops).await;
    let soon = now_ms(&client).await + 60_000;
    let mut due = Vec::new();
    for id in ["w1", "w2"] {
        let score: Option<f64> = client.zscore(k("q.delayed"), id).await.expect("ZSCORE");
        due.push(score.is_some_and(|s| s < soon as f64));
    }
    let all = [
        "q.steps:w1",
        "q.delayed",
        "q.delayed.payloads",
        "q.processing",
        "q.settles",
    ]
    .map(k);
    let _: i64 = client.del(all.to_vec()).await.unwrap_or(0);
    due
}

#[tokio::test]
async fn a_park_that_finds_its_signal_recorded_is_due_now() {
    on_both("parksignal", vec![true, false], park).await;
}
