//! The failover ledger: on a primary, a replica and 3 sentinels of the test's own
//! (`scripts/stand`'s `stand_sentinel`: `down-after-milliseconds 1000`, `failover-timeout
//! 3000`), a producer publishes `N` messages through the sentinels while the primary is
//! SIGKILLed mid-run and the sentinels promote the replica; then a subscription through the
//! sentinels consumes the queue on the new primary, and every publish that returned `Ok` is
//! looked for. Printed: published, acknowledged, refused (`NotDurable` or an error), delivered,
//! lost.
//!
//! The window is forced: just before the kill the replica is SIGSTOPped and the primary is sent
//! a 32 MB padding value (it fills the kernel's socket buffers towards the stopped replica, which
//! would otherwise still receive what the primary wrote meanwhile), then `W` messages are
//! published, then the primary is SIGKILLed and the replica SIGCONTinued. Without `durable`
//! those `W` publishes are acknowledged and lost (asserted > 0); with
//! `.durable(1, 100 ms)` they are `NotDurable`, and nothing acknowledged is lost (asserted 0).
//! Once promoted, the new primary gets a fresh replica (a redis-server of the test's own, with
//! `replica-priority 0`), so durable publishes succeed again for the rest of the run; a durable
//! run goes on publishing past `N` until one after the failover is acknowledged (the promotion
//! may be seen only near the end of the run, leaving few publishes after the sync). The fresh
//! replica must never be promoted: it joins empty, and Sentinel will promote a replica still in
//! its first sync (once in CI, with the promoted primary busy forking for that sync); the old
//! primary, made its replica, then drops everything, acknowledged durable writes with it.
//! Deployments avoid that the same way (see the guide's *Durable publishes and failovers*).
//!
//! Size: `RUSTSTREAM_FAILOVER_N` messages, 1,000 by default (both runs in about 20 s); the full
//! run is `RUSTSTREAM_FAILOVER_N=10000`. Only processes this test started are signalled.
//!
//! ```text
//! RUSTSTREAM_FAILOVER_N=10000 scripts/test -p redstream --test processes failover:: -- --nocapture
//! ```

use crate::harness;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;
use harness::Seen;
use harness::stand::{OwnRedis, Stand, kill9, node_client, server_pid};
use harness::{bounded, unique, wait_until};
use ruststream::prelude::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

const QUEUE: &str = "{failover}";
/// Publishes in the forced window, between the replica's stop and the primary's kill.
const WINDOW: u32 = 20;
/// A durable publish's wait for its replica.
const DURABLE: Duration = Duration::from_millis(100);
/// Any one publish, including one caught in the failover.
const PUBLISH_LIMIT: Duration = Duration::from_secs(3);

fn size() -> u32 {
    std::env::var("RUSTSTREAM_FAILOVER_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// What one run counted.
#[derive(Debug, Default)]
struct Tally {
    acked: BTreeSet<u32>,
    refused: usize,
    delivered: BTreeSet<u32>,
}

impl Tally {
    fn lost(&self) -> usize {
        self.acked.difference(&self.delivered).count()
    }
}

/// A redis-server the test starts as a replica of the promoted primary; SIGKILLed on drop.
struct Replica(Child, std::path::PathBuf, String);

impl Replica {
    /// A replica of `primary` on a free port, once it runs: a port another test took between the
    /// pick and the bind makes redis-server exit, and another port is tried.
    fn start(primary: &str) -> Self {
        let (host, primary_port) = primary.rsplit_once(':').expect("host:port");
        for _ in 0..10 {
            let dir = std::env::temp_dir().join(unique("failover-replica"));
            std::fs::create_dir_all(&dir).expect("a temp dir");
            let port = OwnRedis::free_port().to_string();
            let mut child = Command::new("redis-server")
                .args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
                .args(["--appendonly", "no", "--dir", dir.to_str().expect("utf-8")])
                .args(["--replicaof", host, primary_port])
                // Never promoted: it joins empty (see the module docs).
                .args(["--replica-priority", "0"])
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server runs");
            let deadline = Instant::now() + Duration::from_secs(5);
            let up = loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break false;
                }
                // Another test's server may have taken the port between the pick and the bind:
                // only our own process's answer counts.
                let ours = format!("process_id:{}\r", child.id());
                let answered = Command::new("redis-cli")
                    .args(["-p", &port, "info", "server"])
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&ours));
                if answered {
                    break true;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break false;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            if up {
                return Self(child, dir, port);
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        panic!("no replica of {primary} started in 10 attempts");
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

/// `INFO replication` of the node at `port`, on a connection of its own (empty if it does not
/// answer in 5 s): a sentinel's reconfiguration of a node kills its normal clients (`CLIENT
/// KILL TYPE normal`), so a client kept across a second failover would answer nothing.
async fn replication(port: &str) -> String {
    let info = tokio::process::Command::new("redis-cli")
        .args(["-p", port, "info", "replication"])
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(5), info)
        .await
        .ok()
        .and_then(Result::ok)
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// `host:port` of the primary the sentinels name.
async fn primary(sentinel: &Client, service: &str) -> String {
    let addr: Vec<String> = sentinel
        .custom(
            fred::cmd!("SENTINEL"),
            vec!["get-master-addr-by-name", service],
        )
        .await
        .unwrap_or_default();
    match addr.as_slice() {
        [host, port] => format!("{host}:{port}"),
        _ => String::new(),
    }
}

/// `host:port` of the primary's first replica (`INFO replication`'s `slave0`).
async fn replica_of(primary: &Client) -> String {
    let info: String = primary
        .custom(fred::cmd!("INFO"), vec!["replication"])
        .await
        .expect("INFO replication");
    let slave = info
        .lines()
        .find_map(|l| l.strip_prefix("slave0:"))
        .expect("the primary has a replica");
    let field = |name: &str| {
        slave
            .split(',')
            .find_map(|f| f.strip_prefix(name))
            .expect("ip and port")
            .to_owned()
    };
    format!("{}:{}", field("ip="), field("port="))
}

/// Whether the primary has an online replica whose offset is the primary's.
async fn replica_caught_up(primary: &Client) -> bool {
    let info: String = primary
        .custom(fred::cmd!("INFO"), vec!["replication"])
        .await
        .unwrap_or_default();
    let offset = info
        .lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .map(|v| v.trim().to_owned());
    info.lines()
        .filter_map(|l| l.strip_prefix("slave0:"))
        .any(|s| {
            s.contains("state=online")
                && offset
                    .as_deref()
                    .is_some_and(|o| s.contains(&format!("offset={o},")))
        })
}

/// Publishes job `n` (durable or not) within `PUBLISH_LIMIT` and counts it in `tally`: acknowledged,
/// or refused (`NotDurable`, an error or the time limit). Returns whether it was acknowledged.
async fn publish(
    publisher: &Publisher,
    n: u32,
    durable: bool,
    tally: &mut Tally,
    what: &str,
) -> bool {
    let job = Job { n };
    let mut publish = publisher.message(&job).to(QUEUE);
    if durable {
        publish = publish.durable(1, DURABLE);
    }
    match tokio::time::timeout(PUBLISH_LIMIT, publish.publish()).await {
        Ok(Ok(_)) => {
            tally.acked.insert(n);
            return true;
        }
        Ok(Err(e)) => {
            if tally.refused % 100 == 99 {
                println!("failover ({what}): publish {n} refused: {e}");
            }
        }
        Err(_) => {}
    }
    tally.refused += 1;
    false
}

/// One run on fresh servers: `durable` or not.
async fn run(durable: bool) -> Tally {
    let what = if durable { "durable" } else { "plain" };
    let started = Instant::now();
    let stand = Stand::start(&format!("stand_sentinel rsfo{}", u8::from(durable)));
    let service = stand.var("RUSTSTREAM_SENTINEL_SERVICE");
    let hosts: Vec<String> = stand
        .var("RUSTSTREAM_SENTINEL_HOSTS")
        .split(',')
        .map(str::to_owned)
        .collect();
    let sentinel = node_client(&hosts[0]).await;
    let old = primary(&sentinel, &service).await;
    let old_client = node_client(&old).await;
    let old_pid = server_pid(&old_client).await;
    wait_until(
        "the replica is in sync",
        Duration::from_secs(10),
        || async { replica_caught_up(&old_client).await },
    )
    .await;
    let replica = replica_of(&old_client).await;
    let replica_pid = server_pid(&node_client(&replica).await).await;

    let prefix = format!("{}:", unique("failover"));
    let broker = || RedisBroker::sentinel(service.clone(), hosts.clone()).prefix(&prefix);
    let producer = broker();
    bounded("connect", Duration::from_secs(10), producer.connect())
        .await
        .expect("the producer connects through the sentinels");
    let publisher = producer.publisher();
    let n = size();
    let kill_at = n / 2;
    let mut tally = Tally::default();
    let mut new_replica = None;
    let mut promoted: Option<tokio::task::JoinHandle<String>> = None;
    for i in 0..n {
        if i == kill_at - WINDOW {
            signal(replica_pid, "-STOP");
            let pad = "x".repeat(32 << 20);
            let () = old_client
                .custom(
                    fred::cmd!("SET"),
                    vec![format!("{prefix}pad"), pad, "PX".into(), "60000".into()],
                )
                .await
                .expect("the padding write");
        }
        if i == kill_at {
            kill9(old_pid);
            signal(replica_pid, "-CONT");
            let (sentinel, service, old) = (sentinel.clone(), service.clone(), old.clone());
            promoted = Some(tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let now = primary(&sentinel, &service).await;
                    if !now.is_empty() && now != old {
                        return now;
                    }
                    assert!(Instant::now() < deadline, "no promotion within 30 s");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }));
        }
        if new_replica.is_none() && promoted.as_ref().is_some_and(|p| p.is_finished()) {
            let now = promoted.take().expect("set").await.expect("the watcher");
            println!(
                "failover ({what}): primary {old} killed at message {kill_at}, {now} promoted by message {i}"
            );
            let replica = Replica::start(&now);
            // Its sync is part of the run: durable publishes fail until it is done.
            let promoted_port = now.rsplit(':').next().unwrap_or_default().to_owned();
            let port = format!("port={},", replica.2);
            // A full sync (the promoted primary forks for it, after repl-diskless-sync-delay's
            // 5 s) takes seconds, and longer beside the other process tests: a generous bound
            // (60 s was passed once in a CI run beside the ledger; alone it takes about 6 s).
            // Past 30 s, both sides' replication state is printed every 30 s: a sync that never
            // ends (it did once, in a full local run) then says why.
            let waiting = Instant::now();
            let mut told = Duration::ZERO;
            wait_until(
                "the new replica syncs",
                Duration::from_secs(120),
                async || {
                    let info = replication(&promoted_port).await;
                    let synced = info.lines().any(|l| {
                        l.starts_with("slave") && l.contains(&port) && l.contains("state=online")
                    });
                    if !synced && waiting.elapsed() > told + Duration::from_secs(30) {
                        told = waiting.elapsed();
                        let own = replication(&replica.2).await;
                        println!(
                            "failover ({what}): the new replica not synced after {told:?}; the promoted primary says:\n{info}\nthe replica says:\n{own}"
                        );
                    }
                    synced
                },
            )
            .await;
            new_replica = Some(replica);
        }
        publish(&publisher, i, durable, &mut tally, what).await;
    }
    if let Some(p) = promoted.take() {
        let now = bounded("the promotion", Duration::from_secs(30), p)
            .await
            .expect("the watcher");
        println!("failover ({what}): {now} promoted after the run");
    }
    // Durable publishes must succeed again once the new primary has a replica. The promotion may
    // be seen only near the end of the run, leaving few publishes after the sync, so past `n` the
    // run goes on publishing until one is acknowledged; those count like the others.
    let mut extra = n;
    if durable {
        let deadline = Instant::now() + Duration::from_secs(60);
        while tally.acked.range(kill_at..).next().is_none() && Instant::now() < deadline {
            if !publish(&publisher, extra, durable, &mut tally, what).await {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            extra += 1;
        }
        if extra > n {
            println!(
                "failover ({what}): {} publishes past {n} until one was acknowledged",
                extra - n
            );
        }
    }

    // Consume everything on the new primary through the sentinels.
    let seen = Seen::<Job>::acking();
    let now = primary(&sentinel, &service).await;
    let now_client = node_client(&now).await;
    let present: i64 = now_client
        .llen(format!("{prefix}{QUEUE}"))
        .await
        .expect("LLEN");
    let app = RustStream::new(AppInfo::new("failover", "0")).with_broker(broker(), |b| {
        b.include(
            ruststream::subscriber(RedisList::new(QUEUE).concurrency(64), seen.clone()).build(),
        );
    });
    let running = harness::start(app).await;
    let wanted = usize::try_from(present).unwrap_or(0);
    wait_until("the queue is consumed", Duration::from_secs(30), || async {
        seen.count() >= wanted
    })
    .await;
    harness::stop(running).await;
    tally.delivered = seen.jobs().into_iter().map(|(j, _)| j.n).collect();
    println!(
        "failover ledger ({what}): published {extra}, acknowledged {}, refused {}, delivered {}, lost {} acknowledged publishes ({:.1} s)",
        tally.acked.len(),
        tally.refused,
        tally.delivered.len(),
        tally.lost(),
        started.elapsed().as_secs_f64()
    );
    drop(new_replica);
    drop(stand);
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_loses_acknowledged_publishes_unless_they_are_durable() {
    let plain = run(false).await;
    let durable = run(true).await;
    assert!(
        plain.lost() > 0,
        "the forced window should lose acknowledged plain publishes: {plain:?}"
    );
    assert_eq!(
        durable.lost(),
        0,
        "a durable publish that returned Ok was lost: {:?}",
        durable
            .acked
            .difference(&durable.delivered)
            .collect::<Vec<_>>()
    );
    // Durable publishes are not refused wholesale: most of those before the window (the replica
    // in sync) are acknowledged, and so is one after the failover at least (the run publishes
    // past `N` until one is, through a second failover too).
    let before = size() / 2 - WINDOW;
    let acked_before = durable.acked.range(..before).count();
    assert!(
        acked_before * 10 > usize::try_from(before).unwrap_or(0) * 9,
        "most durable publishes before the window are acknowledged: {acked_before} of {before}"
    );
    assert!(
        durable.acked.range(size() / 2..).next().is_some(),
        "no durable publish was acknowledged after the failover: {durable:?}"
    );
}
