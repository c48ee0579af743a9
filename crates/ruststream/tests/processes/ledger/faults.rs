//! The ledger run's faults: their plan, the run that injects them, and the watchdog that fails
//! the run when a live worker handles nothing while work is queued.

use crate::harness;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fred::bytes::Bytes;
use fred::prelude::*;
use harness::proxy::Proxy;
use harness::stand::OwnRedis;
use harness::{bounded, wait_until};
use ruststream::redis::frame::Frame;

use super::server::{
    claimed, config_set, drained, group_state, key, pause_writes, pending, q, used_memory,
};
use super::worker::{Worker, consumer_name, job_of, read_ledger};
use super::{MAX_ATTEMPTS, QUEUE, Transport};

// ---------------------------------------------------------------------------------------------
// Faults.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Fault {
    Kill,
    CutAll,
    CutSettle,
    CutClaim,
    Restart,
    Oom,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Kill => "kill",
            Self::CutAll => "cut-all",
            Self::CutSettle => "cut-settle",
            Self::CutClaim => "cut-claim",
            Self::Restart => "restart",
            Self::Oom => "oom",
        })
    }
}

/// The faults of a run of `n` messages, shuffled: kills and cuts grow with `n`; one restart and
/// one OOM episode.
pub(super) fn fault_plan(rng: &mut fastrand::Rng, n: u32) -> Vec<Fault> {
    let n = n as usize;
    let mut plan = Vec::new();
    plan.extend(std::iter::repeat_n(Fault::Kill, 3 + n / 6000));
    plan.extend(std::iter::repeat_n(Fault::CutAll, 2 + n / 10_000));
    plan.extend(std::iter::repeat_n(Fault::CutSettle, 2 + n / 10_000));
    plan.extend(std::iter::repeat_n(Fault::CutClaim, 1 + n / 20_000));
    plan.push(Fault::Restart);
    plan.push(Fault::Oom);
    rng.shuffle(&mut plan);
    plan
}

/// The bytes of a request that settles (`settle.lua`'s keys, or a stream's `XACK`) or claims
/// (`claim.lua`'s keys, or a plain group's native `XREADGROUP`), for [`Proxy::cut_after`].
fn needle(transport: Transport, fault: Fault, rng: &mut fastrand::Rng) -> Vec<u8> {
    let bulk = |s: &str| format!("${}\r\n{s}", s.len());
    let text = match (transport, fault) {
        (
            Transport::List | Transport::Levels | Transport::Batch | Transport::Steps,
            Fault::CutSettle,
        ) => {
            format!("{QUEUE}.processing\r\n{}", bulk(&key(".dead")))
        }
        (Transport::List | Transport::Levels | Transport::Batch | Transport::Steps, _) => {
            format!("{QUEUE}.processing\r\n{}", bulk(&key(".claims")))
        }
        (Transport::Stream, Fault::CutSettle) if rng.bool() => "\r\nXACK\r\n".to_owned(),
        (Transport::Stream, Fault::CutSettle) => {
            format!("{QUEUE}.dead\r\n{}", bulk(&key(".delayed")))
        }
        // The ledger's group has no cap and no rate limit: it reads natively.
        (Transport::Stream, _) => "\r\nXREADGROUP\r\n".to_owned(),
    };
    text.into_bytes()
}

/// Everything a run has: the server, the proxy, the workers and their ledgers.
pub(super) struct Run {
    pub(super) transport: Transport,
    pub(super) seed: u64,
    pub(super) dir: PathBuf,
    pub(super) redis: OwnRedis,
    /// Servers killed by the restart (kept so their drop does not remove the data directory
    /// under the live one).
    pub(super) killed: Vec<OwnRedis>,
    pub(super) proxy: Proxy,
    pub(super) r: Client,
    pub(super) workers: Vec<Worker>,
    pub(super) spawned: usize,
    /// Every worker's ledger, the dead ones' too.
    pub(super) ledgers: Vec<PathBuf>,
    pub(super) gate: Arc<tokio::sync::Mutex<()>>,
    /// Messages published so far.
    pub(super) published: Arc<AtomicU64>,
    /// The live workers' ledgers and logs, for the [`watchdog`].
    pub(super) live: Live,
}

impl Run {
    pub(super) fn spawn_worker(&mut self) -> Worker {
        let w = Worker::spawn(
            &self.proxy.url(),
            self.transport,
            self.seed,
            &self.dir,
            self.spawned,
        );
        self.spawned += 1;
        self.ledgers.push(w.ledger.clone());
        lock(&self.live).push((w.ledger.clone(), w.log.clone()));
        w
    }

    /// Injects `fault` in a run of `n` messages; returns how many messages were in flight at it
    /// (see the module docs), `None` when it could not happen (a cut after a settle, once
    /// everything is settled).
    pub(super) async fn inject(
        &mut self,
        fault: Fault,
        n: u32,
        rng: &mut fastrand::Rng,
    ) -> Option<usize> {
        let t = self.transport;
        Some(match fault {
            Fault::Kill => {
                let victim = rng.usize(..self.workers.len());
                let pid = self.workers[victim].process.pid();
                self.workers[victim].process.kill();
                let gone = self.workers[victim].ledger.clone();
                lock(&self.live).retain(|(ledger, _)| *ledger != gone);
                // Nothing of the victim's moves before min_idle: count what it held.
                let held = bounded(
                    "counting the victim's entries",
                    Duration::from_secs(10),
                    self.held_by(pid, &self.workers[victim].ledger),
                )
                .await;
                let fresh = self.spawn_worker();
                fresh.process.ready(Duration::from_secs(30)).await;
                self.workers[victim] = fresh;
                held
            }
            Fault::CutAll => {
                let before = claimed(&self.r, t).await.unwrap_or_default();
                self.proxy.cut_all();
                let after = claimed(&self.r, t).await.unwrap_or_default();
                before.union(&after).count()
            }
            Fault::CutSettle | Fault::CutClaim => {
                let before = claimed(&self.r, t).await.unwrap_or_default();
                let cuts = self.proxy.cuts();
                self.proxy.cut_after(&needle(t, fault, rng));
                let cut = tokio::time::timeout(Duration::from_secs(15), async {
                    while self.proxy.cuts() == cuts {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                })
                .await;
                if cut.is_err() {
                    // Disarmed: a needle no request contains.
                    self.proxy.cut_after(
                        &std::iter::repeat_with(|| rng.u8(..))
                            .take(64)
                            .collect::<Vec<_>>(),
                    );
                    // Idle at the end of the run (everything published and settled): no settle
                    // comes, nothing to cut. Any other silence is workers that are stuck.
                    let all_published = self.published.load(Ordering::SeqCst) == u64::from(n);
                    let drained = drained(&self.r, t).await;
                    assert!(
                        all_published && drained == Some(true),
                        "{fault}: no matching request in 15 s, yet there is work: published {}, drained {drained:?}, claimed {:?}",
                        self.published.load(Ordering::SeqCst),
                        claimed(&self.r, t).await.map(|c| c.len())
                    );
                    return None;
                }
                let after = claimed(&self.r, t).await.unwrap_or_default();
                before.union(&after).count()
            }
            Fault::Restart => {
                let gate = self.gate.clone();
                let _no_publish = gate.lock().await;
                // Writes paused: what is claimed now is what the server holds when it dies.
                pause_writes(&self.r, 10_000).await;
                let at_kill = claimed(&self.r, t).await.expect("claimed entries").len();
                self.redis.kill(); // SIGKILL
                // Sometimes longer than min_idle: the live workers' leases age past it meanwhile.
                tokio::time::sleep(Duration::from_millis(rng.u64(300..=4000))).await;
                let fresh = OwnRedis::start(self.redis.dir.clone(), self.redis.port).await;
                let dead = std::mem::replace(&mut self.redis, fresh);
                self.killed.push(dead);
                wait_until(
                    "the inspector reconnects",
                    Duration::from_secs(20),
                    || async { q(self.r.ping::<String>(None)).await.is_some() },
                )
                .await;
                at_kill
            }
            Fault::Oom => {
                let gate = self.gate.clone();
                let _no_publish = gate.lock().await;
                let mut seen = claimed(&self.r, t).await.unwrap_or_default();
                let used = used_memory(&self.r).await;
                config_set(&self.r, "maxmemory-policy", "noeviction").await;
                config_set(&self.r, "maxmemory", &(used + 256 * 1024).to_string()).await;
                // Writes that may grow a full server are refused: probes fill it up to the limit,
                // and keep it there for the episode (what the workers free lets one more in).
                let probe = vec![b'x'; 64 * 1024];
                let mut probes = Vec::new();
                let mut refusals = Vec::new();
                let until = Instant::now() + Duration::from_millis(rng.u64(2000..=4000));
                while Instant::now() < until {
                    let k = format!("ledger:oom-probe:{}", probes.len());
                    let set: Result<Value, _> =
                        self.r.set(&k, probe.as_slice(), None, None, false).await;
                    probes.push(k);
                    match set {
                        Err(e) => refusals.push(ruststream::redis::error::kind_of(&e)),
                        // Not full yet: fill it.
                        Ok(_) if refusals.is_empty() => continue,
                        Ok(_) => {}
                    }
                    seen.extend(claimed(&self.r, t).await.unwrap_or_default());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                config_set(&self.r, "maxmemory", "0").await;
                let _: i64 = q(self.r.del(probes.clone())).await.expect("DEL the probes");
                assert!(
                    refusals.contains(&ruststream::ErrorKind::OutOfMemory),
                    "no write refused under maxmemory: {refusals:?}"
                );
                println!(
                    "ledger {}: OOM episode: {} of {} probe writes refused",
                    t.name(),
                    refusals.len(),
                    probes.len()
                );
                seen.extend(claimed(&self.r, t).await.unwrap_or_default());
                seen.len()
            }
        })
    }

    /// The entries worker `pid` (killed) held: list, the processing list's entries whose
    /// `(id, attempt)` it started, plus those past their last attempt (dead-lettered without a
    /// handler, so not in any ledger); stream, its consumer's pending entries.
    async fn held_by(&self, pid: u32, ledger: &Path) -> usize {
        match self.transport {
            Transport::List | Transport::Levels | Transport::Batch | Transport::Steps => {
                let started: HashSet<(u32, u32)> = read_ledger(ledger)
                    .into_iter()
                    .filter(|(kind, _, _)| *kind == b'S')
                    .map(|(_, n, a)| (n, a))
                    .collect();
                let processing: Vec<Bytes> = q(self.r.lrange(key(".processing"), 0, -1))
                    .await
                    .expect("LRANGE processing");
                processing
                    .into_iter()
                    .map(Frame::decode)
                    .filter(|f| {
                        f.attempt > MAX_ATTEMPTS
                            || job_of(f).is_some_and(|n| started.contains(&(n, f.attempt)))
                    })
                    .count()
            }
            Transport::Stream => pending(&self.r, Some(&consumer_name(pid)))
                .await
                .expect("XPENDING of the victim")
                .len(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The watchdog.

/// How long a live worker may handle nothing while work is queued: longer than the restart's
/// outage (up to 4 s) plus a reconnect's backoff (up to 5 s).
const SILENCE: Duration = Duration::from_secs(15);

/// The live workers' `(ledger, log)` files.
pub(super) type Live = Arc<std::sync::Mutex<Vec<(PathBuf, PathBuf)>>>;

pub(super) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether work is waiting for a reader: entries in the list, or entries of the stream its
/// group has not read. `None`: unknown (the server may be down).
async fn queued(r: &Client, transport: Transport) -> Option<bool> {
    match transport {
        Transport::List | Transport::Batch | Transport::Steps => {
            q(r.llen::<i64, _>(key(""))).await.map(|n| n > 0)
        }
        Transport::Levels => {
            let mut n = 0;
            for level in ["", ".p1", ".p2"] {
                n += q(r.llen::<i64, _>(key(level))).await?;
            }
            Some(n > 0)
        }
        Transport::Stream => group_state(r).await.map(|(_, lag)| lag > 0),
    }
}

/// Resolves, with what the worker last logged, once a live worker's ledger has not grown for
/// [`SILENCE`] while work was queued all along, whatever fault (if any) is going on.
pub(super) async fn watchdog(r: Client, transport: Transport, live: Live) -> String {
    // Per ledger: its size when it last grew, and since when work has been queued without it
    // growing.
    let mut seen: HashMap<PathBuf, (u64, Instant)> = HashMap::new();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let waiting = queued(&r, transport).await == Some(true);
        let now = Instant::now();
        let workers = lock(&live).clone();
        seen.retain(|ledger, _| workers.iter().any(|(l, _)| l == ledger));
        for (ledger, log) in workers {
            let size = std::fs::metadata(&ledger).map_or(0, |m| m.len());
            let (last, since) = seen.entry(ledger.clone()).or_insert((size, now));
            if size != *last || !waiting {
                (*last, *since) = (size, now);
            } else if now - *since > SILENCE {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return format!(
                    "a worker handled nothing for {SILENCE:?} while work was queued ({}); its last log lines:\n{}",
                    log.display(),
                    tail.join("\n")
                );
            }
        }
    }
}
