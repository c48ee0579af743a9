//! Fault tests with real processes and real signals:
//!
//! - workers killed with SIGKILL mid-handler and restarted: every job handled at least once,
//!   nothing left behind, duplicates bounded by what was in flight at the kills;
//! - a worker killed with SIGKILL while it holds all of a queue's concurrency cap: the other
//!   workers take nothing until its claims are swept back, then the cap frees;
//! - cancels sent from the test's process to messages running in two worker processes and
//!   queued behind them: each running one is signalled and dropped after the grace, each queued
//!   one dropped at its claim, every cancel resent (as after a lost reply) answers the same,
//!   and none of them completes;
//! - the Redis server killed and restarted (its own, with `--appendonly yes --appendfsync
//!   always`): workers log the outage, reconnect, finish, and nothing acknowledged is lost;
//! - a cluster master killed and its replica promoted (a cluster of the test's own);
//! - a Sentinel-managed primary killed and its replica promoted (a sentinel set of its own).
//!
//! The worker processes (`worker.rs`) are this test binary run again: `processes
//! faults::worker::fault_worker_process --exact --ignored`, with the worker's settings in
//! `RUSTSTREAM_FAULT_*` variables. Integration
//! tests get no `CARGO_BIN_EXE_` for examples, and running `cargo build` from a test would wait on
//! the lock of the `cargo test` that runs it; re-running the binary needs neither. Without
//! `RUSTSTREAM_FAULT_WORKER`, `fault_worker_process` returns at once.
//!
//! Every wait is bounded; each test prints its counts. The failover tests are `failover.rs`.

mod failover;
mod worker;

use crate::harness;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fred::prelude::*;
use harness::process::{WorkerProcess, test_name};
use harness::stand::{OwnRedis, node_client};
use harness::{Env, on, wait_until};
use ruststream::prelude::*;
use ruststream::redis::frame::Frame;

use self::worker::{
    STUCK_TIMEOUT, forget_run, handled_counts, publish_jobs, spawn_worker, temp_dir,
};

// On the shared standalone server, under a prefix of its own; the other fault tests start
// servers of their own.
on!(
    [standalone]
    workers_killed_mid_handler_lose_nothing,
    sigterm_with_a_settle_that_keeps_failing_exits_in_time,
    a_worker_killed_holding_the_cap_frees_it_when_swept,
    cancels_from_one_process_reach_the_handlers_of_two_others,
);

/// The queue every fault test uses (hash-tagged: it runs on a cluster too).
const QUEUE: &str = "{faults}";

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Job {
    n: u32,
}
outgoing!(Job);

fn queue(min_idle: Duration, concurrency: usize) -> RedisList {
    RedisList::new(QUEUE)
        .reliable()
        .min_idle(min_idle)
        .recovery_zset("{faults}.claims")
        .concurrency(concurrency)
        .block(Duration::from_millis(500))
}

/// The keys a finished run must have left empty (prefixed).
fn leftover_keys(prefix: &str) -> Vec<String> {
    [
        "",
        ".processing",
        ".claims",
        ".delayed",
        ".delayed.payloads",
        ".dead",
    ]
    .iter()
    .map(|s| format!("{prefix}{QUEUE}{s}"))
    .collect()
}

async fn leftovers(client: &Client, prefix: &str) -> i64 {
    let mut n = 0;
    for k in leftover_keys(prefix) {
        let e: i64 = client.exists(&k).await.unwrap_or(1);
        n += e;
    }
    n
}

// ---------------------------------------------------------------------------------------------
// SIGTERM with a settle that keeps failing.

// The fault: a drop's settle that keeps failing (its dead-letter key a string: WRONGTYPE) is
// retried for over a minute; the process must exit on SIGTERM within the shutdown timeout.
async fn sigterm_with_a_settle_that_keeps_failing_exits_in_time(env: &Env) {
    let url = env.url().expect("the standalone server").to_owned();
    let prefix = env.prefix.clone();
    let () = env
        .client
        .set(
            format!("{prefix}{QUEUE}.dead"),
            "not a list",
            None,
            None,
            false,
        )
        .await
        .unwrap();
    let log = temp_dir("stuck").join("worker.log");
    let worker = WorkerProcess::spawn(
        &test_name(module_path!(), "worker::stuck_settle_worker_process"),
        &[
            ("RUSTSTREAM_STUCK_WORKER", url.clone()),
            ("RUSTSTREAM_STUCK_PREFIX", prefix.clone()),
        ],
        Some(log.clone()),
    );
    worker.ready(Duration::from_secs(20)).await;
    publish_jobs(&url, &prefix, 0..1).await;
    wait_until("the settle is refused", Duration::from_secs(10), || async {
        worker.log().contains("settle failed")
    })
    .await;
    let stopped = Instant::now();
    worker.stop(STUCK_TIMEOUT + Duration::from_secs(1)).await;
    println!("SIGTERM to exit: {:?}", stopped.elapsed());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("1 settles abandoned at shutdown") && text.contains("worker stopped"),
        "{text}"
    );
    let processing: i64 = env
        .client
        .llen(format!("{prefix}{QUEUE}.processing"))
        .await
        .unwrap();
    assert_eq!(processing, 1, "the entry stays claimed");
}

// ---------------------------------------------------------------------------------------------
// Workers killed mid-handler.

async fn workers_killed_mid_handler_lose_nothing(env: &Env) {
    const JOBS: u32 = 2000;
    const KILLS: usize = 5;
    const CONCURRENCY: usize = 4;
    let started = Instant::now();
    let url = env.url().expect("the standalone server").to_owned();
    let prefix = env.prefix.clone();
    let dir = temp_dir("kills");
    let r = env.client.clone();
    publish_jobs(&url, &prefix, 0..JOBS).await;
    let spawn = || spawn_worker(&url, &prefix, &dir, 1000, CONCURRENCY, 40, None);
    let mut workers: Vec<WorkerProcess> = (0..3).map(|_| spawn()).collect();
    for w in &workers {
        w.ready(Duration::from_secs(20)).await;
    }
    let mut in_flight_at_kills = Vec::new();
    for kill in 0..KILLS {
        // Spread the kills over the run.
        let at = u64::from(JOBS) * (kill as u64 + 1) / (KILLS as u64 + 2);
        wait_until(
            "progress before the next kill",
            Duration::from_secs(60),
            || async { handled_counts(&r, &prefix).await.0 >= at },
        )
        .await;
        let victim = fastrand::usize(..workers.len());
        let pid = workers[victim].pid();
        workers[victim].kill();
        // What the dead worker had claimed and started: its entries still in the processing
        // list whose last handler start was in it. Nothing of it moves until min_idle (1 s).
        let (claimed, owners): (Vec<fred::bytes::Bytes>, HashMap<String, String>) = {
            let tx = r.multi();
            let _: () = tx
                .lrange(format!("{prefix}{QUEUE}.processing"), 0, -1)
                .await
                .unwrap();
            let _: () = tx.hgetall(format!("{prefix}{QUEUE}.owner")).await.unwrap();
            tx.exec(true).await.unwrap()
        };
        let in_flight = claimed
            .into_iter()
            .filter_map(|raw| serde_json::from_slice::<Job>(&Frame::decode(raw).payload).ok())
            .filter(|j| owners.get(&j.n.to_string()) == Some(&pid.to_string()))
            .count();
        println!(
            "kill {}: worker pid {pid} had {in_flight} jobs in flight",
            kill + 1
        );
        in_flight_at_kills.push(in_flight);
        workers[victim] = spawn();
        workers[victim].ready(Duration::from_secs(20)).await;
    }
    wait_until(
        "every job handled and nothing left",
        Duration::from_secs(90),
        || async {
            handled_counts(&r, &prefix).await.0 == u64::from(JOBS)
                && leftovers(&r, &prefix).await == 0
        },
    )
    .await;
    for w in workers {
        w.stop(Duration::from_secs(15)).await;
    }
    let (handled, completions) = handled_counts(&r, &prefix).await;
    let duplicates = completions - handled;
    let in_flight: usize = in_flight_at_kills.iter().sum();
    let lost = u64::from(JOBS) - handled;
    println!(
        "handled={handled} duplicates={duplicates} lost={lost} (in flight at the {KILLS} kills: {in_flight_at_kills:?}; {:?})",
        started.elapsed()
    );
    assert_eq!(lost, 0);
    assert!(
        duplicates <= in_flight as u64,
        "{duplicates} duplicates, but only {in_flight} jobs were in flight at the kills"
    );
    assert!(in_flight > 0, "no kill hit a worker mid-handler");
    assert_eq!(
        leftovers(&r, &prefix).await,
        0,
        "a list or set is not empty"
    );
    forget_run(&r, &prefix, &dir).await;
}

// ---------------------------------------------------------------------------------------------
// A worker killed holding the whole concurrency cap.

async fn a_worker_killed_holding_the_cap_frees_it_when_swept(env: &Env) {
    const JOBS: u32 = 6;
    const CAP: u32 = 2;
    let url = env.url().expect("the standalone server").to_owned();
    let prefix = env.prefix.clone();
    let dir = temp_dir("cap");
    let r = env.client.clone();
    let processing = format!("{prefix}{QUEUE}.processing");
    let in_flight = async || -> i64 { r.llen(&processing).await.unwrap_or(-1) };
    // Long jobs (up to 3 s), 4 permits a worker, the queue capped at 2; min_idle 3 s.
    let spawn = || spawn_worker(&url, &prefix, &dir, 3000, 4, 3000, Some(CAP));
    let mut victim = spawn();
    victim.ready(Duration::from_secs(20)).await;
    publish_jobs(&url, &prefix, 0..JOBS).await;
    wait_until(
        "the victim holds the cap",
        Duration::from_secs(10),
        async || in_flight().await == i64::from(CAP),
    )
    .await;
    victim.kill();
    let held = in_flight().await;
    let done_at_kill = handled_counts(&r, &prefix).await.1;
    println!("killed holding {held} of the cap's {CAP}; {done_at_kill} handled before");
    let others: Vec<WorkerProcess> = (0..2).map(|_| spawn()).collect();
    for w in &others {
        w.ready(Duration::from_secs(20)).await;
    }
    if held == i64::from(CAP) {
        // The dead claims fill the cap: until they are swept (3 s after their last lease,
        // at most 1 s before the kill), the others start nothing.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let owners: HashMap<String, String> =
            r.hgetall(format!("{prefix}{QUEUE}.owner")).await.unwrap();
        let pids: Vec<String> = others.iter().map(|w| w.pid().to_string()).collect();
        assert!(
            !owners.values().any(|p| pids.contains(p)),
            "a worker started a job while a dead worker's claims filled the cap"
        );
    }
    let mut peak = 0;
    wait_until(
        "every job handled and nothing left",
        Duration::from_secs(60),
        async || {
            peak = peak.max(in_flight().await);
            handled_counts(&r, &prefix).await.0 == u64::from(JOBS)
                && leftovers(&r, &prefix).await == 0
        },
    )
    .await;
    let logs: String = others.iter().map(WorkerProcess::log).collect();
    for w in others {
        w.stop(Duration::from_secs(15)).await;
    }
    assert!(
        peak <= i64::from(CAP),
        "{peak} in flight under a cap of {CAP}"
    );
    assert!(
        logs.contains("claims idle longer than min_idle went back to the queue"),
        "the dead worker's claims were swept back: {logs}"
    );
    forget_run(&r, &prefix, &dir).await;
}

/// Two worker processes (2 permits each, jobs of a minute, a 300 ms cancel grace) run 4 jobs;
/// 2 more wait in the queue. The test's process cancels all 6, each twice (the second as a
/// call resent after its reply was lost): the 4 running are signalled in whichever process runs
/// them and dropped after the grace, the 2 queued are marked and dropped at their claim. None
/// completes, nothing is left queued, claimed or dead, and each answer was given twice.
async fn cancels_from_one_process_reach_the_handlers_of_two_others(env: &Env) {
    let url = env.url().expect("the standalone server").to_owned();
    let prefix = env.prefix.clone();
    let dir = temp_dir("cancel");
    let r = env.client.clone();
    let workers: Vec<WorkerProcess> = (0..2)
        .map(|i| {
            let env = [
                ("RUSTSTREAM_FAULT_WORKER", url.clone()),
                ("RUSTSTREAM_FAULT_PREFIX", prefix.clone()),
                ("RUSTSTREAM_FAULT_MIN_IDLE_MS", "30000".to_owned()),
                ("RUSTSTREAM_FAULT_CONCURRENCY", "2".to_owned()),
                ("RUSTSTREAM_FAULT_WORK_MS", "60000".to_owned()),
                ("RUSTSTREAM_FAULT_FIXED_WORK", "1".to_owned()),
                ("RUSTSTREAM_FAULT_GRACE_MS", "300".to_owned()),
            ];
            let log = dir.join(format!("worker-{i}.log"));
            WorkerProcess::spawn(
                &test_name(module_path!(), "worker::fault_worker_process"),
                &env,
                Some(log),
            )
        })
        .collect();
    for w in &workers {
        w.ready(Duration::from_secs(20)).await;
    }
    publish_jobs(&url, &prefix, 0..4).await;
    let processing = format!("{prefix}{QUEUE}.processing");
    wait_until("4 running", Duration::from_secs(10), async || {
        r.hlen::<i64, _>(format!("{prefix}{QUEUE}.owner"))
            .await
            .unwrap_or(0)
            == 4
    })
    .await;
    publish_jobs(&url, &prefix, 4..6).await;
    let ids = |key: String| {
        let r = r.clone();
        async move {
            let values: Vec<bytes::Bytes> = r.lrange(key, 0, -1).await.unwrap();
            values
                .into_iter()
                .map(|v| Frame::decode(v).id)
                .collect::<Vec<_>>()
        }
    };
    let running = ids(processing.clone()).await;
    let queued = ids(format!("{prefix}{QUEUE}")).await;
    assert_eq!((running.len(), queued.len()), (4, 2));
    let owners: HashMap<String, String> =
        r.hgetall(format!("{prefix}{QUEUE}.owner")).await.unwrap();
    let pids: std::collections::HashSet<&String> = owners.values().collect();
    assert_eq!(pids.len(), 2, "both processes run jobs: {owners:?}");

    let canceller = RedisBroker::standalone(url.clone()).prefix(&prefix);
    canceller.connect().await.unwrap();
    let publisher = canceller.publisher();
    for (ids, expected) in [
        (&running, ruststream::CancelOutcome::Signalled),
        (&queued, ruststream::CancelOutcome::Marked),
    ] {
        for id in ids {
            for _ in 0..2 {
                let got = publisher.cancel(QUEUE, id).await.unwrap();
                assert_eq!(got, expected, "cancel of {id}");
            }
        }
    }
    wait_until("nothing left", Duration::from_secs(20), async || {
        leftovers(&r, &prefix).await == 0
    })
    .await;
    // Past a claim of the queued two: nothing else ran.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let owners: HashMap<String, String> =
        r.hgetall(format!("{prefix}{QUEUE}.owner")).await.unwrap();
    let logs: String = workers.iter().map(WorkerProcess::log).collect();
    for w in workers {
        w.stop(Duration::from_secs(15)).await;
    }
    assert_eq!(handled_counts(&r, &prefix).await, (0, 0), "none completed");
    assert_eq!(owners.len(), 4, "the queued two never started: {owners:?}");
    assert_eq!(
        logs.matches("cancelled handler still running after its grace: dropped")
            .count(),
        4,
        "{logs}"
    );
    let _: i64 = r.del(format!("{prefix}{QUEUE}.cancels")).await.unwrap_or(0);
    forget_run(&r, &prefix, &dir).await;
}

// ---------------------------------------------------------------------------------------------
// The Redis server restarted.

#[tokio::test]
async fn workers_ride_out_a_redis_restart() {
    const JOBS: u32 = 1000;
    let started = Instant::now();
    let dir = temp_dir("restart");
    let port = OwnRedis::free_port();
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let mut redis = OwnRedis::start(dir.join("data"), port).await;
    let url = redis.url();
    let prefix = "restart:".to_owned();
    publish_jobs(&url, &prefix, 0..JOBS).await;
    let logs = temp_dir("restart-logs");
    let workers: Vec<WorkerProcess> = (0..2)
        .map(|_| spawn_worker(&url, &prefix, &logs, 2000, 4, 30, None))
        .collect();
    for w in &workers {
        w.ready(Duration::from_secs(20)).await;
    }
    let before = {
        let r = node_client(&url).await;
        wait_until(
            "some progress before the stop",
            Duration::from_secs(30),
            || async { handled_counts(&r, &prefix).await.0 >= 150 },
        )
        .await;
        let n = handled_counts(&r, &prefix).await.0;
        let _ = r.quit().await;
        n
    };
    let stopped_at = Instant::now();
    redis.kill(); // SIGKILL: only what appendfsync always wrote survives.
    wait_until(
        "the workers log the outage",
        Duration::from_secs(20),
        || async {
            workers.iter().all(|w| {
                let log = w.log();
                log.contains("redis connection lost")
            })
        },
    )
    .await;
    let redis = OwnRedis::start(redis.dir.clone(), port).await;
    let outage = stopped_at.elapsed();
    let r = node_client(&url).await;
    wait_until(
        "every job handled after the restart",
        Duration::from_secs(90),
        || async {
            handled_counts(&r, &prefix).await.0 == u64::from(JOBS)
                && leftovers(&r, &prefix).await == 0
        },
    )
    .await;
    let logged: Vec<String> = workers.iter().map(WorkerProcess::log).collect();
    for w in workers {
        w.stop(Duration::from_secs(15)).await;
    }
    let (handled, completions) = handled_counts(&r, &prefix).await;
    println!(
        "handled={handled} duplicates={} lost={} (handled before the stop: {before}; outage {outage:?}; {:?})",
        completions - handled,
        u64::from(JOBS) - handled,
        started.elapsed()
    );
    assert_eq!(
        handled,
        u64::from(JOBS),
        "jobs published before the stop were lost"
    );
    for log in &logged {
        assert!(log.contains("redis connection lost"), "{log}");
        assert!(log.contains("redis connection back"), "{log}");
    }
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&logs);
}
