//! The ledger's workers: what a handler does with a delivery (its pick, fixed by the seed), the
//! worker process, and its ledger file.

use crate::harness;

use std::collections::HashMap;
use std::convert::Infallible;
use std::fs::File;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use harness::process::{WorkerProcess, serve_until_sigterm, test_name};
use ruststream::prelude::*;
use ruststream::redis::frame::Frame;
use ruststream::{BatchContext, BatchOutcome, HandleBatch};

use super::{
    BATCH, CONCURRENCY, GROUP, Job, LEVELS, MAX_ATTEMPTS, MIN_IDLE, QUEUE, SLOW, STEPS, Transport,
};

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

/// Where the steps handler of job `n` on `attempt` does its pick: before step `k` (`0..STEPS`),
/// or after the last step (`STEPS`). Fixed by the seed.
fn pick_at(seed: u64, n: u32, attempt: u32) -> u32 {
    let mut rng =
        fastrand::Rng::with_seed(mix(!seed ^ mix((u64::from(attempt) << 32) | u64::from(n))));
    rng.u32(..=STEPS)
}

// ---------------------------------------------------------------------------------------------
// The worker process.

/// The stream consumer name of the worker with process id `pid`.
pub(super) fn consumer_name(pid: u32) -> String {
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
            Transport::Steps => subscriber(list, Stepper(handler)).build::<Job>(),
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
            act(pick, n, attempt).await?;
            self.record('A', n, attempt);
            Ok(())
        }
    }
}

/// Does what `pick` says: returns for an ack (after [`SLOW`] for a slow one), fails or panics
/// for the others.
async fn act(pick: Pick, n: u32, attempt: u32) -> Result<(), HandlerOutcome> {
    match pick {
        Pick::Ack => Ok(()),
        Pick::Slow => {
            tokio::time::sleep(SLOW).await;
            Ok(())
        }
        Pick::Retry => Err(HandlerOutcome::retry()),
        Pick::RetryAfter(d) => Err(HandlerOutcome::retry_after(d)),
        Pick::Drop => Err(HandlerOutcome::drop()),
        Pick::Panic => panic!("ledger: job {n} panics on attempt {attempt}"),
    }
}

/// The steps handler: [`STEPS`] durable steps, the pick done before one of them (or after the
/// last, [`pick_at`]). A step's effect is an `E <n> <step>` line in the ledger, written only by
/// a run of its closure; a step whose closure ran but whose record failed to write also writes
/// `W <n> <step>` (it will run again, as the promise allows), and a step that returned another
/// step's result `M <n> <step>`.
struct Stepper(Recorder);

impl Stepper {
    async fn step(&self, ctx: &Context<'_>, n: u32, k: u32) -> Result<(), HandlerOutcome> {
        let ran = AtomicBool::new(false);
        let name = format!("step-{k}");
        let done = ctx
            .step(&name, || async {
                ran.store(true, Ordering::Relaxed);
                self.0.record('E', n, k);
                Ok::<_, Infallible>(k)
            })
            .await;
        match done {
            Ok(recorded) => {
                if recorded != k {
                    self.0.record('M', n, k);
                }
                Ok(())
            }
            Err(e) => {
                if ran.load(Ordering::Relaxed) {
                    self.0.record('W', n, k);
                }
                Err(e.into())
            }
        }
    }
}

impl Handle<Job> for Stepper {
    async fn handle(&self, job: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let (n, attempt) = (job.n, ctx.attempt());
        let (pick, work) = pick(self.0.seed, n, attempt);
        let at = pick_at(self.0.seed, n, attempt);
        self.0.record('S', n, attempt);
        tokio::time::sleep(work).await;
        for k in 0..=STEPS {
            if k == at {
                act(pick, n, attempt).await?;
            }
            if k < STEPS {
                self.step(ctx, n, k).await?;
            }
        }
        self.0.record('A', n, attempt);
        Ok(())
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
pub(super) struct Worker {
    pub(super) process: WorkerProcess,
    pub(super) ledger: PathBuf,
    pub(super) log: PathBuf,
}

impl Worker {
    pub(super) fn spawn(url: &str, transport: Transport, seed: u64, dir: &Path, k: usize) -> Self {
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

/// The complete lines of a worker's ledger: `(kind, n, attempt)` (`(kind, n, step)` for the
/// steps' `E` and `W` lines).
pub(super) fn read_ledger(path: &Path) -> Vec<(u8, u32, u32)> {
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

/// What the steps handlers wrote, over all the ledgers.
#[derive(Debug, Default)]
pub(super) struct StepEffects {
    /// How many times each step's effect ran (`E` lines), by `(n, step)`.
    pub(super) runs: HashMap<(u32, u32), u32>,
    /// Steps whose effect ran and whose record failed to write (`W` lines).
    pub(super) unrecorded: u32,
    /// Steps that returned another step's result (`M` lines).
    pub(super) mixed_up: u32,
}

pub(super) fn step_effects(ledgers: &[PathBuf]) -> StepEffects {
    let mut effects = StepEffects::default();
    for path in ledgers {
        for (kind, n, k) in read_ledger(path) {
            match kind {
                b'E' => *effects.runs.entry((n, k)).or_default() += 1,
                b'W' => effects.unrecorded += 1,
                b'M' => effects.mixed_up += 1,
                _ => {}
            }
        }
    }
    effects
}

/// How many acks each id got, over all the ledgers.
pub(super) fn acks(ledgers: &[PathBuf]) -> HashMap<u32, u32> {
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
pub(super) fn job_of(frame: &Frame) -> Option<u32> {
    serde_json::from_slice::<Job>(&frame.payload)
        .ok()
        .map(|j| j.n)
}
