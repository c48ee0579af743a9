//! Failovers: a publisher and a consumer in this process carry on while the server under the
//! queue is killed and its replica promoted, on a cluster (the master's replica takes over) and
//! under sentinels (the app follows the promoted replica).

use crate::harness;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::prelude::*;
use harness::stand::{Stand, kill9, node_client, server_pid};
use harness::{bounded, unique, wait_until};
use ruststream::prelude::*;

use super::{Job, QUEUE, queue};

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
