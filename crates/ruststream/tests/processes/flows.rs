//! Flows across worker processes (issue 23 point 2): three worker processes handle the children
//! and parents of many flows; one is SIGKILLed while children run, a new one takes its place,
//! and every parent still runs exactly once, after all its children, reading every child acked.
//! The killed worker's claims come back after `min_idle`; a child it had reported but not
//! settled runs again, and its second report changes nothing.
//!
//! The worker is `flow_worker_process` (this binary run again, `harness::process`): without
//! `RUSTSTREAM_FLOW_WORKER` it returns at once.

use crate::harness;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fred::prelude::*;
use harness::process::{WorkerProcess, serve_until_sigterm, test_name};
use harness::{Env, WAIT, on, unique, wait_until};
use ruststream::prelude::*;

on!([standalone] a_worker_killed_mid_flow_leaves_every_parent_run_once);

/// The children's queue and the parents'.
const PARTS: &str = "{fparts}";
const REPORTS: &str = "{freports}";
/// How long a child's handler works.
const WORK_MS: u64 = 150;
const MIN_IDLE: Duration = Duration::from_millis(600);

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Part {
    n: u32,
}
outgoing!(Part);

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Report {
    flow: u32,
}
outgoing!(Report);

fn list(key: &str) -> RedisList {
    RedisList::new(key)
        .reliable()
        .min_idle(MIN_IDLE)
        .concurrency(4)
        .retry(Backoff::fixed(Duration::from_millis(50)))
}

/// Records its runs in Redis: a child `HINCRBY <prefix>{fparts}.runs <id> 1` and sets `n` as
/// its result; a parent `HINCRBY <prefix>{freports}.runs <id> 1` and `HSET
/// <prefix>{freports}.sum <id> <sum of its children's results>`.
#[derive(Clone)]
struct Recorder {
    client: Client,
    prefix: String,
}

/// The children's handler.
struct Parts(Recorder);

/// The parents' handler.
struct Reports(Recorder);

impl Handle<Part> for Parts {
    async fn handle(&self, p: &Part, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        tokio::time::sleep(Duration::from_millis(WORK_MS)).await;
        ctx.set_result(&p.n)
            .await
            .map_err(|_| HandlerOutcome::retry())?;
        let runs = format!("{}{PARTS}.runs", self.0.prefix);
        let _: i64 = self
            .0
            .client
            .hincrby(runs, ctx.message_id(), 1)
            .await
            .map_err(|_| HandlerOutcome::retry())?;
        Ok(())
    }
}

impl Handle<Report> for Reports {
    async fn handle(
        &self,
        _: &Report,
        _: &(),
        ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        let children = ctx.children().await.map_err(|_| HandlerOutcome::retry())?;
        let sum: u32 = children
            .iter()
            .filter(|c| c.outcome == ChildOutcome::Acked)
            .map(|c| c.result::<u32>().ok().flatten().unwrap_or(0))
            .sum();
        let id = ctx.message_id();
        let _: i64 = self
            .0
            .client
            .hset(format!("{}{REPORTS}.sum", self.0.prefix), (id, sum))
            .await
            .map_err(|_| HandlerOutcome::retry())?;
        let _: i64 = self
            .0
            .client
            .hincrby(format!("{}{REPORTS}.runs", self.0.prefix), id, 1)
            .await
            .map_err(|_| HandlerOutcome::retry())?;
        Ok(())
    }
}

/// The worker: both queues on `RUSTSTREAM_FLOW_WORKER` under `RUSTSTREAM_FLOW_PREFIX`. Stops
/// on SIGTERM.
#[test]
#[ignore = "the worker process of the flow test, which runs it; does nothing on its own"]
fn flow_worker_process() {
    let Ok(url) = std::env::var("RUSTSTREAM_FLOW_WORKER") else {
        return;
    };
    let prefix = std::env::var("RUSTSTREAM_FLOW_PREFIX").unwrap_or_default();
    tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let client = Builder::from_config(Config::from_url(&url).unwrap())
            .build()
            .unwrap();
        client.init().await.unwrap();
        let recorder = Recorder {
            client,
            prefix: prefix.clone(),
        };
        let (parts, reports) = (Parts(recorder.clone()), Reports(recorder));
        serve_until_sigterm(
            RustStream::new(AppInfo::new("flow-worker", "0"))
                .shutdown_timeout(Duration::from_secs(2))
                .with_broker(RedisBroker::standalone(url).prefix(&prefix), |b| {
                    b.include(subscriber(list(PARTS), parts).build());
                    b.include(subscriber(list(REPORTS), reports).build());
                }),
        )
        .await;
    });
}

fn spawn_worker(url: &str, prefix: &str, dir: &std::path::Path) -> WorkerProcess {
    static N: AtomicU64 = AtomicU64::new(0);
    let log = dir.join(format!("worker-{}.log", N.fetch_add(1, Ordering::Relaxed)));
    WorkerProcess::spawn(
        &test_name(module_path!(), "flow_worker_process"),
        &[
            ("RUSTSTREAM_FLOW_WORKER", url.to_owned()),
            ("RUSTSTREAM_FLOW_PREFIX", prefix.to_owned()),
        ],
        Some(log),
    )
}

async fn counts(client: &Client, key: String) -> HashMap<String, u64> {
    client.hgetall(key).await.unwrap_or_default()
}

async fn a_worker_killed_mid_flow_leaves_every_parent_run_once(env: &Env) {
    const FLOWS: u32 = 8;
    const CHILDREN: u32 = 6;
    let url = env.url().expect("standalone").to_owned();
    let prefix = env.prefix.clone();
    let dir: PathBuf = std::env::temp_dir().join(unique("flows"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut workers: Vec<WorkerProcess> =
        (0..3).map(|_| spawn_worker(&url, &prefix, &dir)).collect();
    for w in &workers {
        w.ready(WAIT).await;
    }
    let publisher = env.broker().publisher();
    for f in 0..FLOWS {
        let mut flow = publisher
            .flow(&Report { flow: f })
            .to(REPORTS)
            .id(format!("flow-{f}"));
        for n in 1..=CHILDREN {
            flow = flow.child(&Part { n }, PARTS);
        }
        flow.publish().await.expect("publish a flow");
    }
    let runs = format!("{prefix}{PARTS}.runs");
    wait_until("some children ran", WAIT, async || {
        counts(&env.client, runs.clone()).await.len() >= 8
    })
    .await;
    // Killed with children in its hands (each worker runs 4 at a time, 150 ms each).
    workers[0].kill();
    workers.push(spawn_worker(&url, &prefix, &dir));
    workers.last().expect("a worker").ready(WAIT).await;
    let reports = format!("{prefix}{REPORTS}.runs");
    wait_until("every parent ran", Duration::from_secs(30), async || {
        counts(&env.client, reports.clone()).await.len() == FLOWS as usize
    })
    .await;
    // Long enough for any second enqueue to be handled.
    tokio::time::sleep(MIN_IDLE * 2).await;
    let parents = counts(&env.client, reports).await;
    let sums = counts(&env.client, format!("{prefix}{REPORTS}.sum")).await;
    let children = counts(&env.client, runs).await;
    let again: u64 = children.values().map(|n| n - 1).sum();
    println!(
        "{} children ran, {again} of them again after the kill",
        children.len()
    );
    for f in 0..FLOWS {
        let id = format!("flow-{f}");
        assert_eq!(
            parents.get(&id),
            Some(&1),
            "parent {id} ran once: {parents:?}"
        );
        assert_eq!(
            sums.get(&id),
            Some(&u64::from(CHILDREN * (CHILDREN + 1) / 2)),
            "parent {id} read every child's result"
        );
    }
    assert_eq!(
        children.len(),
        (FLOWS * CHILDREN) as usize,
        "every child ran"
    );
    for w in workers.into_iter().skip(1) {
        w.stop(WAIT).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
