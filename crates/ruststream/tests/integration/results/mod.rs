//! Job progress and results: a handler reports progress and sets a result
//! (`Context::progress`, `Context::set_result`), a producer in another app awaits it
//! (`publish().await_result(timeout)`) or reads it later (`Publisher::job_state`). Every test
//! runs a producer on a broker of its own and one or two worker apps, each on its own broker,
//! on the model (`memory`, virtual time), the standalone server and the cluster; the last test
//! is a `TestApp` on the virtual clock.

mod failures;
mod records;

use crate::harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Env, WAIT, bounded, on};
use ruststream::prelude::*;
use ruststream::testing::TestApp;
use ruststream::{Error, RunningApp, Source};
use tokio::sync::{Barrier, Semaphore};

on!(
    [memory, standalone, cluster] multi_thread:
    two_workers_return_results_to_a_producer_in_another_app,
    progress_is_readable_while_the_handler_runs,
    await_result_times_out_without_a_worker_and_the_result_is_read_later,
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

/// What the workers set as a job's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Done {
    n: u32,
    by: String,
}

/// Another message type, which a `Job` handler cannot decode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Other {
    text: String,
}

outgoing!(Other);

/// A reliable queue.
const KEY: &str = "{jobs}";

/// What a worker does with a job.
#[derive(Clone)]
enum Mode {
    /// Sets `Done { n: 2n }`.
    Double,
    /// Waits until as many handlers as the barrier counts run at once, then doubles.
    Meet(Arc<Barrier>),
    /// Reports progress 50, waits for a permit of the gate, then doubles.
    Gated(Arc<Semaphore>),
    Drop,
    Retry,
    /// Attempt 1 sets `n: 100` and retries; attempt 2 sets `n: 200`, reports progress, acks.
    Twice,
    /// Sets a result and records the error it got, if any; acks.
    Probe,
    /// Reports progress `"started"`, works this long, then doubles.
    Slow(Duration),
    /// Works `n` ms, sets `Done { n }` and records when in `stamps` (the latency probe).
    Stamp(Arc<Mutex<Vec<(u32, std::time::Instant)>>>),
}

#[derive(Clone)]
struct Worker {
    name: &'static str,
    mode: Mode,
    /// Attempts handled, recorded when the handler is done with the job's record.
    attempts: Arc<Mutex<Vec<u32>>>,
    /// Errors `set_result` returned.
    errors: Arc<Mutex<Vec<(ruststream::ErrorKind, String)>>>,
    /// Whether each delivery said its publisher awaits its result.
    awaited: Arc<Mutex<Vec<bool>>>,
}

impl Worker {
    fn new(name: &'static str, mode: Mode) -> Self {
        Self {
            name,
            mode,
            attempts: Arc::default(),
            errors: Arc::default(),
            awaited: Arc::default(),
        }
    }

    /// The same worker (shared records) under another name.
    fn named(&self, name: &'static str) -> Self {
        Self {
            name,
            ..self.clone()
        }
    }

    fn attempts(&self) -> Vec<u32> {
        let mut a = self.attempts.lock().expect("lock").clone();
        a.sort_unstable();
        a
    }

    async fn double(&self, job: &Job, ctx: &Context<'_>) -> Result<(), HandlerOutcome> {
        let done = Done {
            n: job.n * 2,
            by: self.name.to_owned(),
        };
        ctx.set_result(&done)
            .await
            .map_err(|_| HandlerOutcome::retry())
    }
}

impl Handle<Job> for Worker {
    async fn handle(&self, job: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        // Before the result is set: the awaiter may check it as soon as it has the result.
        self.awaited.lock().expect("lock").push(ctx.is_awaited());
        let outcome = match &self.mode {
            Mode::Double => self.double(job, ctx).await,
            Mode::Meet(barrier) => {
                // Bounded: a lone handler goes on, and the test's check of who handled fails.
                let _ = tokio::time::timeout(WAIT, barrier.wait()).await;
                self.double(job, ctx).await
            }
            Mode::Gated(gate) => {
                ctx.progress(&50u32).await.expect("progress");
                let permit = tokio::time::timeout(WAIT, gate.acquire()).await;
                drop(permit);
                self.double(job, ctx).await
            }
            Mode::Drop => Err(HandlerOutcome::drop()),
            Mode::Retry => Err(HandlerOutcome::retry()),
            Mode::Twice => {
                let first = ctx.attempt() == 1;
                let n = if first { 100 } else { 200 };
                let done = Done {
                    n,
                    by: self.name.to_owned(),
                };
                ctx.set_result(&done).await.expect("set_result");
                if first {
                    Err(HandlerOutcome::retry())
                } else {
                    ctx.progress(&9u32).await.expect("progress");
                    Ok(())
                }
            }
            Mode::Stamp(stamps) => {
                tokio::time::sleep(Duration::from_millis(job.n.into())).await;
                let done = Done {
                    n: job.n,
                    by: self.name.to_owned(),
                };
                // Stamped before the write: the latency includes its round trip.
                let at = std::time::Instant::now();
                stamps.lock().expect("lock").push((job.n, at));
                ctx.set_result(&done).await.expect("set_result");
                Ok(())
            }
            Mode::Slow(work) => {
                ctx.progress("started").await.expect("progress");
                tokio::time::sleep(*work).await;
                self.double(job, ctx).await
            }
            Mode::Probe => {
                if let Err(e) = ctx.set_result(&1u32).await {
                    self.errors
                        .lock()
                        .expect("lock")
                        .push((e.kind(), e.to_string()));
                }
                Ok(())
            }
        };
        // After: a test awaits these to know the handler (and its writes) finished.
        self.attempts.lock().expect("lock").push(ctx.attempt());
        outcome
    }
}

/// A reliable queue read one message at a time, retrying after 20 ms.
fn reliable(key: &str) -> RedisList {
    RedisList::new(key)
        .reliable()
        .concurrency(1)
        .retry(Backoff::fixed(Duration::from_millis(20)))
}

/// A worker app on a broker of its own (`configure`d), reading `source`.
async fn worker(
    env: &Env,
    source: impl Source<Broker = RedisBroker>,
    handler: Worker,
    configure: impl FnOnce(RedisBroker) -> RedisBroker,
) -> RunningApp {
    let app = RustStream::new(AppInfo::new("results-worker", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(env.broker_with(configure), move |b| {
            b.include(subscriber(source, handler).build());
        });
    env.start(app).await
}

/// Two worker apps on `KEY`, sharing `handler`'s records.
async fn two_workers(env: &Env, handler: &Worker) -> [RunningApp; 2] {
    [
        worker(env, reliable(KEY), handler.named("a"), |b| b).await,
        worker(env, reliable(KEY), handler.named("b"), |b| b).await,
    ]
}

/// The producer: a publisher on a broker of its own.
fn producer(env: &Env) -> Publisher {
    env.broker_with(|b| b).publisher()
}

async fn stop_all(env: &Env, apps: impl IntoIterator<Item = RunningApp>) {
    for app in apps {
        env.stop(app).await;
    }
}

/// The full key of job `id`'s record.
fn job_key(env: &Env, id: &str) -> String {
    env.key(&format!("ruststream:job:{{{id}}}"))
}

/// Publishes job `n` to `KEY` with an `id`, awaiting nothing.
async fn publish_job(publisher: &Publisher, n: u32, id: &str) {
    let job = Job { n };
    let sent = publisher.message(&job).to(KEY).id(id).publish();
    sent.await.expect("publish");
}

/// Publishes job `n` to `to` with an `id` and awaits its result for at most `timeout`.
async fn await_job(
    publisher: &Publisher,
    to: &str,
    n: u32,
    id: &str,
    timeout: Duration,
) -> ruststream::Result<Done> {
    let job = Job { n };
    let waiting = publisher
        .message(&job)
        .to(to)
        .id(id)
        .publish()
        .await_result::<Done>(timeout);
    bounded("await_result", timeout + WAIT, waiting).await
}

async fn two_workers_return_results_to_a_producer_in_another_app(env: &Env) {
    let handler = Worker::new("", Mode::Meet(Arc::new(Barrier::new(2))));
    let apps = two_workers(env, &handler).await;
    let publisher = producer(env);
    // No id given: await_result makes one.
    let (one, two) = tokio::join!(
        publisher
            .message(&Job { n: 1 })
            .to(KEY)
            .publish()
            .await_result::<Done>(WAIT),
        publisher
            .message(&Job { n: 2 })
            .to(KEY)
            .publish()
            .await_result::<Done>(WAIT),
    );
    let (one, two) = (one.expect("job 1's result"), two.expect("job 2's result"));
    assert_eq!((one.n, two.n), (2, 4));
    // Each worker takes one job at a time and each handler waited for the other: both ran.
    let mut by = vec![one.by, two.by];
    by.sort();
    assert_eq!(by, ["a", "b"]);
    assert_eq!(*handler.awaited.lock().expect("lock"), [true, true]);
    stop_all(env, apps).await;
}

async fn progress_is_readable_while_the_handler_runs(env: &Env) {
    let gate = Arc::new(Semaphore::new(0));
    let handler = Worker::new("", Mode::Gated(gate.clone()));
    let apps = two_workers(env, &handler).await;
    let publisher = producer(env);
    let waiting = tokio::spawn({
        let publisher = publisher.clone();
        async move { await_job(&publisher, KEY, 3, "job-3", WAIT).await }
    });
    env.eventually("the handler's progress is readable", async || {
        publisher.progress::<u32>("job-3").await.expect("progress") == Some(50)
    })
    .await;
    let state = publisher.job_state("job-3").await.expect("state");
    let state = state.expect("a record");
    assert!(!state.is_final(), "no result yet: {state:?}");
    assert!(!waiting.is_finished(), "the awaiter waits for the result");
    gate.add_permits(1);
    let done = bounded("the result", WAIT, waiting)
        .await
        .expect("the task")
        .expect("the result");
    assert_eq!(done.n, 6);
    let state = publisher.job_state("job-3").await.expect("state");
    let state = state.expect("a record");
    assert_eq!(state.result::<Done>().expect("decodes"), Some(done));
    assert_eq!(state.progress::<u32>().expect("decodes"), Some(50));
    stop_all(env, apps).await;
}

async fn await_result_times_out_without_a_worker_and_the_result_is_read_later(env: &Env) {
    let publisher = producer(env);
    let timeout = Duration::from_millis(300);
    let result = await_job(&publisher, KEY, 5, "late", timeout).await;
    match result {
        Err(e @ Error::ResultTimeout { .. }) => {
            assert!(e.to_string().contains("late"), "names the job: {e}");
            let Error::ResultTimeout { id, waited } = e else {
                unreachable!()
            };
            assert_eq!(id, "late");
            assert!(waited >= timeout, "waited {waited:?}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(env.llen(KEY).await, 1, "the job waits in the queue");
    assert_eq!(publisher.job_state("late").await.expect("state"), None);
    // A worker comes; the producer looks again by the job's id.
    let handler = Worker::new("w", Mode::Double);
    let app = worker(env, reliable(KEY), handler, |b| b).await;
    let done = bounded(
        "wait_result",
        WAIT * 2,
        publisher.wait_result::<Done>("late", WAIT),
    )
    .await
    .expect("the result");
    assert_eq!(done.n, 10);
    env.stop(app).await;
}

/// Not a timed test: measures how late `await_result` returns after the handler calls `set_result`, for
/// jobs working 0 to 99 ms (so the awaiter's polls are at every phase). Run it with
/// `scripts/test -p redstream --test integration results::probe_await_latency -- --ignored
/// --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a latency probe, not a test"]
async fn probe_await_latency() {
    let Some(env) = Env::open(harness::Topology::Standalone, "probe").await else {
        return;
    };
    let stamps = Arc::default();
    let app = worker(
        &env,
        reliable(KEY),
        Worker::new("w", Mode::Stamp(Arc::clone(&stamps))),
        |b| b,
    )
    .await;
    let publisher = producer(&env);
    let mut late = Vec::new();
    for n in 0..100 {
        let done = await_job(&publisher, KEY, n, &format!("probe-{n}"), WAIT)
            .await
            .expect("result");
        let returned = std::time::Instant::now();
        let stamped = stamps
            .lock()
            .expect("lock")
            .iter()
            .find(|(m, _)| *m == done.n)
            .map(|(_, at)| *at);
        late.push(returned - stamped.expect("stamped"));
    }
    late.sort();
    println!(
        "await_result after set_result: median {:?}, p90 {:?}, max {:?}",
        late[late.len() / 2],
        late[late.len() * 9 / 10],
        late[late.len() - 1]
    );
    env.stop(app).await;
    env.cleanup().await;
}

/// A `TestApp` on the virtual clock: a ten-minute job's progress, its awaited result, and its
/// record's expiry an hour later, in milliseconds of real time.
#[tokio::test(start_paused = true)]
async fn testapp_awaits_a_long_job_on_the_virtual_clock() {
    let app = RustStream::new(AppInfo::new("results", "0.0.0")).with_broker(
        RedisBroker::from_env(),
        |b| {
            let slow = Worker::new("slow", Mode::Slow(Duration::from_secs(600)));
            b.include(subscriber(reliable(KEY), slow).build());
        },
    );
    let tb = TestApp::start(app).await.expect("starts");
    let publisher = tb.broker::<RedisBroker>().broker().publisher();
    let started = tb.now();
    let waiting = tokio::spawn({
        let publisher = publisher.clone();
        async move { await_job(&publisher, KEY, 21, "slow", Duration::from_secs(3600)).await }
    });
    tb.advance(Duration::from_secs(300)).await.expect("advance");
    assert_eq!(
        publisher
            .progress::<String>("slow")
            .await
            .expect("progress"),
        Some("started".to_owned())
    );
    assert!(!waiting.is_finished(), "five minutes into a ten-minute job");
    tb.advance(Duration::from_secs(301)).await.expect("advance");
    let done = bounded("the result", Duration::from_secs(60), waiting)
        .await
        .expect("the task")
        .expect("the result");
    assert_eq!(done.n, 42);
    let took = tb.now().duration_since(started).expect("time moves on");
    assert!(took >= Duration::from_secs(600), "{took:?}");
    // The default ttl is an hour.
    tb.advance(ruststream::redis::DEFAULT_RESULT_TTL + Duration::from_secs(1))
        .await
        .expect("advance");
    assert_eq!(publisher.job_state("slow").await.expect("state"), None);
    tb.shutdown().await.expect("shuts down");
}
