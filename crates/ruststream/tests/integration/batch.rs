//! Batch handlers (`subscriber(..).batch(n).max_wait(d)`, `#[subscriber(.., batch = n)]`) on a
//! simple list, a reliable list and a stream, on the in-memory model, the standalone server and
//! the cluster (`name::memory`, `name::standalone`, `name::cluster`, see `harness`): full
//! batches, a quiet queue's partial batch, per-item outcomes, undecodable items, panics, and the
//! configuration refused at startup. The TestApp tests at the end use the macro form on the
//! paused clock.

use crate::harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Env, WAIT, on, wait_until};
use ruststream::prelude::*;
use ruststream::testing::TestApp;
use ruststream::{BatchContext, BatchOutcome, HandleBatch, Settlement};

on!(
    [memory, standalone, cluster] multi_thread:
    a_simple_list_hands_over_full_batches,
    a_reliable_list_hands_over_full_batches,
    a_stream_hands_over_full_batches,
    a_quiet_simple_list_hands_over_a_partial_batch,
    a_quiet_reliable_list_hands_over_a_partial_batch,
    a_quiet_stream_hands_over_a_partial_batch,
    per_item_outcomes_on_a_reliable_list,
    per_item_outcomes_on_a_stream,
    an_undecodable_item_is_dead_lettered_and_the_rest_handled,
    a_panic_retries_every_item,
    shutdown_hands_over_a_partial_batch,
);

on!([memory, standalone] bad_batch_sizes_are_refused_at_startup);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

/// Each batch as the handler saw it: `(n, attempt)` per item.
type Seen = Arc<Mutex<Vec<Vec<(u32, u32)>>>>;

/// What a [`Recorder`] answers for a batch: one outcome per `(job, attempt)`, or a panic.
type Decide = fn(&[(u32, u32)]) -> BatchOutcome;

/// A batch handler that records every batch, then settles it as `decide` says.
#[derive(Clone)]
struct Recorder {
    seen: Seen,
    decide: Decide,
}

impl Recorder {
    fn new(decide: Decide) -> Self {
        let seen = Seen::default();
        Self { seen, decide }
    }

    fn acking() -> Self {
        Self::new(|_| BatchOutcome::ack())
    }

    fn batches(&self) -> Vec<Vec<(u32, u32)>> {
        self.seen.lock().expect("lock").clone()
    }

    fn items(&self) -> usize {
        self.batches().iter().map(Vec::len).sum()
    }
}

impl HandleBatch<Job> for Recorder {
    async fn handle_batch(&self, jobs: &[Job], ctx: &mut BatchContext<'_>) -> BatchOutcome {
        assert_eq!(jobs.len(), ctx.len(), "one delivery per item");
        let batch: Vec<(u32, u32)> = jobs
            .iter()
            .zip(ctx.infos())
            .map(|(j, info)| (j.n, info.attempt))
            .collect();
        self.seen.lock().expect("lock").push(batch.clone());
        (self.decide)(&batch)
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Simple,
    Reliable,
    Stream,
}

/// The key of each kind's queue (tagged, as a cluster needs).
fn key(kind: Kind) -> &'static str {
    match kind {
        Kind::Simple | Kind::Reliable => "{q}",
        Kind::Stream => "{s}",
    }
}

/// A broker that publishes `{s}` as a stream, so a test can fill it before the app starts.
fn broker(env: &Env) -> RedisBroker {
    env.broker_with(|b| b.route("{s}", stream::Publish::new()))
}

/// An app with one batch subscriber of `size`, `max_wait` and `concurrency` on `kind`'s queue.
fn app(
    broker: &RedisBroker,
    kind: Kind,
    (size, max_wait, concurrency): (usize, Duration, usize),
    handler: &Recorder,
) -> RustStream {
    let handler = handler.clone();
    let retry = Backoff::fixed(Duration::from_millis(50));
    RustStream::new(AppInfo::new("batch-test", "0.0.0")).with_broker(broker.clone(), move |b| {
        let q = key(kind);
        let sub = match kind {
            Kind::Simple => subscriber(RedisList::new(q).concurrency(concurrency), handler)
                .batch(size)
                .max_wait(max_wait)
                .build(),
            Kind::Reliable => {
                let source = RedisList::new(q).reliable().concurrency(concurrency);
                let sub = subscriber(source.retry(retry), handler).batch(size);
                sub.max_wait(max_wait).build()
            }
            Kind::Stream => {
                let source = RedisStream::new(q).group("g").concurrency(concurrency);
                let sub = subscriber(source.retry(retry), handler).batch(size);
                sub.max_wait(max_wait).build()
            }
        };
        b.include(sub);
    })
}

async fn publish(broker: &RedisBroker, kind: Kind, ns: impl IntoIterator<Item = u32>) {
    for n in ns {
        broker
            .publisher()
            .message(&Job { n })
            .to(key(kind))
            .publish()
            .await
            .expect("publish");
    }
}

/// Entries claimed and not settled: the processing list, or the group's pending entries.
async fn claimed(env: &Env, kind: Kind) -> i64 {
    match kind {
        Kind::Simple => 0,
        Kind::Reliable => env.llen("{q}.processing").await,
        Kind::Stream => env.pending("{s}", "g").await,
    }
}

/// Waits until `rec` has seen `n` items and none is left claimed.
async fn handled_and_settled(env: &Env, kind: Kind, rec: &Recorder, n: usize) {
    wait_until("the items handled", WAIT, async || rec.items() == n).await;
    wait_until("nothing claimed", WAIT, async || {
        claimed(env, kind).await == 0
    })
    .await;
}

// Full batches ------------------------------------------------------------------------------

async fn full_batches(env: &Env, kind: Kind) {
    const N: usize = 10;
    let broker = broker(env);
    broker.connect().await.expect("connect");
    publish(&broker, kind, 0..30).await;
    let rec = Recorder::acking();
    // A long wait: a partial batch here would be a batcher that did not wait for a full one.
    let app = env
        .start(app(&broker, kind, (N, Duration::from_secs(5), 2 * N), &rec))
        .await;
    handled_and_settled(env, kind, &rec, 30).await;
    env.stop(app).await;

    let batches = rec.batches();
    assert!(
        batches.iter().all(|b| b.len() == N),
        "batches of {N}: {batches:?}"
    );
    let mut ns: Vec<u32> = batches.iter().flatten().map(|(n, _)| *n).collect();
    ns.sort_unstable();
    assert_eq!(ns, (0..30).collect::<Vec<_>>(), "each job once");
}

async fn a_simple_list_hands_over_full_batches(env: &Env) {
    full_batches(env, Kind::Simple).await;
    assert_eq!(env.llen("{q}").await, 0);
}

async fn a_reliable_list_hands_over_full_batches(env: &Env) {
    full_batches(env, Kind::Reliable).await;
    assert_eq!(env.llen("{q}").await, 0);
}

async fn a_stream_hands_over_full_batches(env: &Env) {
    full_batches(env, Kind::Stream).await;
}

// A quiet queue ------------------------------------------------------------------------------

async fn partial_batch(env: &Env, kind: Kind) {
    let broker = broker(env);
    let rec = Recorder::acking();
    let app = env
        .start(app(
            &broker,
            kind,
            (10, Duration::from_millis(200), 20),
            &rec,
        ))
        .await;
    publish(&broker, kind, 0..3).await;
    handled_and_settled(env, kind, &rec, 3).await;
    env.stop(app).await;

    let batches = rec.batches();
    assert!(batches.iter().all(|b| b.len() < 10), "{batches:?}");
    let ns: Vec<u32> = batches.iter().flatten().map(|(n, _)| *n).collect();
    assert_eq!(ns, [0, 1, 2], "in delivery order: {batches:?}");
}

async fn a_quiet_simple_list_hands_over_a_partial_batch(env: &Env) {
    partial_batch(env, Kind::Simple).await;
}

async fn a_quiet_reliable_list_hands_over_a_partial_batch(env: &Env) {
    partial_batch(env, Kind::Reliable).await;
}

async fn a_quiet_stream_hands_over_a_partial_batch(env: &Env) {
    partial_batch(env, Kind::Stream).await;
}

// Per-item outcomes --------------------------------------------------------------------------

/// Job 1 is acked, job 2 retried once, job 3 dropped.
fn one_of_each(batch: &[(u32, u32)]) -> BatchOutcome {
    BatchOutcome::each(
        batch
            .iter()
            .map(|&(n, attempt)| match (n, attempt) {
                (2, 1) => HandlerOutcome::retry(),
                (3, _) => HandlerOutcome::drop(),
                _ => HandlerOutcome::ack(),
            })
            .collect(),
    )
}

async fn per_item_outcomes(env: &Env, kind: Kind) {
    let broker = broker(env);
    broker.connect().await.expect("connect");
    publish(&broker, kind, 1..=3).await;
    let rec = Recorder::new(one_of_each);
    let app = env
        .start(app(&broker, kind, (3, Duration::from_millis(200), 6), &rec))
        .await;
    handled_and_settled(env, kind, &rec, 4).await;
    wait_until("a dead letter", WAIT, async || {
        env.llen(&dead(kind)).await == 1
    })
    .await;
    env.stop(app).await;

    assert_eq!(
        rec.batches(),
        [vec![(1, 1), (2, 1), (3, 1)], vec![(2, 2)]],
        "the retried item comes back alone, on its second attempt"
    );
    let dead = env.frames(&dead(kind)).await;
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("dropped")
    );
    assert_eq!(
        dead[0].payload,
        serde_json::to_vec(&Job { n: 3 }).expect("json")
    );
}

fn dead(kind: Kind) -> String {
    format!("{}.dead", key(kind))
}

async fn per_item_outcomes_on_a_reliable_list(env: &Env) {
    per_item_outcomes(env, Kind::Reliable).await;
    assert_eq!(env.llen("{q}").await, 0);
}

async fn per_item_outcomes_on_a_stream(env: &Env) {
    per_item_outcomes(env, Kind::Stream).await;
}

// Undecodable items and panics ---------------------------------------------------------------

async fn an_undecodable_item_is_dead_lettered_and_the_rest_handled(env: &Env) {
    let broker = broker(env);
    broker.connect().await.expect("connect");
    publish(&broker, Kind::Reliable, [1]).await;
    env.lpush_raw("{q}", "not json").await;
    publish(&broker, Kind::Reliable, [2]).await;
    let rec = Recorder::acking();
    let app = env
        .start(app(
            &broker,
            Kind::Reliable,
            (3, Duration::from_secs(5), 6),
            &rec,
        ))
        .await;
    wait_until("a dead letter", WAIT, async || {
        env.llen("{q}.dead").await == 1
    })
    .await;
    wait_until("nothing claimed", WAIT, async || {
        claimed(env, Kind::Reliable).await == 0
    })
    .await;
    env.stop(app).await;

    assert_eq!(
        rec.batches(),
        [vec![(1, 1), (2, 1)]],
        "the others, as one batch"
    );
    let dead = env.frames("{q}.dead").await;
    let reason = dead[0].headers.get("reason").cloned().unwrap_or_default();
    assert!(reason.starts_with("decode:"), "{reason}");
    assert_eq!(&dead[0].payload[..], b"not json");
}

async fn a_panic_retries_every_item(env: &Env) {
    let broker = broker(env);
    broker.connect().await.expect("connect");
    publish(&broker, Kind::Reliable, 1..=2).await;
    let rec = Recorder::new(|batch| {
        assert!(
            batch.iter().all(|(_, attempt)| *attempt > 1),
            "first attempt panics"
        );
        BatchOutcome::ack()
    });
    let app = env
        .start(app(
            &broker,
            Kind::Reliable,
            (2, Duration::from_secs(5), 4),
            &rec,
        ))
        .await;
    handled_and_settled(env, Kind::Reliable, &rec, 4).await;
    env.stop(app).await;

    assert_eq!(rec.batches(), [vec![(1, 1), (2, 1)], vec![(1, 2), (2, 2)]]);
    assert!(!env.exists("{q}.dead").await);
}

// Shutdown and configuration -----------------------------------------------------------------

async fn shutdown_hands_over_a_partial_batch(env: &Env) {
    let broker = broker(env);
    let rec = Recorder::acking();
    // The batch would wait an hour; stopping hands it over at once.
    let wait = Duration::from_secs(3600);
    let app = env
        .start(app(&broker, Kind::Reliable, (10, wait, 20), &rec))
        .await;
    publish(&broker, Kind::Reliable, 0..3).await;
    wait_until("3 items claimed", WAIT, async || {
        claimed(env, Kind::Reliable).await == 3
    })
    .await;
    assert_eq!(rec.items(), 0, "the batch waits for more");
    env.stop(app).await;

    assert_eq!(rec.batches(), [vec![(0, 1), (1, 1), (2, 1)]]);
    assert_eq!(
        claimed(env, Kind::Reliable).await,
        0,
        "settled before the app stopped"
    );
}

async fn bad_batch_sizes_are_refused_at_startup(env: &Env) {
    let broker = env.broker();
    let rec = Recorder::acking();
    let wait = Duration::from_millis(10);
    let zero = env
        .try_start(app(&broker, Kind::Reliable, (0, wait, 8), &rec))
        .await
        .expect_err("batch size 0 is refused");
    let config = harness::config_error(&zero);
    assert_eq!(config.option, "batch", "{zero}");
    assert_eq!(
        config.subject.as_deref(),
        Some(key(Kind::Reliable)),
        "{zero}"
    );
    assert!(config.fix.contains("give it at least 1"), "{zero}");

    let big = env
        .try_start(app(&broker, Kind::Stream, (9, wait, 8), &rec))
        .await
        .expect_err("a batch above the concurrency is refused");
    let config = harness::config_error(&big);
    assert_eq!(config.option, "batch", "{big}");
    assert_eq!(config.subject.as_deref(), Some(key(Kind::Stream)), "{big}");
    assert!(config.problem.contains("batches of 9"), "{big}");
    assert_eq!(
        config.fix,
        "lower `batch` to at most 8, or raise the source's `.concurrency(9)`"
    );
    assert_eq!(rec.items(), 0);
}

// TestApp, macro form ------------------------------------------------------------------------

/// Rows handled so far, by the macro subscriber below.
static ROWS: Mutex<Vec<(u32, u32, usize)>> = Mutex::new(Vec::new());

/// Acks every row but those with `n == 7`, which it drops; records `(n, attempt, batch size)`.
#[subscriber(
    RedisList::new("{rows}").reliable().concurrency(10),
    batch = 5,
    max_wait = Duration::from_secs(30)
)]
async fn store_rows(rows: &[Job], ctx: &mut BatchContext<'_>) -> Vec<HandlerOutcome> {
    let mut seen = ROWS.lock().expect("lock");
    rows.iter()
        .zip(ctx.infos())
        .map(|(row, info)| {
            seen.push((row.n, info.attempt, rows.len()));
            if row.n == 7 {
                HandlerOutcome::drop()
            } else {
                HandlerOutcome::ack()
            }
        })
        .collect()
}

fn rows_app() -> RustStream {
    RustStream::new(AppInfo::new("batch-testapp", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379"),
        |b| {
            b.include(store_rows);
        },
    )
}

#[tokio::test(start_paused = true)]
async fn testapp_max_wait_runs_on_the_virtual_clock() -> ruststream::Result<()> {
    let tb = TestApp::start(rows_app()).await?;
    let rows = [Job { n: 6 }, Job { n: 7 }];
    tb.broker::<RedisBroker>()
        .messages(&rows)
        .to("{rows}")
        .publish()
        .await?;
    tb.advance(Duration::from_secs(29)).await?;
    tb.broker::<RedisBroker>()
        .subscriber("{rows}")
        .assert_not_called();
    tb.advance(Duration::from_secs(2)).await?;
    let calls = tb.broker::<RedisBroker>().subscriber("{rows}");
    calls.assert_called(2);
    let settled: Vec<_> = calls.calls().iter().map(|c| c.settlement.clone()).collect();
    assert_eq!(
        settled,
        [
            Some(Settlement::Ack),
            Some(Settlement::Dead {
                reason: "dropped".into()
            })
        ]
    );
    assert_eq!(*ROWS.lock().expect("lock"), [(6, 1, 2), (7, 1, 2)]);
    tb.shutdown().await
}
