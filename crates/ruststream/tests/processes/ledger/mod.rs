//! The ledger run: many messages, random outcomes, random faults, and an account of every message
//! at the end. One test per transport: `ledger_reliable_list` and `ledger_stream`;
//! `ledger_priorities_rate_limit`, the reliable list with three priority levels (each chunk
//! published onto one, in turn) behind a rate limit of 1,000 a second (the claim's gates over its
//! levels); `ledger_batch_handler`, the reliable list read by a batch handler ([`BATCH`] a
//! batch, each item settled as its own pick says; see `worker.rs`'s `Recorder`, `HandleBatch`);
//! and `ledger_steps`, the reliable list read by a handler of [`STEPS`] durable steps, its pick
//! done before one of them (`worker.rs`'s `Stepper`).
//!
//! - **Server.** A redis-server of the test's own ([`OwnRedis`]: `--appendonly yes --appendfsync
//!   always`, so a restart keeps everything acknowledged), no key prefix.
//! - **Messages.** The test publishes `N` jobs `{n}` (`n` in `0..N`, the ledger's id) to `{ledger}`
//!   at a steady rate ([`RATE`] a second, in chunks), on a direct connection.
//! - **Workers.** [`WORKERS`] processes (this test binary run again as
//!   `ledger::worker::ledger_worker_process`, as the fault tests do), each a subscription with
//!   concurrency [`CONCURRENCY`], `min_idle` [`MIN_IDLE`] and [`MAX_ATTEMPTS`] attempts,
//!   connected through a [`Proxy`] that can cut their connections. The handler picks an outcome
//!   from the seed, the job's id and its attempt (`worker.rs`'s `pick`): ack, retry,
//!   retry_after (100-400 ms), drop, panic, or slow (sleeps [`SLOW`], longer than `min_idle`,
//!   then acks), after 10-100 ms of work.
//! - **Ledger.** Each worker appends `S <n> <attempt>` when a handler starts and `A <n> <attempt>`
//!   once it decided to ack, to a file of its own (one `write(2)` on an `O_APPEND` file: a SIGKILL
//!   loses nothing written, and the ledger goes through none of the faults). Dead letters are
//!   read from `{ledger}.dead` at the end, with their `reason` header.
//! - **Faults**, in an order drawn from the seed, at points spread over the publishing (5-90 % of
//!   the messages published, so that work flows around each): workers SIGKILLed
//!   (and replaced), every worker connection cut (`Proxy::cut_all`), a worker connection cut just
//!   after a settle, or a claim, reached Redis (`Proxy::cut_after`: Redis ran it, the worker never
//!   hears), one Redis restart (SIGKILL, 0.3-4 s down, the same data directory), one OOM episode
//!   (`maxmemory` just above the used memory, `noeviction`, for 2-4 s, kept at the limit by probe
//!   writes, which must be refused). Publishing waits during the restart and the OOM episode.
//!   A cut after a settle that finds the run already idle (all published and settled) is
//!   skipped and counted as such; a cut that finds no request while there is work fails the test.
//! - **Watchdog.** Throughout, a live worker whose ledger has not grown for `SILENCE`
//!   (`faults.rs`) while work was queued (entries in the list, or unread by the group) fails the
//!   run at once with its last log lines, whatever fault is going on. Every fault kind must have been injected
//!   at least once (the default size draws each).
//! - **Checks** (the test waits a bounded time for the end): every id is acked or dead-lettered
//!   (reason `dropped` or `max-attempts`); duplicates (an id acked more than once, or acked and
//!   dead-lettered, or dead-lettered twice) are at most the messages in flight at the kills of
//!   workers and of the server (the cuts and the OOM episode must duplicate nothing, see below);
//!   nothing is left: the queue, processing list, recovery set, delayed set and payloads are gone
//!   (for the stream, which keeps its entries, the group has nothing pending and nothing unread),
//!   and no key but the dead-letter list (and the stream) exists. For the steps run, a step
//!   record may be left only by a worker whose claim the restart swept, written after the
//!   message was settled elsewhere; it has its ttl. It prints one line of counts.
//! - **Steps** (`ledger_steps`): each step's effect is an `E <n> <step>` line in the ledger.
//!   Every acked job ran each of its steps; a step ran again only where a kill fell between its
//!   effect and its record, its record failed to write (the handler writes `W`), or the restart
//!   swept a live worker's claim (see `check_steps`).
//!
//! "In flight at a fault" is measured, not assumed: for a killed worker, the entries it held
//! (list: the processing list's entries whose `(id, attempt)` the victim started, plus any past
//! their last attempt, which the core dead-letters without a handler; stream: `XPENDING` of the
//! victim's consumer); for a cut or the OOM episode, every claimed entry before and after it (and
//! during the episode); for the restart, every claimed entry at the kill (read with the server's
//! writes paused, so nothing changes between the count and the kill). Only kills count towards
//! the bound: a cut loses a request or its reply, and fred sends it again well within `min_idle`
//! (settles are idempotent; a claim whose reply was lost stays unhandled until swept back); under
//! `maxmemory` every script of the consumers runs (`allow-oom`). A killed worker's acks that it
//! had not settled, and after the restart, claims whose leases aged past `min_idle` during the
//! outage and were swept from their live workers, are where duplicates come from.
//!
//! Size: `RUSTSTREAM_LEDGER_N` messages, 2,000 by default (about 15 s a test; on CI's 2 cores
//! they run two at a time, the five in about 45 s); the full run is
//! `RUSTSTREAM_LEDGER_N=20000` (about 105 s a test, with more kills and cuts). The seed is
//! printed; `RUSTSTREAM_LEDGER_SEED=<seed>` replays its outcomes and fault plan (timing still
//! varies). The workers' logs and ledgers are removed after a passing run unless
//! `RUSTSTREAM_LEDGER_KEEP` is set; a failing run keeps them and names their directory.
//! `RUSTSTREAM_LEDGER_WORKER_LOG` is the workers' log filter (default `info`; e.g.
//! `info,fred::router=trace` shows every command a worker sends).
//!
//! ```text
//! scripts/test -p redstream --test processes ledger:: -- --nocapture
//! RUSTSTREAM_LEDGER_N=20000 scripts/test -p redstream --test processes ledger:: -- --nocapture
//! ```
//!
//! This file holds the run; `worker.rs` the workers, `server.rs` what the run reads off its
//! server and its publishing, `faults.rs` the faults, their injection and the watchdog,
//! `steps.rs` the steps run's account.

mod faults;
mod server;
mod steps;
mod worker;

use crate::harness;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fred::bytes::Bytes;
use fred::prelude::*;
use harness::proxy::Proxy;
use harness::stand::OwnRedis;
use harness::{bounded, unique, wait_until};
use ruststream::prelude::*;
use ruststream::redis::frame::Frame;

use self::faults::{Fault, Live, Run, fault_plan, watchdog};
use self::server::{dead_letters, drained, group_state, inspector, key, progress, publish_all, q};
use self::steps::check_steps;
use self::worker::{acks, job_of};

/// The queue (list or stream).
const QUEUE: &str = "{ledger}";
/// The stream's consumer group.
const GROUP: &str = "ledger";
/// Worker processes running at once.
const WORKERS: usize = 3;
/// Handlers per worker.
const CONCURRENCY: usize = 16;
/// How long a dead worker's claims take to come back.
const MIN_IDLE: Duration = Duration::from_secs(2);
/// How long a slow handler sleeps: past `min_idle`, so only its lease keeps its claim.
const SLOW: Duration = Duration::from_millis(2500);
/// Deliveries before a message goes to the dead letters.
const MAX_ATTEMPTS: u32 = 4;
/// Messages published a second.
const RATE: u32 = 200;
/// Messages a publish.
const CHUNK: u32 = 20;
/// `N` unless `RUSTSTREAM_LEDGER_N` says.
const DEFAULT_N: u32 = 2000;
/// Items a batch of the `Batch` transport (whose handlers take three batches at once).
const BATCH: usize = 10;
/// Durable steps of the `Steps` transport's handler.
const STEPS: u32 = 5;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Job {
    n: u32,
}
outgoing!(Job);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    List,
    Stream,
    /// The reliable list with priority levels and a rate limit.
    Levels,
    /// The reliable list read by a batch handler.
    Batch,
    /// The reliable list read by a handler of five durable steps.
    Steps,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Self::List => "list",
            Self::Stream => "stream",
            Self::Levels => "levels",
            Self::Batch => "batch",
            Self::Steps => "steps",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "list" => Self::List,
            "stream" => Self::Stream,
            "levels" => Self::Levels,
            "batch" => Self::Batch,
            "steps" => Self::Steps,
            other => panic!("unknown transport {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_reliable_list() {
    ledger_run(Transport::List).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_stream() {
    ledger_run(Transport::Stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_priorities_rate_limit() {
    ledger_run(Transport::Levels).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_batch_handler() {
    ledger_run(Transport::Batch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_steps() {
    ledger_run(Transport::Steps).await;
}

/// The levels of the `Levels` queue.
const LEVELS: u8 = 3;

// ---------------------------------------------------------------------------------------------
// The run.

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number")),
    )
}

#[allow(clippy::too_many_lines)]
async fn ledger_run(transport: Transport) {
    let n = env_u64("RUSTSTREAM_LEDGER_N").map_or(DEFAULT_N, |v| u32::try_from(v).unwrap());
    let seed = env_u64("RUSTSTREAM_LEDGER_SEED").unwrap_or_else(|| fastrand::u64(..));
    let name = transport.name();
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = std::env::temp_dir().join(unique(&format!("ledger-{name}")));
    std::fs::create_dir_all(dir.join("data")).unwrap();
    println!(
        "ledger {name}: n={n} seed={seed} (replay: RUSTSTREAM_LEDGER_SEED={seed}), workers' logs in {}",
        dir.display()
    );
    let redis = OwnRedis::start(dir.join("data"), OwnRedis::free_port()).await;
    let url = redis.url();
    let proxy = Proxy::start(&format!("127.0.0.1:{}", redis.port)).await;
    let r = inspector(&url).await;
    let mut run = Run {
        transport,
        seed,
        dir: dir.clone(),
        redis,
        killed: Vec::new(),
        proxy,
        r: r.clone(),
        workers: Vec::new(),
        spawned: 0,
        ledgers: Vec::new(),
        gate: Arc::new(tokio::sync::Mutex::new(())),
        published: Arc::new(AtomicU64::new(0)),
        live: Live::default(),
    };
    for _ in 0..WORKERS {
        let w = run.spawn_worker();
        run.workers.push(w);
    }
    for w in &run.workers {
        w.process.ready(Duration::from_secs(30)).await;
    }

    let published = run.published.clone();
    let publisher = tokio::spawn(publish_all(
        url.clone(),
        transport,
        n,
        run.gate.clone(),
        published.clone(),
    ));

    // Faults, while publishing: spread over 5-90 % of the messages published. Meanwhile the
    // watchdog fails the run as soon as a live worker handles nothing while work is queued.
    let live = run.live.clone();
    let stalled = watchdog(r.clone(), transport, live);
    tokio::pin!(stalled);
    let plan = fault_plan(&mut rng, n);
    let mut counts: HashMap<Fault, usize> = HashMap::new();
    let mut in_flight = Vec::new();
    let mut skipped = 0;
    for (i, &fault) in plan.iter().enumerate() {
        let at = 0.05 + 0.85 * (i as f64 + rng.f64()) / plan.len() as f64;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let at = (f64::from(n) * at) as u64;
        let injected = async {
            wait_until(
                &format!("{at} of {n} messages published before fault {i} ({fault})"),
                Duration::from_secs(120),
                || async { published.load(Ordering::SeqCst) >= at },
            )
            .await;
            run.inject(fault, n, &mut rng).await
        };
        let injected = tokio::select! {
            held = injected => held,
            stuck = &mut stalled => panic!("ledger {name}: before fault {i} ({fault}): {stuck}"),
        };
        let Some(held) = injected else {
            println!("ledger {name}: fault {i} {fault} skipped: nothing left to settle");
            skipped += 1;
            continue;
        };
        println!(
            "ledger {name}: fault {i} {fault} after {at} published, {} finished ({:.1?}): {held} in flight",
            progress(&r, &run.ledgers).await.unwrap_or_default(),
            started.elapsed()
        );
        *counts.entry(fault).or_default() += 1;
        in_flight.push((fault, held));
    }

    let never: Vec<Fault> = [
        Fault::Kill,
        Fault::CutAll,
        Fault::CutSettle,
        Fault::CutClaim,
        Fault::Restart,
        Fault::Oom,
    ]
    .into_iter()
    .filter(|f| !counts.contains_key(f))
    .collect();
    assert!(
        never.is_empty(),
        "ledger {name}: faults never injected (all skipped): {never:?}"
    );

    // The end: every id acked or dead, nothing left, within a bound.
    let limit = Duration::from_secs(u64::from(n / RATE) + 90);
    let ended = tokio::time::timeout(limit.saturating_sub(started.elapsed()), async {
        loop {
            let done = published.load(Ordering::SeqCst) == u64::from(n)
                && drained(&r, transport).await == Some(true)
                && match dead_letters(&r).await {
                    Some(dead) => {
                        let mut ids: HashSet<u32> = acks(&run.ledgers).into_keys().collect();
                        ids.extend(dead.into_iter().filter_map(|(id, _)| id));
                        ids.len() == n as usize
                    }
                    None => false,
                };
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    let finished = tokio::select! {
        finished = ended => finished,
        stuck = &mut stalled => panic!("ledger {name}: after the faults: {stuck}"),
    };
    if finished.is_err() {
        println!(
            "ledger {name}: not done after {limit:?}: {}",
            stuck(&run, n).await
        );
    }
    bounded("the publisher ends", Duration::from_secs(30), publisher)
        .await
        .expect("the publisher");
    for w in std::mem::take(&mut run.workers) {
        w.process.stop(Duration::from_secs(20)).await;
    }
    println!("ledger {name}: worker logs: {}", log_summary(&dir));

    // The account.
    let acked = acks(&run.ledgers);
    let dead = dead_letters(&r).await.expect("the dead letters");
    let mut dead_by: HashMap<u32, u32> = HashMap::new();
    let mut reasons: HashMap<String, usize> = HashMap::new();
    let mut strays = 0;
    for (id, reason) in &dead {
        *reasons.entry(reason.clone()).or_default() += 1;
        match id {
            Some(id) if *id < n => *dead_by.entry(*id).or_default() += 1,
            _ => strays += 1,
        }
    }
    let missing: Vec<u32> = (0..n)
        .filter(|id| !acked.contains_key(id) && !dead_by.contains_key(id))
        .collect();
    let acked_twice: u32 = acked.values().map(|c| c - 1).sum();
    let dead_twice: u32 = dead_by.values().map(|c| c - 1).sum();
    let acked_and_dead = acked.keys().filter(|id| dead_by.contains_key(id)).count();
    let duplicates = acked_twice as usize + dead_twice as usize + acked_and_dead;
    // Only a kill (of a worker, or of the server) can duplicate: a cut loses a request or its
    // reply, and fred sends it again within the lease (settles are idempotent, a lost claim is
    // swept and handled once); under maxmemory every script runs (allow-oom).
    let sum = |kinds: &[Fault]| -> usize {
        in_flight
            .iter()
            .filter(|(f, _)| kinds.contains(f))
            .map(|(_, held)| held)
            .sum()
    };
    let bound = sum(&[Fault::Kill, Fault::Restart]);
    let harmless = sum(&[Fault::CutAll, Fault::CutSettle, Fault::CutClaim, Fault::Oom]);
    let keys: Vec<String> = q(r.custom(fred::cmd!("KEYS"), vec!["*"]))
        .await
        .expect("KEYS");
    let mut allowed = vec![key(".dead")];
    if transport == Transport::Stream {
        allowed.push(QUEUE.to_owned());
    }
    if transport == Transport::Levels {
        // The limiter's state, which expires within a second of the last claim.
        allowed.push(key(".rate"));
    }
    // The dashboard's history (bounded by its ttl) is not left behind. A step record written
    // after its message was settled is set apart (see `check_steps`).
    let late_prefix = key(".steps:");
    let (late_records, stray_keys): (Vec<&String>, Vec<&String>) = keys
        .iter()
        .filter(|k| !allowed.contains(k) && !harness::is_history(k))
        .partition(|k| transport == Transport::Steps && k.starts_with(&late_prefix));
    let mut faults: Vec<_> = counts.iter().collect();
    faults.sort();
    let mut faults: Vec<String> = faults.iter().map(|(f, c)| format!("{f}={c}")).collect();
    if skipped > 0 {
        faults.push(format!("skipped={skipped}"));
    }
    let mut reason_list: Vec<_> = reasons.iter().collect();
    reason_list.sort();
    println!(
        "LEDGER {name}: published={n} acked={} dead={} ({}) missing={} duplicates={duplicates} (acked twice {acked_twice}, acked and dead {acked_and_dead}, dead twice {dead_twice}; bound {bound} = in flight at the kills and the restart; {harmless} at the cuts and OOM) faults: {} seed={seed} elapsed={:.1?}",
        acked.len(),
        dead.len(),
        reason_list
            .iter()
            .map(|(r, c)| format!("{r}={c}"))
            .collect::<Vec<_>>()
            .join(" "),
        missing.len(),
        faults.join(" "),
        started.elapsed()
    );

    assert!(
        finished.is_ok(),
        "ledger {name}: not done in {limit:?} (seed {seed})"
    );
    assert!(
        missing.is_empty(),
        "ledger {name}: {} ids neither acked nor dead-lettered (seed {seed}): {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    assert_eq!(strays, 0, "dead letters that are not jobs of this run");
    for reason in reasons.keys() {
        assert!(
            reason == "dropped" || reason == "max-attempts",
            "dead letters with reason {reason:?}"
        );
    }
    assert!(
        duplicates <= bound,
        "ledger {name}: {duplicates} duplicates, more than the {bound} messages in flight at the kills and the restart (seed {seed})"
    );
    assert!(
        stray_keys.is_empty(),
        "ledger {name}: keys left behind: {stray_keys:?}"
    );
    if transport == Transport::Steps {
        for record in &late_records {
            let ttl: i64 = q(r.pttl(record.as_str())).await.expect("PTTL");
            assert!(ttl > 0, "ledger steps: the step record {record} has no ttl");
        }
        let held = [sum(&[Fault::Kill]), sum(&[Fault::Restart])];
        check_steps(&run, &acked, held, late_records.len());
    }
    let _ = r.quit().await;
    drop(run);
    if std::env::var_os("RUSTSTREAM_LEDGER_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// How often the workers' logs say what matters here (recoveries, failures, reconnections).
fn log_summary(dir: &Path) -> String {
    const SAYINGS: [(&str, &str); 7] = [
        ("handler panicked", "panics"),
        ("went back to the queue", "list sweeps"),
        ("were claimed from their consumers", "stream sweeps"),
        ("receive failed", "receive errors"),
        ("settle failed", "settle errors"),
        ("not renewed", "lease errors"),
        ("redis connection lost", "connections lost"),
    ];
    let mut counts = [0usize; SAYINGS.len()];
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.path().extension().is_some_and(|e| e == "log") {
            let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
            for line in log.lines() {
                for (i, (saying, _)) in SAYINGS.iter().enumerate() {
                    counts[i] += usize::from(line.contains(saying));
                }
            }
        }
    }
    SAYINGS
        .iter()
        .zip(counts)
        .map(|((_, what), n)| format!("{what}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What is keeping a run from its end: ids neither acked nor dead, and where they are.
async fn stuck(run: &Run, n: u32) -> String {
    let r = &run.r;
    let acked = acks(&run.ledgers);
    let dead: HashSet<u32> = dead_letters(r)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(id, _)| id)
        .collect();
    let missing: Vec<u32> = (0..n)
        .filter(|id| !acked.contains_key(id) && !dead.contains(id))
        .collect();
    let list = |k: &'static str| async move {
        q(r.lrange::<Vec<Bytes>, _>(key(k), 0, -1))
            .await
            .unwrap_or_default()
            .into_iter()
            .map(Frame::decode)
            .filter_map(|f| Some((job_of(&f)?, f.attempt)))
            .collect::<Vec<_>>()
    };
    let delayed: Vec<String> = q(r.hkeys(key(".delayed.payloads")))
        .await
        .unwrap_or_default();
    let claims: u64 = q(r.zcard(key(".claims"))).await.unwrap_or_default();
    format!(
        "{} missing {:?}; drained={:?}; queue {:?}; processing {:?}; claims {claims}; delayed {}; group {:?}",
        missing.len(),
        &missing[..missing.len().min(20)],
        drained(r, run.transport).await,
        list("").await.iter().take(20).collect::<Vec<_>>(),
        list(".processing").await,
        delayed.len(),
        group_state(r).await,
    )
}
