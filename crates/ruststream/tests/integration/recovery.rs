//! Crash recovery of reliable lists: claims recorded in the recovery set, stale claims swept back
//! to the queue, concurrent sweepers, the ttl. Each test runs on the in-memory model, the
//! standalone server and the cluster (`name::memory`, `name::standalone`, `name::cluster`, see
//! `harness`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use ruststream::prelude::*;
use tokio::sync::Semaphore;

use crate::harness;
use harness::{Env, WAIT, on, start, stop, try_start, wait_until};

on!(
    [memory, standalone, cluster]
    claims_are_recorded_and_acks_remove_them,
    a_claim_is_not_recovered_before_min_idle,
    concurrent_sweepers_never_duplicate,
    identical_bytes_are_two_claims_and_ttl_is_rearmed,
    misconfigured_recovery_does_not_start
);

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Job {
    n: u32,
}
outgoing!(Job);

/// The harness's recorder: `Record::default()` acknowledges, `Record::hanging()` never finishes.
type Record = harness::Seen<Job>;

impl Record {
    /// `(n, attempt)` of every delivery, in handling order.
    fn pairs(&self) -> Vec<(u32, u32)> {
        self.seen().iter().map(|d| (d.n, d.attempt)).collect()
    }
}

/// Records as [`Record`] does, then waits for the test to open `gate`.
fn gated(gate: &Arc<Semaphore>) -> Record {
    let gate = gate.clone();
    Record::deciding(move |_, _, _| {
        let gate = gate.clone();
        Box::pin(async move {
            let _open = gate.acquire().await;
            Ok(())
        })
    })
}

fn queue(min_idle: Duration) -> RedisList {
    RedisList::new("{jobs}")
        .reliable()
        .min_idle(min_idle)
        .recovery_zset("{jobs}.claims")
        .block(Duration::from_millis(200))
}

/// An app of its own (own broker and connections), as another worker process would be.
fn app(env: &Env, source: RedisList, handler: Record) -> RustStream {
    RustStream::new(AppInfo::new("recovery", "0"))
        .shutdown_timeout(Duration::from_millis(100))
        .with_broker(env.broker_with(|b| b), |b| {
            b.include(subscriber(source, handler).build());
        })
}

async fn publish(env: &Env, jobs: &[Job]) {
    let broker = env.broker_with(|b| b);
    broker.connect().await.unwrap();
    broker
        .publisher()
        .messages(jobs)
        .to("{jobs}")
        .publish()
        .await
        .unwrap();
}

async fn claims_are_recorded_and_acks_remove_them(env: &Env) {
    let p = &env.prefix;
    let r = &env.client;
    let hung = Record::hanging();
    let running = start(app(
        env,
        queue(Duration::from_secs(60)).concurrency(2),
        hung.clone(),
    ))
    .await;
    publish(env, &[Job { n: 1 }, Job { n: 2 }]).await;
    wait_until("both claimed", Duration::from_secs(5), || async {
        hung.pairs().len() == 2
    })
    .await;
    let claims: Vec<(fred::bytes::Bytes, f64)> = r
        .zrange(
            format!("{p}{{jobs}}.claims"),
            0,
            -1,
            None,
            false,
            None,
            true,
        )
        .await
        .unwrap();
    assert!(!claims.is_empty(), "one member a claimed batch");
    assert_eq!(
        claimed_entries(r, &format!("{p}{{jobs}}.claims")).await,
        2,
        "both claims recorded in their batches' lists"
    );
    let (sec, usec): (i64, i64) = {
        let t: Vec<i64> = r
            .custom(fred::cmd!("TIME"), Vec::<String>::new())
            .await
            .unwrap();
        (t[0], t[1])
    };
    let server_ms = (sec * 1000 + usec / 1000) as f64;
    for (_, score) in &claims {
        assert!(
            (server_ms - score).abs() < 5_000.0,
            "score {score} is the server's clock ({server_ms})"
        );
    }
    stop(running).await;

    // A new worker acks them: set and processing list end empty.
    let ok = Record::default();
    let running = start(app(env, queue(Duration::from_millis(200)), ok.clone())).await;
    wait_until(
        "both recovered and handled",
        Duration::from_secs(5),
        || async { ok.pairs().len() == 2 },
    )
    .await;
    wait_until(
        "set and processing list empty",
        Duration::from_secs(5),
        || async {
            let z: i64 = r.zcard(format!("{p}{{jobs}}.claims")).await.unwrap();
            let l: i64 = r.llen(format!("{p}{{jobs}}.processing")).await.unwrap();
            z == 0 && l == 0
        },
    )
    .await;
    stop(running).await;
    let mut seen = ok.pairs();
    seen.sort_unstable();
    assert_eq!(
        seen,
        vec![(1, 2), (2, 2)],
        "a recovered entry counts as a delivery attempt"
    );
}

async fn a_claim_is_not_recovered_before_min_idle(env: &Env) {
    let hung = Record::hanging();
    let running = start(app(env, queue(Duration::from_secs(60)), hung.clone())).await;
    publish(env, &[Job { n: 7 }]).await;
    wait_until("claimed", Duration::from_secs(5), || async {
        hung.pairs().len() == 1
    })
    .await;
    stop(running).await;

    // min_idle 1.5 s: the second worker must not see it for at least ~1.5 s after the claim.
    let started = tokio::time::Instant::now();
    let second = Record::default();
    let running = start(app(env, queue(Duration::from_millis(1500)), second.clone())).await;
    wait_until("recovered", Duration::from_secs(10), || async {
        second.pairs().len() == 1
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(1200),
        "recovered too early: {:?}",
        started.elapsed()
    );
    stop(running).await;
    assert_eq!(second.pairs(), vec![(7, 2)]);
}

/// The claims recorded in the recovery set `zset`: the entries of its members' batch lists
/// (`<set>:<member>`) not marked settled (`<set>:<member>:s`).
async fn claimed_entries(r: &fred::clients::Client, zset: &str) -> i64 {
    let members: Vec<String> = r
        .zrange(zset, 0, -1, None, false, None, false)
        .await
        .unwrap();
    let mut n = 0;
    for m in members {
        let len: i64 = r.llen(format!("{zset}:{m}")).await.unwrap();
        let marks: Option<fred::bytes::Bytes> = r.get(format!("{zset}:{m}:s")).await.unwrap();
        let marked = marks.map_or(0, |s| s.iter().filter(|&&b| b == b'1').count());
        n += len - i64::try_from(marked).unwrap();
    }
    n
}

async fn concurrent_sweepers_never_duplicate(env: &Env) {
    const N: u32 = 300;
    let p = &env.prefix;
    let r = &env.client;
    // Claims left behind by a crashed worker: entries in the processing list, members scored
    // an hour ago.
    let jobs: Vec<Job> = (0..N).map(|n| Job { n }).collect();
    publish(env, &jobs).await;
    let hung = Record::hanging();
    let running = start(app(
        env,
        queue(Duration::from_secs(3600)).concurrency(N as usize),
        hung.clone(),
    ))
    .await;
    wait_until("all claimed", Duration::from_secs(10), || async {
        hung.pairs().len() == N as usize
    })
    .await;
    stop(running).await;
    let zset = format!("{p}{{jobs}}.claims");
    let members: Vec<fred::bytes::Bytes> = r
        .zrange(&zset, 0, -1, None, false, None, false)
        .await
        .unwrap();
    assert!(!members.is_empty(), "one member a claimed batch");
    assert_eq!(
        claimed_entries(r, &zset).await,
        i64::from(N),
        "the batch lists hold every claim"
    );
    let _: i64 = r
        .zadd(
            &zset,
            None,
            None,
            false,
            false,
            members.iter().map(|m| (1.0, m.clone())).collect::<Vec<_>>(),
        )
        .await
        .unwrap();

    // The sweep moves at most 128 a read. A worker with one handler, held at a gate, makes one
    // read: the claim script sweeps the stale claims back to the queue, then claims one of them.
    let len = async |key: String| -> (i64, i64, i64) {
        let q: i64 = r.llen(key.clone()).await.unwrap();
        let l: i64 = r.llen(format!("{key}.processing")).await.unwrap();
        let z = claimed_entries(r, &format!("{key}.claims")).await;
        (q, l, z)
    };
    let queue_key = format!("{p}{{jobs}}");
    let gate = Arc::new(Semaphore::new(0));
    let sweeper = gated(&gate);
    let handler = sweeper.clone();
    let mut running = start(
        RustStream::new(AppInfo::new("recovery", "0"))
            .shutdown_timeout(WAIT)
            .with_broker(env.broker_with(|b| b), |b| {
                b.include(
                    subscriber(queue(Duration::from_secs(3600)).concurrency(1), handler).build(),
                );
            }),
    )
    .await;
    wait_until("the sweeper's claim", Duration::from_secs(10), || async {
        sweeper.pairs().len() == 1
    })
    .await;
    let n = i64::from(N);
    assert_eq!(
        len(queue_key.clone()).await,
        (128 - 1, n - 128 + 1, n - 128 + 1),
        "at most 128 claims recovered by one read, one of them claimed again"
    );
    // The sweeper stops reading, then finishes (acks) its one entry.
    running.stop_subscription("{jobs}").unwrap();
    gate.add_permits(1);
    wait_until("the sweeper's ack", Duration::from_secs(5), || async {
        len(queue_key.clone()).await == (127, n - 128, n - 128)
    })
    .await;
    stop(running).await;

    // Four workers sweep the rest at once.
    let handlers: Vec<Record> = (0..4).map(|_| Record::default()).collect();
    let apps = futures::future::join_all(
        handlers
            .iter()
            .map(|h| start(app(env, queue(Duration::from_secs(3600)), h.clone()))),
    )
    .await;
    let handlers: Vec<Record> = handlers.into_iter().chain([sweeper.clone()]).collect();
    let total = || handlers.iter().map(|h| h.pairs().len()).sum::<usize>();
    wait_until("every entry handled", Duration::from_secs(20), || async {
        total() >= N as usize
    })
    .await;
    wait_until("nothing left", Duration::from_secs(5), || async {
        let z: i64 = r.zcard(&zset).await.unwrap();
        let l: i64 = r.llen(format!("{p}{{jobs}}.processing")).await.unwrap();
        let q: i64 = r.llen(format!("{p}{{jobs}}")).await.unwrap();
        z == 0 && l == 0 && q == 0
    })
    .await;
    for a in apps {
        stop(a).await;
    }
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for h in &handlers {
        for (n, attempt) in h.pairs() {
            assert_eq!(attempt, 2);
            *counts.entry(n).or_default() += 1;
        }
    }
    assert_eq!(counts.len(), N as usize, "every entry came back");
    assert!(
        counts.values().all(|&c| c == 1),
        "an entry was recovered twice"
    );
}

async fn identical_bytes_are_two_claims_and_ttl_is_rearmed(env: &Env) {
    let p = &env.prefix;
    let r = &env.client;
    let hung = Record::hanging();
    let source = queue(Duration::from_secs(60)).recovery_ttl(Duration::from_secs(600));
    let running = start(app(env, source, hung.clone())).await;
    let _: i64 = r
        .lpush(format!("{p}{{jobs}}"), vec![r#"{"n":5}"#, r#"{"n":5}"#])
        .await
        .unwrap();
    wait_until("both claimed", Duration::from_secs(5), || async {
        hung.pairs().len() == 2
    })
    .await;
    let zset = format!("{p}{{jobs}}.claims");
    assert_eq!(
        claimed_entries(r, &zset).await,
        2,
        "two claims of identical bytes are two unmarked entries of the batch lists"
    );
    let ttl: i64 = r.pttl(&zset).await.unwrap();
    assert!(
        (590_000..=600_000).contains(&ttl),
        "recovery_ttl armed: {ttl}"
    );
    stop(running).await;
}

async fn misconfigured_recovery_does_not_start(env: &Env) {
    let no_idle = RedisList::new("{jobs}")
        .reliable()
        .recovery_zset("{jobs}.claims");
    let e = try_start(app(env, no_idle, Record::default()))
        .await
        .expect_err("must not start");
    let config = harness::config_error(&e);
    assert_eq!(config.option, "recovery_zset", "{e}");
    assert_eq!(config.subject.as_deref(), Some("{jobs}"), "{e}");
    assert!(config.problem.contains("needs min_idle"), "{e}");
    let short_ttl = queue(Duration::from_secs(60)).recovery_ttl(Duration::from_secs(30));
    let e = try_start(app(env, short_ttl, Record::default()))
        .await
        .expect_err("must not start");
    let config = harness::config_error(&e);
    assert_eq!(config.option, "recovery_ttl", "{e}");
    assert!(config.problem.contains("longer than min_idle"), "{e}");
}
