//! The fault tests' worker processes (this binary run again with one `#[ignore]`d test selected):
//! a worker of the fault queue whose handler records each job, one whose settles get stuck, and
//! what the tests spawn, publish and read with them.

use crate::harness;

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fred::prelude::*;
use harness::process::{WorkerProcess, serve_until_sigterm, test_name, worker_runtime};
use harness::unique;
use ruststream::prelude::*;

use super::{Job, QUEUE, queue};

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
pub(super) const STUCK_TIMEOUT: Duration = Duration::from_millis(500);

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
pub(super) fn spawn_worker(
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

pub(super) fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique(tag));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(super) async fn publish_jobs(url: &str, prefix: &str, jobs: std::ops::Range<u32>) {
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
pub(super) async fn forget_run(client: &Client, prefix: &str, dir: &Path) {
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
pub(super) async fn handled_counts(client: &Client, prefix: &str) -> (u64, u64) {
    let counts: HashMap<String, u64> = client
        .hgetall(format!("{prefix}{QUEUE}.handled"))
        .await
        .unwrap_or_default();
    (counts.len() as u64, counts.values().sum())
}
