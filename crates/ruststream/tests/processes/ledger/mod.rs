//! The ledger run: many messages, random outcomes, random faults, and an account of every message
//! at the end. One test per transport: `ledger_reliable_list` and `ledger_stream`;
//! `ledger_priorities_rate_limit`, the reliable list with three priority levels (each chunk
//! published onto one, in turn) behind a rate limit of 1,000 a second (issue 21: the claim's
//! gates over its levels); and `ledger_batch_handler`, the reliable list read by a batch handler
//! ([`BATCH`] a batch, each item settled as its own pick says; see [`Recorder`]'s
//! `HandleBatch`).
//!
//! - **Server.** A redis-server of the test's own ([`OwnRedis`]: `--appendonly yes --appendfsync
//!   always`, so a restart keeps everything acknowledged), no key prefix.
//! - **Messages.** The test publishes `N` jobs `{n}` (`n` in `0..N`, the ledger's id) to `{ledger}`
//!   at a steady rate ([`RATE`] a second, in chunks), on a direct connection.
//! - **Workers.** [`WORKERS`] processes (this test binary run again as
//!   `ledger::ledger_worker_process`, as `faults.rs` does), each a subscription with
//!   concurrency [`CONCURRENCY`], `min_idle` [`MIN_IDLE`] and [`MAX_ATTEMPTS`] attempts,
//!   connected through a [`Proxy`] that can cut their connections. The handler picks an outcome from the seed, the job's id and its attempt
//!   ([`pick`]): ack, retry, retry_after (100-400 ms), drop, panic, or slow (sleeps [`SLOW`],
//!   longer than `min_idle`, then acks), after 10-100 ms of work.
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
//! - **Watchdog.** Throughout, a live worker whose ledger has not grown for [`SILENCE`] while
//!   work was queued (entries in the list, or unread by the group) fails the run at once with
//!   its last log lines, whatever fault is going on. Every fault kind must have been injected
//!   at least once (the default size draws each).
//! - **Checks** (the test waits a bounded time for the end): every id is acked or dead-lettered
//!   (reason `dropped` or `max-attempts`); duplicates (an id acked more than once, or acked and
//!   dead-lettered, or dead-lettered twice) are at most the messages in flight at the kills of
//!   workers and of the server (the cuts and the OOM episode must duplicate nothing, see below);
//!   nothing is left: the queue, processing list, recovery set, delayed set and payloads are gone
//!   (for the stream, which keeps its entries, the group has nothing pending and nothing unread),
//!   and no key but the dead-letter list (and the stream) exists. It prints one line of counts.
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
//! they run two at a time, the four in about 35 s); the full run is
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

use crate::harness;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fred::bytes::Bytes;
use fred::prelude::*;
use harness::process::{WorkerProcess, serve_until_sigterm, test_name};
use harness::proxy::Proxy;
use harness::stand::OwnRedis;
use harness::{bounded, unique, wait_until};
use ruststream::prelude::*;
use ruststream::redis::frame::Frame;
use ruststream::{BatchContext, BatchOutcome, HandleBatch};

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
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Self::List => "list",
            Self::Stream => "stream",
            Self::Levels => "levels",
            Self::Batch => "batch",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "list" => Self::List,
            "stream" => Self::Stream,
            "levels" => Self::Levels,
            "batch" => Self::Batch,
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

/// The levels of the `Levels` queue.
const LEVELS: u8 = 3;

// ---------------------------------------------------------------------------------------------
// Outcomes.

/// What a handler does with one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    Ack,
    Retry,
    RetryAfter(Duration),
    Drop,
    Panic,
    Slow,
}

/// splitmix64's finaliser: spreads nearby inputs over the whole range.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The outcome and work time of job `n` on `attempt`, fixed by the seed.
fn pick(seed: u64, n: u32, attempt: u32) -> (Pick, Duration) {
    let mut rng =
        fastrand::Rng::with_seed(mix(seed ^ mix((u64::from(n) << 32) | u64::from(attempt))));
    let work = Duration::from_millis(rng.u64(10..=100));
    let pick = match rng.u32(..1000) {
        0..40 => Pick::Drop,
        40..120 => Pick::Retry,
        120..200 => Pick::RetryAfter(Duration::from_millis(rng.u64(100..=400))),
        200..260 => Pick::Panic,
        260..270 => Pick::Slow,
        _ => Pick::Ack,
    };
    (pick, work)
}

// ---------------------------------------------------------------------------------------------
// The worker process.

/// The stream consumer name of the worker with process id `pid`.
fn consumer_name(pid: u32) -> String {
    format!("ledger-{pid}")
}

/// A worker: the subscription on `RUSTSTREAM_LEDGER_WORKER` (the proxy's URL) with [`Recorder`]
/// as its handler; stops on SIGTERM.
#[test]
#[ignore = "the worker process of the ledger runs, which start it; does nothing on its own"]
fn ledger_worker_process() {
    let Ok(url) = std::env::var("RUSTSTREAM_LEDGER_WORKER") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let transport = Transport::parse(&var("RUSTSTREAM_LEDGER_TRANSPORT"));
    let seed: u64 = var("RUSTSTREAM_LEDGER_SEED").parse().unwrap();
    let ledger = PathBuf::from(var("RUSTSTREAM_LEDGER_FILE"));
    tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUSTSTREAM_LEDGER_WORKER_LOG").unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&ledger)
            .unwrap();
        let handler = Recorder { file, seed };
        // A plain retry goes straight back on the queue (`settle.lua`'s `r`), a retry_after
        // through the delayed set (`d`).
        let retry = Backoff::immediate();
        let block = Duration::from_millis(500);
        let list = RedisList::new(QUEUE)
            .reliable()
            .min_idle(MIN_IDLE)
            .concurrency(CONCURRENCY)
            .max_attempts(MAX_ATTEMPTS)
            .retry(retry)
            .block(block);
        let sub = match transport {
            Transport::List => subscriber(list, handler).build::<Job>(),
            // Room for three batches at once: a batch takes as long as its slowest item (one
            // in ten holds its batch for SLOW), so with one it would fall behind the publisher.
            Transport::Batch => subscriber(list.concurrency(3 * BATCH), handler)
                .batch(BATCH)
                .build::<Job>(),
            Transport::Levels => subscriber(
                list.priorities(LEVELS)
                    .rate_limit(1000, Duration::from_secs(1)),
                handler,
            )
            .build::<Job>(),
            Transport::Stream => subscriber(
                RedisStream::new(QUEUE)
                    .group(GROUP)
                    .consumer(consumer_name(std::process::id()))
                    .min_idle(MIN_IDLE)
                    .concurrency(CONCURRENCY)
                    .max_attempts(MAX_ATTEMPTS)
                    .retry(retry)
                    .block(block),
                handler,
            )
            .build::<Job>(),
        };
        serve_until_sigterm(
            RustStream::new(AppInfo::new("ledger-worker", "0"))
                .shutdown_timeout(Duration::from_secs(5))
                .with_broker(RedisBroker::standalone(url), |b| {
                    b.include(sub);
                }),
        )
        .await;
    });
}

/// The handler: does what [`pick`] says, writing the ledger.
struct Recorder {
    file: File,
    seed: u64,
}

impl Recorder {
    /// Appends `<what> <n> <attempt>`: one `write(2)`, so a SIGKILL never tears a line and loses
    /// nothing written.
    fn record(&self, what: char, n: u32, attempt: u32) {
        let line = format!("{what} {n} {attempt}\n");
        (&self.file)
            .write_all(line.as_bytes())
            .expect("write the ledger");
    }
}

impl Handle<Job> for Recorder {
    fn handle(
        &self,
        job: &Job,
        _: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        let (n, attempt) = (job.n, ctx.attempt());
        let (pick, work) = pick(self.seed, n, attempt);
        self.record('S', n, attempt);
        async move {
            tokio::time::sleep(work).await;
            match pick {
                Pick::Ack => {}
                Pick::Slow => tokio::time::sleep(SLOW).await,
                Pick::Retry => return Err(HandlerOutcome::retry()),
                Pick::RetryAfter(d) => return Err(HandlerOutcome::retry_after(d)),
                Pick::Drop => return Err(HandlerOutcome::drop()),
                Pick::Panic => panic!("ledger: job {n} panics on attempt {attempt}"),
            }
            self.record('A', n, attempt);
            Ok(())
        }
    }
}

/// The batch handler: each item's outcome and work time are its own [`pick`], as one message's
/// would be; the batch works as long as its longest item, sleeps [`SLOW`] more when any item is
/// slow (acking those), and panics when its first item's pick is a panic (every item then comes
/// back), the other items picking a panic being retried.
impl HandleBatch<Job> for Recorder {
    fn handle_batch(
        &self,
        jobs: &[Job],
        ctx: &mut BatchContext<'_>,
    ) -> impl Future<Output = BatchOutcome> + Send {
        let picks: Vec<(u32, u32, Pick, Duration)> = jobs
            .iter()
            .zip(ctx.infos())
            .map(|(job, info)| {
                let (pick, work) = pick(self.seed, job.n, info.attempt);
                self.record('S', job.n, info.attempt);
                (job.n, info.attempt, pick, work)
            })
            .collect();
        async move {
            let work = picks.iter().map(|p| p.3).max().unwrap_or_default();
            tokio::time::sleep(work).await;
            if let Some(&(n, attempt, Pick::Panic, _)) = picks.first() {
                panic!("ledger: the batch of job {n} panics on attempt {attempt}");
            }
            if picks.iter().any(|p| p.2 == Pick::Slow) {
                tokio::time::sleep(SLOW).await;
            }
            let each = picks
                .into_iter()
                .map(|(n, attempt, pick, _)| match pick {
                    Pick::Ack | Pick::Slow => {
                        self.record('A', n, attempt);
                        HandlerOutcome::ack()
                    }
                    Pick::Retry | Pick::Panic => HandlerOutcome::retry(),
                    Pick::RetryAfter(d) => HandlerOutcome::retry_after(d),
                    Pick::Drop => HandlerOutcome::drop(),
                })
                .collect();
            BatchOutcome::each(each)
        }
    }
}

/// A worker process and its ledger file.
struct Worker {
    process: WorkerProcess,
    ledger: PathBuf,
    log: PathBuf,
}

impl Worker {
    fn spawn(url: &str, transport: Transport, seed: u64, dir: &Path, k: usize) -> Self {
        let ledger = dir.join(format!("worker-{k}.ledger"));
        let log = dir.join(format!("worker-{k}.log"));
        let process = WorkerProcess::spawn(
            &test_name(module_path!(), "ledger_worker_process"),
            &[
                ("RUSTSTREAM_LEDGER_WORKER", url.to_owned()),
                ("RUSTSTREAM_LEDGER_TRANSPORT", transport.name().to_owned()),
                ("RUSTSTREAM_LEDGER_SEED", seed.to_string()),
                ("RUSTSTREAM_LEDGER_FILE", ledger.display().to_string()),
                // The handlers' panics are on purpose: no backtraces in the logs.
                ("RUST_BACKTRACE", "0".to_owned()),
            ],
            Some(log.clone()),
        );
        Self {
            process,
            ledger,
            log,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The ledger.

/// The complete lines of a worker's ledger: `(kind, n, attempt)`.
fn read_ledger(path: &Path) -> Vec<(u8, u32, u32)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let kind = f.next()?.bytes().next()?;
            Some((kind, f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect()
}

/// How many acks each id got, over all the ledgers.
fn acks(ledgers: &[PathBuf]) -> HashMap<u32, u32> {
    let mut acks = HashMap::new();
    for path in ledgers {
        for (kind, n, _) in read_ledger(path) {
            if kind == b'A' {
                *acks.entry(n).or_default() += 1;
            }
        }
    }
    acks
}

/// A job's id, from a frame's payload.
fn job_of(frame: &Frame) -> Option<u32> {
    serde_json::from_slice::<Job>(&frame.payload)
        .ok()
        .map(|j| j.n)
}

// ---------------------------------------------------------------------------------------------
// Looking at the server (a direct connection: it goes through no proxy).

/// Awaits a command, `None` when it fails or takes longer than 5 s (the server may be down).
async fn q<T>(f: impl Future<Output = Result<T, fred::error::Error>>) -> Option<T> {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .ok()?
        .ok()
}

async fn inspector(url: &str) -> Client {
    let mut config = Config::from_url(url).unwrap();
    config.fail_fast = false;
    let client = Builder::from_config(config)
        .set_policy(ReconnectPolicy::new_constant(0, 100))
        .build()
        .unwrap();
    bounded(
        "the inspector connects",
        Duration::from_secs(10),
        client.init(),
    )
    .await
    .unwrap();
    client
}

fn key(suffix: &str) -> String {
    format!("{QUEUE}{suffix}")
}

/// `v` as a number (integer or numeric text).
fn num(v: &Value) -> Option<u64> {
    match v {
        Value::Integer(i) => u64::try_from(*i).ok(),
        other => other.as_str().and_then(|s| s.parse().ok()),
    }
}

/// The field/value pairs of a RESP2 flat array or a RESP3 map.
fn fields(v: Value) -> HashMap<String, Value> {
    match v {
        Value::Map(m) => m
            .inner()
            .into_iter()
            .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v)))
            .collect(),
        Value::Array(items) => {
            let mut out = HashMap::new();
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                if let Some(k) = k.as_str() {
                    out.insert(k.to_string(), v);
                }
            }
            out
        }
        _ => HashMap::new(),
    }
}

/// Every claimed entry: the processing list's values, or the group's pending entry ids.
async fn claimed(r: &Client, transport: Transport) -> Option<HashSet<Bytes>> {
    match transport {
        Transport::List | Transport::Levels | Transport::Batch => {
            let values: Vec<Bytes> = q(r.lrange(key(".processing"), 0, -1)).await?;
            Some(values.into_iter().collect())
        }
        Transport::Stream => Some(
            pending(r, None)
                .await?
                .into_iter()
                .map(|(id, _)| id)
                .collect(),
        ),
    }
}

/// The group's pending entries `(id, consumer)`, of `consumer` only when given.
async fn pending(r: &Client, consumer: Option<&str>) -> Option<Vec<(Bytes, String)>> {
    let mut args: Vec<Value> = vec![QUEUE.into(), GROUP.into(), "-".into(), "+".into()];
    args.push(Value::Integer(1_000_000));
    args.extend(consumer.map(Value::from));
    let reply: Value = q(r.custom(fred::cmd!("XPENDING"), args)).await?;
    let Value::Array(rows) = reply else {
        return Some(Vec::new());
    };
    Some(
        rows.into_iter()
            .filter_map(|row| {
                let Value::Array(row) = row else { return None };
                let id = row.first()?.as_bytes()?.to_vec().into();
                let consumer = row.get(1)?.as_string()?;
                Some((id, consumer))
            })
            .collect(),
    )
}

/// Whether nothing is left to do: the queue, processing list, recovery set, delayed set and
/// payloads are gone (stream: nothing pending, nothing unread, no delayed set). `None`: unknown.
async fn drained(r: &Client, transport: Transport) -> Option<bool> {
    match transport {
        Transport::List | Transport::Levels | Transport::Batch => {
            let keys = [
                "",
                ".p1",
                ".p2",
                ".processing",
                ".claims",
                ".delayed",
                ".delayed.payloads",
            ];
            let n: i64 = q(r.exists(keys.map(key).to_vec())).await?;
            Some(n == 0)
        }
        Transport::Stream => {
            let n: i64 = q(r.exists(vec![key(".delayed"), key(".delayed.payloads")])).await?;
            let (pending, lag) = group_state(r).await?;
            Some(n == 0 && pending == 0 && lag == 0)
        }
    }
}

/// The stream group's `(pending, lag)` (`XINFO GROUPS`).
async fn group_state(r: &Client) -> Option<(u64, u64)> {
    let groups: Value = q(r.custom(fred::cmd!("XINFO"), vec!["GROUPS", QUEUE])).await?;
    let Value::Array(groups) = groups else {
        return None;
    };
    groups.into_iter().map(fields).find_map(|g| {
        (g.get("name")?.as_str()? == GROUP).then_some(())?;
        Some((num(g.get("pending")?)?, num(g.get("lag")?)?))
    })
}

/// The dead letters: `(job id, reason)` (`None` for an entry that is not a job).
async fn dead_letters(r: &Client) -> Option<Vec<(Option<u32>, String)>> {
    let values: Vec<Bytes> = q(r.lrange(key(".dead"), 0, -1)).await?;
    Some(
        values
            .into_iter()
            .map(|v| {
                let f = Frame::decode(v);
                let reason = f
                    .headers
                    .get(ruststream::redis::REASON_HEADER)
                    .cloned()
                    .unwrap_or_default();
                (job_of(&f), reason)
            })
            .collect(),
    )
}

/// Ids acked or dead-lettered so far (an estimate while running: the dead letters are counted).
async fn progress(r: &Client, ledgers: &[PathBuf]) -> Option<u64> {
    let dead: i64 = q(r.llen(key(".dead"))).await?;
    Some(acks(ledgers).len() as u64 + u64::try_from(dead).unwrap_or(0))
}

/// `CLIENT PAUSE <ms> WRITE`: the server runs no write command until unpaused.
async fn pause_writes(r: &Client, ms: u64) {
    let _: Option<Value> = q(r.custom(
        fred::cmd!("CLIENT"),
        vec!["PAUSE".to_owned(), ms.to_string(), "WRITE".to_owned()],
    ))
    .await;
}

async fn used_memory(r: &Client) -> u64 {
    let info: String = q(r.custom(fred::cmd!("INFO"), vec!["memory"]))
        .await
        .expect("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

async fn config_set(r: &Client, name: &str, value: &str) {
    let _: Value = q(r.custom(fred::cmd!("CONFIG"), vec!["SET", name, value]))
        .await
        .unwrap_or_else(|| panic!("CONFIG SET {name} {value}"));
}

// ---------------------------------------------------------------------------------------------
// Publishing.

/// Publishes jobs `0..n` at [`RATE`] a second, holding `gate` for each publish: a restart or the
/// OOM episode takes it, so no publish is in flight then (a publish retried after a lost reply
/// would duplicate messages; that is the publisher's business, not the consumers').
async fn publish_all(
    url: String,
    transport: Transport,
    n: u32,
    gate: Arc<tokio::sync::Mutex<()>>,
    published: Arc<AtomicU64>,
) {
    let mut broker = RedisBroker::standalone(url);
    if transport == Transport::Stream {
        broker = broker.route(QUEUE, stream::Publish::new());
    }
    if transport == Transport::Levels {
        broker = broker.route(QUEUE, list::Publish::new().priorities(LEVELS));
    }
    broker.connect().await.expect("the publisher connects");
    let publisher = broker.publisher();
    let mut tick = tokio::time::interval(Duration::from_millis(u64::from(1000 * CHUNK / RATE)));
    for first in (0..n).step_by(CHUNK as usize) {
        tick.tick().await;
        let jobs: Vec<Job> = (first..(first + CHUNK).min(n)).map(|n| Job { n }).collect();
        let _gate = gate.lock().await;
        let mut chunk = publisher.messages(&jobs).to(QUEUE);
        if transport == Transport::Levels {
            chunk = chunk.priority(u8::try_from(first / CHUNK % u32::from(LEVELS)).unwrap());
        }
        bounded("a publish", Duration::from_secs(30), chunk.publish())
            .await
            .expect("a publish succeeds: the restart and the OOM episode wait for it");
        published.fetch_add(jobs.len() as u64, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------------
// Faults.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fault {
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
fn fault_plan(rng: &mut fastrand::Rng, n: u32) -> Vec<Fault> {
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
/// (`claim.lua`'s keys, or `read.lua`'s), for [`Proxy::cut_after`].
fn needle(transport: Transport, fault: Fault, rng: &mut fastrand::Rng) -> Vec<u8> {
    let bulk = |s: &str| format!("${}\r\n{s}", s.len());
    let text = match (transport, fault) {
        (Transport::List | Transport::Levels | Transport::Batch, Fault::CutSettle) => {
            format!("{QUEUE}.processing\r\n{}", bulk(&key(".dead")))
        }
        (Transport::List | Transport::Levels | Transport::Batch, _) => {
            format!("{QUEUE}.processing\r\n{}", bulk(&key(".claims")))
        }
        (Transport::Stream, Fault::CutSettle) if rng.bool() => "\r\nXACK\r\n".to_owned(),
        (Transport::Stream, Fault::CutSettle) => {
            format!("{QUEUE}.dead\r\n{}", bulk(&key(".delayed")))
        }
        (Transport::Stream, _) => format!("{QUEUE}\r\n{}", bulk(&key(".cancels"))),
    };
    text.into_bytes()
}

/// Everything a run has: the server, the proxy, the workers and their ledgers.
struct Run {
    transport: Transport,
    seed: u64,
    dir: PathBuf,
    redis: OwnRedis,
    /// Servers killed by the restart (kept so their drop does not remove the data directory
    /// under the live one).
    killed: Vec<OwnRedis>,
    proxy: Proxy,
    r: Client,
    workers: Vec<Worker>,
    spawned: usize,
    /// Every worker's ledger, the dead ones' too.
    ledgers: Vec<PathBuf>,
    gate: Arc<tokio::sync::Mutex<()>>,
    /// Messages published so far.
    published: Arc<AtomicU64>,
    /// The live workers' ledgers and logs, for the [`watchdog`].
    live: Live,
}

impl Run {
    fn spawn_worker(&mut self) -> Worker {
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
    async fn inject(&mut self, fault: Fault, n: u32, rng: &mut fastrand::Rng) -> Option<usize> {
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
            Transport::List | Transport::Levels | Transport::Batch => {
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
type Live = Arc<std::sync::Mutex<Vec<(PathBuf, PathBuf)>>>;

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether work is waiting for a reader: entries in the list, or entries of the stream its
/// group has not read. `None`: unknown (the server may be down).
async fn queued(r: &Client, transport: Transport) -> Option<bool> {
    match transport {
        Transport::List | Transport::Batch => q(r.llen::<i64, _>(key(""))).await.map(|n| n > 0),
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
async fn watchdog(r: Client, transport: Transport, live: Live) -> String {
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
    let stray_keys: Vec<&String> = keys.iter().filter(|k| !allowed.contains(k)).collect();
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
