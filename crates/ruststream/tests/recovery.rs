//! Crash recovery of reliable lists on a real Redis (seed 000, issue 6): claims recorded in the
//! recovery set, stale claims swept back to the queue, concurrent sweepers, the ttl. Each test
//! runs on the standalone server and on the cluster (`name::standalone`, `name::cluster`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use ruststream::prelude::*;

mod topo;
use topo::{Topo, on_both, prefix, wait_until};

on_both!(
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

/// Records `(n, attempt)` of every delivery; never finishes when `hang` is set.
#[derive(Clone, Default)]
struct Record {
    seen: Arc<Mutex<Vec<(u32, u32)>>>,
    hang: bool,
}

impl Handle<Job> for Record {
    fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        self.seen.lock().unwrap().push((job.n, ctx.attempt()));
        let hang = self.hang;
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            Ok(())
        }
    }
}

impl Record {
    fn seen(&self) -> Vec<(u32, u32)> {
        self.seen.lock().unwrap().clone()
    }
}

fn queue(min_idle: Duration) -> RedisList {
    RedisList::new("{jobs}")
        .reliable()
        .min_idle(min_idle)
        .recovery_zset("{jobs}.claims")
        .block(Duration::from_millis(200))
}

fn app(t: &Topo, prefix: &str, source: RedisList, handler: Record) -> RustStream {
    RustStream::new(AppInfo::new("recovery", "0"))
        .shutdown_timeout(Duration::from_millis(100))
        .with_broker(t.broker().prefix(prefix), |b| {
            b.include(subscriber(source, handler).build());
        })
}

async fn publish(t: &Topo, prefix: &str, jobs: &[Job]) {
    let broker = t.broker().prefix(prefix);
    broker.connect().await.unwrap();
    broker
        .publisher()
        .messages(jobs)
        .to("{jobs}")
        .publish()
        .await
        .unwrap();
}

async fn claims_are_recorded_and_acks_remove_them(t: Topo) {
    let p = prefix("rt");
    let r = t.client().await;
    let hung = Record {
        hang: true,
        ..Record::default()
    };
    let running = app(
        &t,
        &p,
        queue(Duration::from_secs(60)).concurrency(2),
        hung.clone(),
    )
    .start()
    .await
    .unwrap();
    publish(&t, &p, &[Job { n: 1 }, Job { n: 2 }]).await;
    wait_until("both claimed", Duration::from_secs(5), || async {
        hung.seen().len() == 2
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
    assert_eq!(claims.len(), 2, "one member per claim");
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
    running.shutdown().await.unwrap();

    // A new worker acks them: set and processing list end empty.
    let ok = Record::default();
    let running = app(&t, &p, queue(Duration::from_millis(200)), ok.clone())
        .start()
        .await
        .unwrap();
    wait_until(
        "both recovered and handled",
        Duration::from_secs(5),
        || async { ok.seen().len() == 2 },
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
    running.shutdown().await.unwrap();
    let mut seen = ok.seen();
    seen.sort_unstable();
    assert_eq!(
        seen,
        vec![(1, 2), (2, 2)],
        "a recovered entry counts as a delivery attempt"
    );
}

async fn a_claim_is_not_recovered_before_min_idle(t: Topo) {
    let p = prefix("rt");
    let hung = Record {
        hang: true,
        ..Record::default()
    };
    let running = app(&t, &p, queue(Duration::from_secs(60)), hung.clone())
        .start()
        .await
        .unwrap();
    publish(&t, &p, &[Job { n: 7 }]).await;
    wait_until("claimed", Duration::from_secs(5), || async {
        hung.seen().len() == 1
    })
    .await;
    running.shutdown().await.unwrap();

    // min_idle 1.5 s: the second worker must not see it for at least ~1.5 s after the claim.
    let started = std::time::Instant::now();
    let second = Record::default();
    let running = app(&t, &p, queue(Duration::from_millis(1500)), second.clone())
        .start()
        .await
        .unwrap();
    wait_until("recovered", Duration::from_secs(10), || async {
        second.seen().len() == 1
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(1200),
        "recovered too early: {:?}",
        started.elapsed()
    );
    running.shutdown().await.unwrap();
    assert_eq!(second.seen(), vec![(7, 2)]);
}

async fn concurrent_sweepers_never_duplicate(t: Topo) {
    const N: u32 = 300;
    let p = prefix("rt");
    let r = t.client().await;
    // Claims left behind by a crashed worker: entries in the processing list, members scored
    // an hour ago.
    let jobs: Vec<Job> = (0..N).map(|n| Job { n }).collect();
    publish(&t, &p, &jobs).await;
    let hung = Record {
        hang: true,
        ..Record::default()
    };
    let running = app(
        &t,
        &p,
        queue(Duration::from_secs(3600)).concurrency(N as usize),
        hung.clone(),
    )
    .start()
    .await
    .unwrap();
    wait_until("all claimed", Duration::from_secs(10), || async {
        hung.seen().len() == N as usize
    })
    .await;
    running.shutdown().await.unwrap();
    let zset = format!("{p}{{jobs}}.claims");
    let members: Vec<fred::bytes::Bytes> = r
        .zrange(&zset, 0, -1, None, false, None, false)
        .await
        .unwrap();
    assert_eq!(members.len(), N as usize);
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

    // The sweep moves at most 128 a read: call the claim script as a reader would, claiming none.
    let keys = vec![
        format!("{p}{{jobs}}"),
        format!("{p}{{jobs}}.processing"),
        zset.clone(),
    ];
    let args = vec!["0", "sweeper", "0", "3600000", "0", "128"];
    let first: Vec<i64> = ruststream::redis::scripts::CLAIM
        .evalsha_with_reload(&r, keys, args)
        .await
        .unwrap();
    assert_eq!(first, vec![128], "at most 128 claims recovered by one read");
    let queued: i64 = r.llen(format!("{p}{{jobs}}")).await.unwrap();
    assert_eq!(queued, 128);

    // Four workers sweep the rest at once.
    let handlers: Vec<Record> = (0..4).map(|_| Record::default()).collect();
    let apps = futures::future::try_join_all(
        handlers
            .iter()
            .map(|h| app(&t, &p, queue(Duration::from_secs(3600)), h.clone()).start()),
    )
    .await
    .unwrap();
    let total = || handlers.iter().map(|h| h.seen().len()).sum::<usize>();
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
        a.shutdown().await.unwrap();
    }
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for h in &handlers {
        for (n, attempt) in h.seen() {
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

async fn identical_bytes_are_two_claims_and_ttl_is_rearmed(t: Topo) {
    let p = prefix("rt");
    let r = t.client().await;
    let hung = Record {
        hang: true,
        ..Record::default()
    };
    let source = queue(Duration::from_secs(60)).recovery_ttl(Duration::from_secs(600));
    let running = app(&t, &p, source, hung.clone()).start().await.unwrap();
    let _: i64 = r
        .lpush(format!("{p}{{jobs}}"), vec![r#"{"n":5}"#, r#"{"n":5}"#])
        .await
        .unwrap();
    wait_until("both claimed", Duration::from_secs(5), || async {
        hung.seen().len() == 2
    })
    .await;
    let zset = format!("{p}{{jobs}}.claims");
    let z: i64 = r.zcard(&zset).await.unwrap();
    assert_eq!(z, 2, "two claims of identical bytes are two members");
    let ttl: i64 = r.pttl(&zset).await.unwrap();
    assert!(
        (590_000..=600_000).contains(&ttl),
        "recovery_ttl armed: {ttl}"
    );
    running.shutdown().await.unwrap();
}

async fn misconfigured_recovery_does_not_start(t: Topo) {
    let p = prefix("rt");
    let no_idle = RedisList::new("{jobs}")
        .reliable()
        .recovery_zset("{jobs}.claims");
    let e = app(&t, &p, no_idle, Record::default())
        .start()
        .await
        .err()
        .expect("must not start")
        .to_string();
    assert!(e.contains("{jobs}") && e.contains("min_idle"), "{e}");
    let short_ttl = queue(Duration::from_secs(60)).recovery_ttl(Duration::from_secs(30));
    let e = app(&t, &p, short_ttl, Record::default())
        .start()
        .await
        .err()
        .expect("must not start")
        .to_string();
    assert!(
        e.contains("recovery_ttl") && e.contains("longer than min_idle"),
        "{e}"
    );
}
