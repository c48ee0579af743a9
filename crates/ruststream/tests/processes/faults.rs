//! Fault tests with real processes and real signals (issue 6, design.md §6):
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
//! The worker processes are this test binary run again: `processes faults::fault_worker_process
//! --exact --ignored`, with the worker's settings in `RUSTSTREAM_FAULT_*` variables. Integration
//! tests get no `CARGO_BIN_EXE_` for examples, and running `cargo build` from a test would wait on
//! the lock of the `cargo test` that runs it; re-running the binary needs neither. Without
//! `RUSTSTREAM_FAULT_WORKER`, `fault_worker_process` returns at once.
//!
//! Every wait is bounded; each test prints its counts.

use crate::harness;

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::prelude::*;
use harness::process::{WorkerProcess, serve_until_sigterm, test_name, worker_runtime};
use harness::stand::{OwnRedis, Stand, kill9, node_client, server_pid};
use harness::{Env, bounded, on, unique, wait_until};
use ruststream::prelude::*;
use ruststream::redis::frame::Frame;

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
// The worker process.

/// The worker: a reliable list on `RUSTSTREAM_FAULT_URL` (capped at `RUSTSTREAM_FAULT_CAP`
/// when set) whose handler works 1..=`WORK_MS` ms,
/// recording `HSET <prefix>{faults}.owner n pid` when it starts and `HINCRBY
/// <prefix>{faults}.handled n 1` when it is done (a failed record retries the job). Stops on
/// SIGTERM.
#[test]
#[ignore = "the worker process of the fault tests, which run it; does nothing on its own"]
fn fault_worker_process() {
    let Ok(url) = std::env::var("RUSTSTREAM_FAULT_WORKER") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let prefix = var("RUSTSTREAM_FAULT_PREFIX");
    let min_idle = Duration::from_millis(var("RUSTSTREAM_FAULT_MIN_IDLE_MS").parse().unwrap());
    let concurrency: usize = var("RUSTSTREAM_FAULT_CONCURRENCY").parse().unwrap();
    let work_ms: u64 = var("RUSTSTREAM_FAULT_WORK_MS").parse().unwrap();
    let mut list = queue(min_idle, concurrency);
    if let Ok(cap) = var("RUSTSTREAM_FAULT_CAP").parse() {
        list = list.max_in_flight(cap);
    }
    if let Ok(ms) = var("RUSTSTREAM_FAULT_GRACE_MS").parse() {
        list = list.cancel_grace(Duration::from_millis(ms));
    }
    let fixed = !var("RUSTSTREAM_FAULT_FIXED_WORK").is_empty();
    let rt = worker_runtime();
    rt.block_on(async move {
        let mut config = Config::from_url(&url).unwrap();
        config.fail_fast = false;
        let raw = Builder::from_config(config)
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 2_000, 2))
            .build()
            .unwrap();
        raw.init().await.unwrap();
        let handler = Recorder {
            client: raw,
            owner: format!("{prefix}{QUEUE}.owner"),
            handled: format!("{prefix}{QUEUE}.handled"),
            pid: std::process::id().to_string(),
            work_ms,
            fixed,
        };
        serve_until_sigterm(
            RustStream::new(AppInfo::new("fault-worker", "0"))
                .shutdown_timeout(Duration::from_secs(2))
                .with_broker(RedisBroker::standalone(url).prefix(&prefix), |b| {
                    b.include(subscriber(list, handler).build());
                }),
        )
        .await;
    });
}

struct Recorder {
    client: Client,
    owner: String,
    handled: String,
    pid: String,
    work_ms: u64,
    /// Each job takes `work_ms` exactly (else up to it, at random).
    fixed: bool,
}

impl Handle<Job> for Recorder {
    fn handle(
        &self,
        job: &Job,
        _: &(),
        _: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        let n = job.n.to_string();
        let work = Duration::from_millis(if self.fixed {
            self.work_ms
        } else {
            fastrand::u64(1..=self.work_ms)
        });
        async move {
            let started: Result<i64, _> = self
                .client
                .hset(&self.owner, (n.as_str(), self.pid.as_str()))
                .await;
            tokio::time::sleep(work).await;
            let done: Result<i64, _> = self.client.hincrby(&self.handled, n.as_str(), 1).await;
            match (started, done) {
                (_, Ok(_)) => Ok(()),
                (_, Err(e)) => {
                    tracing::warn!(error = %e, "could not record the job; retrying it");
                    Err(HandlerOutcome::retry())
                }
            }
        }
    }
}

/// The shutdown timeout of `stuck_settle_worker_process`.
const STUCK_TIMEOUT: Duration = Duration::from_millis(500);

/// The worker of `sigterm_with_a_settle_that_keeps_failing_exits_in_time`: the fault tests'
/// queue on `RUSTSTREAM_STUCK_WORKER` under `RUSTSTREAM_STUCK_PREFIX`, whose handler drops every
/// job, with a [`STUCK_TIMEOUT`] shutdown timeout. Stops on SIGTERM.
#[test]
#[ignore = "the worker process of a fault test, which runs it; does nothing on its own"]
fn stuck_settle_worker_process() {
    let Ok(url) = std::env::var("RUSTSTREAM_STUCK_WORKER") else {
        return;
    };
    let prefix = std::env::var("RUSTSTREAM_STUCK_PREFIX").unwrap_or_default();
    let rt = worker_runtime();
    rt.block_on(serve_until_sigterm(
        RustStream::new(AppInfo::new("stuck-worker", "0"))
            .shutdown_timeout(STUCK_TIMEOUT)
            .with_broker(RedisBroker::standalone(url).prefix(&prefix), |b| {
                b.include(subscriber(queue(Duration::from_secs(30), 1), Dropper).build());
            }),
    ));
}

/// Drops every job.
struct Dropper;

impl Handle<Job> for Dropper {
    async fn handle(&self, _: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        Err(HandlerOutcome::drop())
    }
}

/// A worker process of `fault_worker_process`, its log in `log_dir`.
fn spawn_worker(
    url: &str,
    prefix: &str,
    log_dir: &Path,
    min_idle_ms: u64,
    concurrency: usize,
    work_ms: u64,
    cap: Option<u32>,
) -> WorkerProcess {
    static N: AtomicU64 = AtomicU64::new(0);
    let log = log_dir.join(format!("worker-{}.log", N.fetch_add(1, Ordering::Relaxed)));
    let mut env = vec![
        ("RUSTSTREAM_FAULT_WORKER", url.to_owned()),
        ("RUSTSTREAM_FAULT_PREFIX", prefix.to_owned()),
        ("RUSTSTREAM_FAULT_MIN_IDLE_MS", min_idle_ms.to_string()),
        ("RUSTSTREAM_FAULT_CONCURRENCY", concurrency.to_string()),
        ("RUSTSTREAM_FAULT_WORK_MS", work_ms.to_string()),
    ];
    env.extend(cap.map(|c| ("RUSTSTREAM_FAULT_CAP", c.to_string())));
    WorkerProcess::spawn(
        &test_name(module_path!(), "fault_worker_process"),
        &env,
        Some(log),
    )
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique(tag));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn publish_jobs(url: &str, prefix: &str, jobs: std::ops::Range<u32>) {
    let broker = RedisBroker::standalone(url).prefix(prefix);
    broker.connect().await.unwrap();
    let jobs: Vec<Job> = jobs.map(|n| Job { n }).collect();
    for chunk in jobs.chunks(500) {
        broker
            .publisher()
            .messages(chunk)
            .to(QUEUE)
            .publish()
            .await
            .unwrap();
    }
}

/// Deletes the workers' records and their log directory `dir`.
async fn forget_run(client: &Client, prefix: &str, dir: &Path) {
    let _: i64 = client
        .del(vec![
            format!("{prefix}{QUEUE}.handled"),
            format!("{prefix}{QUEUE}.owner"),
        ])
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// `(distinct jobs handled, handler completions)` from the workers' records.
async fn handled_counts(client: &Client, prefix: &str) -> (u64, u64) {
    let counts: HashMap<String, u64> = client
        .hgetall(format!("{prefix}{QUEUE}.handled"))
        .await
        .unwrap_or_default();
    (counts.len() as u64, counts.values().sum())
}

// ---------------------------------------------------------------------------------------------
// SIGTERM with a settle that keeps failing.

// Before: the drop's settle (its dead-letter key a string: WRONGTYPE) was retried for over a
// minute, and the process did not exit on SIGTERM until then.
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
        &test_name(module_path!(), "stuck_settle_worker_process"),
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
                &test_name(module_path!(), "fault_worker_process"),
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

// ---------------------------------------------------------------------------------------------
// Failovers: a publisher and a consumer in this process carry on while the server under the
// queue is killed and its replica promoted.

/// Counts handled jobs in memory (the servers are what fails here).
#[derive(Clone, Default)]
struct Tally(Arc<Mutex<HashMap<u32, u32>>>);

impl Tally {
    fn distinct(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

impl Handle<Job> for Tally {
    fn handle(
        &self,
        job: &Job,
        _: &(),
        _: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        *self.0.lock().unwrap().entry(job.n).or_default() += 1;
        std::future::ready(Ok(()))
    }
}

/// What the publisher task saw: per job, when its publish was acknowledged; and its errors.
#[derive(Default)]
struct Published {
    acked: Vec<(u32, Instant)>,
    errors: usize,
}

/// Runs a consumer app and a publisher of `jobs` on `broker()`, calls `fail` once a third is
/// published (it kills the server and returns once a replica is promoted), and checks that
/// every job acknowledged after the promotion, and all but the last moments' before the kill,
/// were handled.
async fn failover_run<F, Fut>(what: &str, broker: impl Fn() -> RedisBroker, jobs: u32, fail: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let started = Instant::now();
    let tally = Tally::default();
    let running = bounded(
        "start",
        Duration::from_secs(15),
        RustStream::new(AppInfo::new("failover", "0"))
            .shutdown_timeout(Duration::from_secs(2))
            .with_broker(broker(), |b| {
                b.include(subscriber(queue(Duration::from_secs(1), 16), tally.clone()).build());
            })
            .start(),
    )
    .await
    .expect("the consumer starts");
    let publishing = broker();
    publishing.connect().await.unwrap();
    let published = Arc::new(Mutex::new(Published::default()));
    let publisher = {
        let published = published.clone();
        tokio::spawn(async move {
            let publisher = publishing.publisher();
            for n in 0..jobs {
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let sent = publisher.message(&Job { n }).to(QUEUE).publish().await;
                    let acked = {
                        let mut p = published.lock().unwrap();
                        match sent {
                            Ok(_) => {
                                p.acked.push((n, Instant::now()));
                                true
                            }
                            Err(_) if Instant::now() < deadline => {
                                p.errors += 1;
                                false
                            }
                            Err(e) => panic!("publish of {n} kept failing for 60 s: {e}"),
                        }
                    };
                    if acked {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // A steady trickle, so the failover happens mid-stream.
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };
    wait_until(
        "a third published and handled",
        Duration::from_secs(30),
        || async { tally.distinct() >= jobs as usize / 3 },
    )
    .await;
    let killed_at = Instant::now();
    fail().await;
    let promoted_at = Instant::now();
    bounded(
        "the publisher finishes",
        Duration::from_secs(120),
        publisher,
    )
    .await
    .expect("the publisher task");
    let acked: Vec<(u32, Instant)> = published.lock().unwrap().acked.clone();
    let must_arrive: Vec<u32> = acked
        .iter()
        .filter(|(_, at)| *at >= promoted_at || *at + Duration::from_secs(1) < killed_at)
        .map(|(n, _)| *n)
        .collect();
    let all_there = || {
        let t = tally.0.lock().unwrap();
        must_arrive.iter().all(|n| t.contains_key(n))
    };
    let done = tokio::time::timeout(Duration::from_secs(60), async {
        while !all_there() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    running.shutdown().await.unwrap();
    let t = tally.0.lock().unwrap().clone();
    let lost_window = acked.iter().filter(|(n, _)| !t.contains_key(n)).count();
    let duplicates: u32 = t.values().map(|c| c - 1).sum();
    println!(
        "{what}: published={} handled={} duplicates={duplicates} lost={} publish-errors={} failover={:?} ({:?})",
        acked.len(),
        t.len(),
        lost_window,
        published.lock().unwrap().errors,
        promoted_at - killed_at,
        started.elapsed()
    );
    assert!(
        done.is_ok(),
        "{what}: jobs acknowledged outside the failover window were lost"
    );
    assert_eq!(acked.len(), jobs as usize, "the publisher carried on");
}

/// `CLUSTER NODES` of a node: `(id, port, flags, master id, slot ranges)` per node.
async fn cluster_nodes(c: &Client) -> Vec<(String, u16, String, String, Vec<(u16, u16)>)> {
    let text: String = c
        .custom(fred::cmd!("CLUSTER"), vec!["NODES"])
        .await
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = f
                .get(1)?
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let slots = f
                .iter()
                .skip(8)
                .filter_map(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
                .collect();
            Some((
                f[0].to_owned(),
                port,
                f[2].to_owned(),
                f[3].to_owned(),
                slots,
            ))
        })
        .collect()
}

#[tokio::test]
async fn a_cluster_master_dies_and_its_replica_takes_over() {
    let stand = Stand::start("stand_cluster --cluster-node-timeout 1000");
    let urls = stand.cluster_urls();
    let prefix = format!("{}:", unique("cfail"));
    let slot = fred::util::redis_keyslot(format!("{prefix}{QUEUE}").as_bytes());
    let ports: Vec<String> = urls
        .iter()
        .map(|u| u.rsplit(':').next().unwrap().to_owned())
        .collect();
    let fail = || async {
        let any = node_client(&format!("127.0.0.1:{}", ports[0])).await;
        let nodes = cluster_nodes(&any).await;
        let (master_id, master_port) = nodes
            .iter()
            .find(|n| n.2.contains("master") && n.4.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .map(|n| (n.0.clone(), n.1))
            .expect("a master serves the queue's slot");
        let victim = node_client(&format!("127.0.0.1:{master_port}")).await;
        kill9(server_pid(&victim).await);
        let survivor = ports
            .iter()
            .find(|p| **p != master_port.to_string())
            .unwrap();
        let watcher = node_client(&format!("127.0.0.1:{survivor}")).await;
        wait_until(
            "a replica of the dead master is promoted",
            Duration::from_secs(30),
            || async {
                cluster_nodes(&watcher).await.iter().any(|n| {
                    n.1 != master_port
                        && n.2.contains("master")
                        && !n.2.contains("fail")
                        && n.4.iter().any(|(a, b)| (*a..=*b).contains(&slot))
                })
            },
        )
        .await;
        println!("cluster: master {master_id} (port {master_port}) killed, replica promoted");
    };
    failover_run(
        "cluster",
        || RedisBroker::cluster(urls.clone()).prefix(&prefix),
        1500,
        fail,
    )
    .await;
    drop(stand);
}

#[tokio::test]
async fn a_sentinel_primary_dies_and_the_app_follows_the_promoted_replica() {
    let stand = Stand::start("stand_sentinel rsfault");
    let service = stand.var("RUSTSTREAM_SENTINEL_SERVICE");
    let hosts: Vec<String> = stand
        .var("RUSTSTREAM_SENTINEL_HOSTS")
        .split(',')
        .map(str::to_owned)
        .collect();
    let prefix = format!("{}:", unique("sfail"));
    let primary = |sentinel: Client, service: String| async move {
        let addr: Vec<String> = sentinel
            .custom(
                fred::cmd!("SENTINEL"),
                vec!["get-master-addr-by-name", service.as_str()],
            )
            .await
            .unwrap_or_default();
        addr.get(1).cloned().unwrap_or_default()
    };
    let fail = || async {
        let sentinel = node_client(&hosts[0]).await;
        let old = primary(sentinel.clone(), service.clone()).await;
        let victim = node_client(&format!("127.0.0.1:{old}")).await;
        kill9(server_pid(&victim).await);
        wait_until(
            "the sentinels promote the replica",
            Duration::from_secs(30),
            || async {
                let now = primary(sentinel.clone(), service.clone()).await;
                !now.is_empty() && now != old
            },
        )
        .await;
        println!(
            "sentinel: primary on port {old} killed, replica on port {} promoted",
            primary(sentinel.clone(), service.clone()).await
        );
    };
    failover_run(
        "sentinel",
        || RedisBroker::sentinel(service.clone(), hosts.clone()).prefix(&prefix),
        1500,
        fail,
    )
    .await;
    drop(stand);
}
