//! Fair groups across processes: three worker processes read one grouped list
//! (`RedisList::groups`) while one tenant's backlog drains; twenty small tenants published
//! after the backlog are each served long before it is done, and every job is handled once.
//! The workers record each job they handle (`HINCRBY`) and the order of handling (`RPUSH` of the
//! job's group onto one list, across the processes).

use crate::harness;

use std::path::PathBuf;
use std::time::Duration;

use fred::prelude::*;
use harness::process::{WorkerProcess, serve_until_sigterm, test_name, worker_runtime};
use harness::{Env, on, unique, wait_until};
use ruststream::prelude::*;
use ruststream::redis::list;

on!([standalone] small_tenants_are_served_by_every_process_while_a_backlog_drains);

const QUEUE: &str = "{groups}";
/// The big tenant's backlog.
const BIG: u32 = 3000;
/// Small tenants, one job each.
const SMALL: u32 = 20;
/// Worker processes, and each one's concurrency.
const WORKERS: usize = 3;
const CONCURRENCY: usize = 4;
/// Each job's work.
const WORK: Duration = Duration::from_millis(5);

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Job {
    n: u32,
    group: String,
}
outgoing!(Job);

/// The worker: the grouped queue on `RUSTSTREAM_GROUPS_WORKER` under `RUSTSTREAM_GROUPS_PREFIX`,
/// each job taking [`WORK`], then recorded. Stops on SIGTERM.
#[test]
#[ignore = "the worker process of the groups test, which runs it; does nothing on its own"]
fn groups_worker_process() {
    let Ok(url) = std::env::var("RUSTSTREAM_GROUPS_WORKER") else {
        return;
    };
    let prefix = std::env::var("RUSTSTREAM_GROUPS_PREFIX").unwrap_or_default();
    let rt = worker_runtime();
    rt.block_on(async move {
        let raw = Builder::from_config(Config::from_url(&url).unwrap())
            .build()
            .unwrap();
        raw.init().await.unwrap();
        let handler = Recorder {
            client: raw,
            handled: format!("{prefix}{QUEUE}.handled"),
            order: format!("{prefix}{QUEUE}.order"),
        };
        let source = RedisList::new(QUEUE)
            .reliable()
            .groups()
            .concurrency(CONCURRENCY)
            .block(Duration::from_millis(500));
        serve_until_sigterm(
            RustStream::new(AppInfo::new("groups-worker", "0"))
                .shutdown_timeout(Duration::from_secs(2))
                .with_broker(RedisBroker::standalone(url).prefix(&prefix), |b| {
                    b.include(subscriber(source, handler).build());
                }),
        )
        .await;
    });
}

struct Recorder {
    client: Client,
    handled: String,
    order: String,
}

impl Handle<Job> for Recorder {
    async fn handle(&self, job: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        tokio::time::sleep(WORK).await;
        let n = job.n.to_string();
        let done: Result<i64, _> = self.client.hincrby(&self.handled, n.as_str(), 1).await;
        let ordered: Result<i64, _> = self.client.rpush(&self.order, job.group.as_str()).await;
        match (done, ordered) {
            (Ok(_), Ok(_)) => Ok(()),
            _ => Err(HandlerOutcome::retry()),
        }
    }
}

async fn publish(broker: &RedisBroker, group: &str, jobs: std::ops::Range<u32>) {
    let jobs: Vec<Job> = jobs
        .map(|n| Job {
            n,
            group: group.to_owned(),
        })
        .collect();
    for chunk in jobs.chunks(500) {
        broker
            .publisher()
            .messages(chunk)
            .to(QUEUE)
            .group(group)
            .publish()
            .await
            .unwrap();
    }
}

async fn small_tenants_are_served_by_every_process_while_a_backlog_drains(env: &Env) {
    let url = env.url().expect("the standalone server").to_owned();
    let prefix = env.prefix.clone();
    let broker = RedisBroker::standalone(&url)
        .prefix(&prefix)
        .route(QUEUE, list::Publish::new().groups());
    broker.connect().await.unwrap();
    publish(&broker, "big", 0..BIG).await;
    let dir: PathBuf = std::env::temp_dir().join(unique("groups"));
    std::fs::create_dir_all(&dir).unwrap();
    let workers: Vec<WorkerProcess> = (0..WORKERS)
        .map(|i| {
            WorkerProcess::spawn(
                &test_name(module_path!(), "groups_worker_process"),
                &[
                    ("RUSTSTREAM_GROUPS_WORKER", url.clone()),
                    ("RUSTSTREAM_GROUPS_PREFIX", prefix.clone()),
                ],
                Some(dir.join(format!("worker-{i}.log"))),
            )
        })
        .collect();
    for w in &workers {
        w.ready(Duration::from_secs(30)).await;
    }
    for t in 0..SMALL {
        publish(&broker, &format!("t{t}"), BIG + t..BIG + t + 1).await;
    }
    let handled = format!("{prefix}{QUEUE}.handled");
    let total = u64::from(BIG + SMALL);
    wait_until("every job handled", Duration::from_secs(120), || async {
        let n: u64 = env.client.hlen(&handled).await.unwrap_or(0);
        n == total
    })
    .await;
    for w in workers {
        w.stop(Duration::from_secs(10)).await;
    }
    let counts: std::collections::HashMap<String, u64> =
        env.client.hgetall(&handled).await.unwrap();
    let twice: Vec<_> = counts.iter().filter(|(_, c)| **c != 1).collect();
    assert_eq!(twice, Vec::<(&String, &u64)>::new(), "each job once");
    let order: Vec<String> = env
        .client
        .lrange(format!("{prefix}{QUEUE}.order"), 0, -1)
        .await
        .unwrap();
    let last_small = order.iter().rposition(|g| g != "big").expect("small ones");
    // Twelve handlers in all take a job of each waiting group a turn: the small tenants are
    // done within a few turns of their publish, long before the backlog's half.
    assert!(
        last_small < (BIG / 2) as usize,
        "the last small tenant was job {last_small} of {}",
        order.len()
    );
    let processing: i64 = env
        .client
        .llen(format!("{prefix}{QUEUE}.processing"))
        .await
        .unwrap();
    assert_eq!(processing, 0);
    let _ = std::fs::remove_dir_all(dir);
}
