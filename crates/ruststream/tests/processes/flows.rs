//! Flows across worker processes: three worker processes handle the children
//! and parents of many flows; one is SIGKILLed while children run, a new one takes its place,
//! and every parent is still enqueued exactly once, after all its children, reading every child
//! acked. The killed worker's claims come back after `min_idle`; a child it had reported but not
//! settled runs again, and its second report changes nothing. A parent the killed worker held
//! comes back the same way, at attempt 2: at-least-once delivery, not a second enqueue. So the
//! test counts each parent's first attempts, which a second enqueue would make two.
//!
//! And a publisher process SIGKILLed while it publishes flows of many children: every flow it
//! started (its record written) is finished by the workers' repair after the grace, its parent
//! runs exactly once and every child at least once; a flow it had not started leaves nothing.
//!
//! The worker is `flow_worker_process`, the publisher `flow_publisher_process` (this binary run
//! again, `harness::process`): without `RUSTSTREAM_FLOW_WORKER` (`RUSTSTREAM_FLOW_PUBLISHER`)
//! each returns at once.

use crate::harness;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fred::prelude::*;
use harness::process::{WorkerProcess, serve_until_sigterm, test_name, worker_runtime};
use harness::{Env, WAIT, on, unique, wait_until};
use ruststream::prelude::*;

on!(
    [standalone]
    a_worker_killed_mid_flow_leaves_every_parent_run_once,
    a_publisher_killed_mid_flow_leaves_every_started_flow_finished_once,
);

/// The children's queue and the parents'.
const PARTS: &str = "{fparts}";
const REPORTS: &str = "{freports}";
/// The children's queue of the publisher's flows: handled without a pause.
const FAST: &str = "{ffast}";
/// The parents' queue's flows being published.
const PUBLISHING: &str = "{freports}.flows.publishing";
/// How long a flow may be publishing before the workers repair it.
const GRACE: Duration = Duration::from_secs(1);
/// The publisher's flows, and each one's children.
const PUBLISHED_FLOWS: u32 = 30;
const PUBLISHED_CHILDREN: u32 = 200;
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
/// its result; a parent `HINCRBY <prefix>{freports}.runs <id> 1` at its first attempt and `HSET
/// <prefix>{freports}.sum <id> <sum of its children's results>`.
#[derive(Clone)]
struct Recorder {
    client: Client,
    prefix: String,
}

/// The children's handler, working this long on each.
struct Parts(Recorder, Duration);

/// The parents' handler.
struct Reports(Recorder);

impl Handle<Part> for Parts {
    async fn handle(&self, p: &Part, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        tokio::time::sleep(self.1).await;
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
        if ctx.attempt() > 1 {
            // Its worker died before settling it: a redelivery, not a second enqueue.
            return Ok(());
        }
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
    let rt = worker_runtime();
    rt.block_on(async move {
        let client = Builder::from_config(Config::from_url(&url).unwrap())
            .build()
            .unwrap();
        client.init().await.unwrap();
        let recorder = Recorder {
            client,
            prefix: prefix.clone(),
        };
        let parts = Parts(recorder.clone(), Duration::from_millis(WORK_MS));
        let fast = Parts(recorder.clone(), Duration::ZERO);
        let reports = Reports(recorder);
        let broker = RedisBroker::standalone(url)
            .prefix(&prefix)
            .flow_repair_grace(GRACE)
            .schedule_interval(Duration::from_millis(200));
        serve_until_sigterm(
            RustStream::new(AppInfo::new("flow-worker", "0"))
                .shutdown_timeout(Duration::from_secs(2))
                .with_broker(broker, |b| {
                    b.include(subscriber(list(PARTS), parts).build());
                    b.include(subscriber(list(FAST).concurrency(16), fast).build());
                    b.include(subscriber(list(REPORTS), reports).build());
                }),
        )
        .await;
    });
}

/// The publisher: [`PUBLISHED_FLOWS`] flows `<RUSTSTREAM_FLOW_IDS><n>` of
/// [`PUBLISHED_CHILDREN`] children each on `RUSTSTREAM_FLOW_PUBLISHER` under
/// `RUSTSTREAM_FLOW_PREFIX`, one after the other, then waits to be killed.
#[test]
#[ignore = "the publisher process of the flow test, which runs it; does nothing on its own"]
fn flow_publisher_process() {
    let Ok(url) = std::env::var("RUSTSTREAM_FLOW_PUBLISHER") else {
        return;
    };
    let prefix = std::env::var("RUSTSTREAM_FLOW_PREFIX").unwrap_or_default();
    let ids = std::env::var("RUSTSTREAM_FLOW_IDS").unwrap_or_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let broker = RedisBroker::standalone(url).prefix(&prefix);
        broker.connect().await.unwrap();
        eprintln!("worker ready");
        let publisher = broker.publisher();
        for f in 0..PUBLISHED_FLOWS {
            let mut flow = publisher
                .flow(&Report { flow: f })
                .to(REPORTS)
                .id(format!("{ids}{f}"));
            for n in 1..=PUBLISHED_CHILDREN {
                flow = flow.child(&Part { n }, FAST);
            }
            flow.publish().await.unwrap();
        }
        std::future::pending::<()>().await;
    });
}

fn spawn_publisher(url: &str, prefix: &str, ids: &str, dir: &std::path::Path) -> WorkerProcess {
    WorkerProcess::spawn(
        &test_name(module_path!(), "flow_publisher_process"),
        &[
            ("RUSTSTREAM_FLOW_PUBLISHER", url.to_owned()),
            ("RUSTSTREAM_FLOW_PREFIX", prefix.to_owned()),
            ("RUSTSTREAM_FLOW_IDS", ids.to_owned()),
        ],
        Some(dir.join(format!("publisher-{ids}.log"))),
    )
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
            "parent {id} was enqueued once (one first attempt): {parents:?}"
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

async fn a_publisher_killed_mid_flow_leaves_every_started_flow_finished_once(env: &Env) {
    let url = env.url().expect("standalone").to_owned();
    let prefix = env.prefix.clone();
    let dir: PathBuf = std::env::temp_dir().join(unique("flowpub"));
    std::fs::create_dir_all(&dir).unwrap();
    let workers: Vec<WorkerProcess> = (0..2).map(|_| spawn_worker(&url, &prefix, &dir)).collect();
    for w in &workers {
        w.ready(WAIT).await;
    }
    // Killed as soon as the fourth flow is being published; a kill that lands between two flows left
    // none half published: another publisher tries again (at most 5).
    let mut halfway = 0;
    let mut attempts = Vec::new();
    for attempt in 0..5 {
        wait_until("no flow is being published", WAIT, async || {
            env.zcard(PUBLISHING).await == 0
        })
        .await;
        let ids = format!("p{attempt}-");
        let mut publisher = spawn_publisher(&url, &prefix, &ids, &dir);
        publisher.ready(WAIT).await;
        let fourth = format!("{REPORTS}.flow:{ids}3");
        wait_until("the fourth flow is being published", WAIT, async || {
            env.exists(&fourth).await
        })
        .await;
        publisher.kill();
        attempts.push(ids);
        halfway = env.zcard(PUBLISHING).await;
        if halfway > 0 {
            break;
        }
    }
    assert!(halfway > 0, "a kill landed in the middle of a flow");
    // The flows the publishers started: their records.
    let records = env
        .keys_matching(&format!("{prefix}{REPORTS}.flow:*"))
        .await;
    let started: Vec<String> = records
        .iter()
        .filter_map(|r| r.rsplit_once(".flow:").map(|(_, id)| id.to_owned()))
        .collect();
    assert!(!started.is_empty());
    let mut unsent = 0;
    for record in &records {
        let fields: HashMap<String, String> = env.client.hgetall(record).await.expect("HGETALL");
        unsent += fields.values().filter(|v| *v == "u").count();
    }
    let reports = format!("{prefix}{REPORTS}.runs");
    wait_until(
        "every started flow's parent ran",
        Duration::from_secs(30),
        async || {
            let ran = counts(&env.client, reports.clone()).await;
            started.iter().all(|id| ran.contains_key(id))
        },
    )
    .await;
    // A flow whose children were all pushed but not marked leaves the set at its repair.
    wait_until("no flow is left half published", WAIT, async || {
        env.zcard(PUBLISHING).await == 0
    })
    .await;
    // Long enough for any second enqueue to be handled.
    tokio::time::sleep(GRACE * 2).await;
    let parents = counts(&env.client, reports).await;
    let sums = counts(&env.client, format!("{prefix}{REPORTS}.sum")).await;
    let children = counts(&env.client, format!("{prefix}{PARTS}.runs")).await;
    let again: u64 = children.values().map(|n| n - 1).sum();
    println!(
        "{} flows started over {} publishers, {halfway} left half published by the kill \
         with {unsent} children unsent, {} children ran, {again} of them twice or more",
        started.len(),
        attempts.len(),
        children.len()
    );
    for id in &started {
        assert_eq!(
            parents.get(id),
            Some(&1),
            "parent {id} was enqueued once (one first attempt): {parents:?}"
        );
        assert_eq!(
            sums.get(id),
            Some(&u64::from(
                PUBLISHED_CHILDREN * (PUBLISHED_CHILDREN + 1) / 2
            )),
            "parent {id} read every child acked"
        );
        let ran = children
            .keys()
            .filter(|c| c.starts_with(&format!("{id}.")))
            .count();
        assert_eq!(ran, PUBLISHED_CHILDREN as usize, "every child of {id} ran");
    }
    // A flow never started left nothing: no parent ran but the started ones.
    assert_eq!(parents.len(), started.len(), "{parents:?}");
    for w in workers {
        w.stop(WAIT).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
