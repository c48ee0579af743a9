//! Bounded streams (issue 14): `stream::Publish::{maxlen, minid}` on publishes, and on what a
//! subscription re-adds to its stream (retries, due delayed retries, requeued dead letters);
//! `RedisStream::trim_acked`, which drops only what every group has acknowledged. Dead-letter
//! lists (issue 22): `.dead_letter_max_len(n)` trims the oldest past `n` exactly, on a reliable
//! list with priorities, a stream group and a simple list, counted in
//! `ruststream_dead_letters_trimmed_total`; `.dead_letter_max_age(d)` drops those that died
//! longer ago (30 days on the model's virtual clock, 200 ms on a server). The periodic registry
//! forgets a job no instance runs any more after its bound and keeps a live one. A stream's
//! recovery sweep removes the group's consumers of gone instances. Each test runs
//! on the model (`memory`, virtual time), the standalone server and the cluster; the last two of
//! the stream tests are `TestApp` tests.
//!
//! Redis trims `~` by whole macro nodes (`stream-node-max-entries`, 100 here): a bounded stream
//! holds at most a node more than its bound. The model trims exactly (the most Redis may trim),
//! so there the slack is 0.

use crate::harness;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use fred::types::ClusterHash;
use harness::metrics::{prometheus, sample};
use harness::{Env, on};
use ruststream::list;
use ruststream::prelude::*;
use ruststream::redis::operate::Select;
use ruststream::stream;
use ruststream::testing::TestApp;
use ruststream::{BatchContext, BatchOutcome, HandleBatch};
use ruststream::{RedisSource, RunningApp};

on!(
    [memory, standalone, cluster] multi_thread:
    maxlen_keeps_a_stream_under_steady_publish_within_its_bound,
    minid_drops_entries_older_than_the_age,
    a_retry_is_readded_within_the_bound,
    a_delayed_retry_is_moved_in_within_the_bound,
    a_requeued_dead_letter_is_added_within_the_bound,
    trim_acked_never_drops_a_pending_or_unread_entry,
    a_group_that_read_nothing_keeps_the_whole_stream,
);

on!([memory] bad_bounds_are_refused_at_startup);

on!(
    [memory, standalone, cluster] multi_thread:
    dead_letters_past_max_len_are_trimmed_oldest_first_on_a_list_with_priorities,
    dead_letters_past_max_len_are_trimmed_oldest_first_on_a_stream,
    dead_letters_past_max_len_are_trimmed_oldest_first_on_a_simple_list,
    dead_letters_past_max_age_are_trimmed,
    the_periodic_registry_forgets_a_job_not_seen_for_its_bound,
    a_streams_sweep_forgets_the_consumers_of_gone_instances,
    a_batch_handler_on_partitions_keeps_each_partitions_dead_letters_within_the_bound,
);

on!([memory] the_periodic_registry_forgets_a_removed_job_after_a_week_and_keeps_a_live_one);

on!([memory] zero_dead_letter_bounds_are_refused_at_startup);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

const KEY: &str = "{ev}";

/// Records each delivery's attempt and settles as `outcome(attempt)` says.
#[derive(Clone)]
struct Worker {
    attempts: Arc<Mutex<Vec<u32>>>,
    outcome: fn(u32) -> Option<HandlerOutcome>,
}

impl Worker {
    fn new(outcome: fn(u32) -> Option<HandlerOutcome>) -> Self {
        Self {
            attempts: Arc::default(),
            outcome,
        }
    }

    fn acking() -> Self {
        Self::new(|_| None)
    }

    fn seen(&self) -> Vec<u32> {
        self.attempts.lock().expect("lock").clone()
    }
}

impl Handle<Job> for Worker {
    async fn handle(&self, _: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.attempts.lock().expect("lock").push(ctx.attempt());
        (self.outcome)(ctx.attempt()).map_or(Ok(()), Err)
    }
}

/// How many entries more than its bound Redis's approximate trim may leave: a macro node
/// (`stream-node-max-entries`) on a server, none on the model.
async fn slack(env: &Env) -> i64 {
    if env.is_memory() {
        return 0;
    }
    let reply: Value = env
        .cmd(
            "CONFIG",
            vec!["GET".into(), "stream-node-max-entries".into()],
        )
        .await
        .expect("CONFIG GET");
    let text = match reply {
        Value::Array(v) => v.get(1).and_then(Value::as_string),
        Value::Map(m) => m.inner().into_values().next().and_then(|v| v.as_string()),
        _ => None,
    };
    text.and_then(|t| t.parse().ok())
        .expect("stream-node-max-entries")
}

async fn xlen(env: &Env) -> i64 {
    env.client.xlen(env.key(KEY)).await.expect("XLEN")
}

/// A stream id as `(ms, seq)`.
fn parse_id(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').expect("an id is ms-seq");
    (ms.parse().expect("ms"), seq.parse().expect("seq"))
}

/// The ids of a reply shaped `[[id, fields], ..]` (`XRANGE`, `XPENDING - + n`, one stream of
/// `XREADGROUP`).
fn ids_of(entries: Value) -> Vec<(u64, u64)> {
    let Value::Array(entries) = entries else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter_map(|e| match e {
            Value::Array(mut parts) if !parts.is_empty() => parts.swap_remove(0).as_string(),
            _ => None,
        })
        .map(|id| parse_id(&id))
        .collect()
}

/// Every id in the stream, oldest first.
async fn stream_ids(env: &Env) -> Vec<(u64, u64)> {
    let r = env
        .cmd("XRANGE", vec![env.key(KEY).into(), "-".into(), "+".into()])
        .await
        .expect("XRANGE");
    ids_of(r)
}

/// `n` raw entries (`payload` only), added without trimming.
async fn fill(env: &Env, n: usize) {
    for i in 0..n {
        let _: Value = env
            .cmd(
                "XADD",
                vec![
                    env.key(KEY).into(),
                    "*".into(),
                    "payload".into(),
                    format!(r#"{{"n":{i}}}"#).into(),
                ],
            )
            .await
            .expect("XADD");
    }
}

async fn group_create(env: &Env, group: &str, from: &str) {
    let _: Value = env
        .client
        .custom(
            fred::cmd!("XGROUP", hash: ClusterHash::from(env.key(KEY).as_str())),
            vec!["CREATE", &env.key(KEY), group, from, "MKSTREAM"],
        )
        .await
        .expect("XGROUP CREATE");
}

fn jobs(from: u32, n: u32) -> Vec<Job> {
    (from..from + n).map(|n| Job { n }).collect()
}

fn app_of(broker: RedisBroker, source: RedisStream, worker: Worker) -> RustStream {
    RustStream::new(AppInfo::new("bounded", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(broker, move |b| {
            b.include(subscriber(source, worker).build());
        })
}

// -- maxlen / minid on publishes -----------------------------------------------------------------

async fn maxlen_keeps_a_stream_under_steady_publish_within_its_bound(env: &Env) {
    const N: i64 = 1000;
    let broker = env.broker_with(|b| b.route(KEY, stream::Publish::new().maxlen(1000)));
    let slack = slack(env).await;
    let publisher = broker.publisher();
    for round in 0..30 {
        let batch = jobs(round * 100, 100);
        publisher
            .messages(&batch)
            .to(KEY)
            .publish()
            .await
            .expect("publish");
        let len = xlen(env).await;
        assert!(
            len <= N + slack,
            "round {round}: XLEN {len} > {N} + {slack}"
        );
    }
    let len = xlen(env).await;
    assert!(
        len >= N,
        "an approximate trim keeps at least the bound, got {len}"
    );
    let newest = env
        .cmd(
            "XREVRANGE",
            vec![
                env.key(KEY).into(),
                "+".into(),
                "-".into(),
                "COUNT".into(),
                1.into(),
            ],
        )
        .await
        .expect("XREVRANGE");
    let text = format!("{newest:?}");
    assert!(text.contains("2999"), "the newest entry is kept: {text}");
}

async fn minid_drops_entries_older_than_the_age(env: &Env) {
    const AGE: Duration = Duration::from_millis(300);
    let broker = env.broker_with(|b| b.route(KEY, stream::Publish::new().minid(AGE)));
    let publisher = broker.publisher();
    let old = jobs(0, 300);
    publisher
        .messages(&old)
        .to(KEY)
        .publish()
        .await
        .expect("publish");
    assert_eq!(xlen(env).await, 300, "nothing is older than the age yet");
    env.advance(AGE * 2).await;
    publisher
        .message(&Job { n: 300 })
        .to(KEY)
        .publish()
        .await
        .expect("publish");
    let len = xlen(env).await;
    let slack = slack(env).await;
    assert!(
        len <= 1 + slack && len < 301,
        "entries older than {AGE:?} were dropped: XLEN {len}"
    );
}

// -- what a subscription re-adds -------------------------------------------------------------

/// A stream of 300 entries its group `g` will not read (created at `$`), one job the group
/// reads, handled by `worker`, with the stream routed `maxlen(10)`; waits until the worker saw
/// `attempts`, then checks the stream was trimmed.
async fn readded_within_bound(env: &Env, worker: Worker, attempts: &[u32]) {
    let broker = env.broker_with(|b| b.route(KEY, stream::Publish::new().maxlen(10)));
    fill(env, 300).await;
    group_create(env, "g", "$").await;
    let source = RedisStream::new(KEY).group("g");
    let app = env.start(app_of(broker, source, worker.clone())).await;
    // A raw XADD: the publisher's own trim must not be what bounds the stream here.
    fill(env, 1).await;
    env.eventually("the job's attempts", async || worker.seen() == attempts)
        .await;
    env.stop(app).await;
    let (len, slack) = (xlen(env).await, slack(env).await);
    assert!(
        len <= 10 + slack,
        "the re-added entry trimmed the stream: XLEN {len}"
    );
}

async fn a_retry_is_readded_within_the_bound(env: &Env) {
    let worker = Worker::new(|a| (a == 1).then(HandlerOutcome::retry));
    readded_within_bound(env, worker, &[1, 2]).await;
}

async fn a_delayed_retry_is_moved_in_within_the_bound(env: &Env) {
    let worker =
        Worker::new(|a| (a == 1).then(|| HandlerOutcome::retry_after(Duration::from_millis(100))));
    readded_within_bound(env, worker, &[1, 2]).await;
}

async fn a_requeued_dead_letter_is_added_within_the_bound(env: &Env) {
    let broker = env.broker_with(|b| b.route(KEY, stream::Publish::new().maxlen(10)));
    let source = RedisStream::new(KEY).group("g");
    let worker = Worker::new(|_| Some(HandlerOutcome::drop()));
    let app = env
        .start(app_of(broker.clone(), source.clone(), worker.clone()))
        .await;
    broker
        .publisher()
        .message(&Job { n: 1 })
        .to(KEY)
        .publish()
        .await
        .expect("publish");
    env.eventually("the dead letter", async || env.llen("{ev}.dead").await == 1)
        .await;
    env.stop(app).await;
    fill(env, 300).await;
    broker.connect().await.expect("connect");
    let op = broker.operator(&[RedisSource::from(source)]);
    let moved = op
        .requeue(KEY, &Select::All { limit: None })
        .await
        .expect("requeue");
    assert_eq!(moved, 1);
    let (len, slack) = (xlen(env).await, slack(env).await);
    assert!(
        len <= 10 + slack,
        "the requeue trimmed the stream: XLEN {len}"
    );
    let ids = stream_ids(env).await;
    assert!(!ids.is_empty(), "the requeued entry is there");
}

// -- trim_acked --------------------------------------------------------------------------------

const PERIOD: Duration = Duration::from_millis(50);

/// The group's `(pending ids, last-delivered id)`.
async fn group_state(env: &Env, group: &str) -> (Vec<(u64, u64)>, (u64, u64)) {
    let pending = env
        .cmd(
            "XPENDING",
            vec![
                env.key(KEY).into(),
                group.into(),
                "-".into(),
                "+".into(),
                100_000.into(),
            ],
        )
        .await
        .expect("XPENDING");
    let groups: Value = env
        .client
        .custom(
            fred::cmd!("XINFO", hash: ClusterHash::from(env.key(KEY).as_str())),
            vec!["GROUPS", &env.key(KEY)],
        )
        .await
        .expect("XINFO GROUPS");
    let text = format!("{groups:?}");
    let Value::Array(groups) = groups else {
        panic!("XINFO GROUPS: {text}")
    };
    let last = groups
        .into_iter()
        .find_map(|g| {
            let Value::Array(f) = g else { return None };
            let field = |name: &str| {
                f.chunks(2)
                    .find(|p| p[0].as_string().as_deref() == Some(name))
                    .and_then(|p| p[1].as_string())
            };
            (field("name").as_deref() == Some(group))
                .then(|| field("last-delivered-id"))
                .flatten()
        })
        .unwrap_or_else(|| panic!("group {group} in {text}"));
    (ids_of(pending), parse_id(&last))
}

/// Reads up to `count` new entries for the hand-driven group `group`; their ids.
async fn read_group(env: &Env, group: &str, count: usize) -> Vec<(u64, u64)> {
    if count == 0 {
        return Vec::new();
    }
    let key = env.key(KEY);
    let args: Vec<Value> = vec![
        "GROUP".into(),
        group.into(),
        "hand".into(),
        "COUNT".into(),
        i64::try_from(count).expect("count").into(),
        "STREAMS".into(),
        key.as_str().into(),
        ">".into(),
    ];
    let reply: Value = env
        .client
        .custom(
            fred::cmd!("XREADGROUP", hash: ClusterHash::from(key.as_str())),
            args,
        )
        .await
        .expect("XREADGROUP");
    match reply {
        Value::Array(mut streams) if !streams.is_empty() => match streams.swap_remove(0) {
            Value::Array(mut kv) if kv.len() == 2 => ids_of(kv.swap_remove(1)),
            _ => Vec::new(),
        },
        Value::Map(m) => m.inner().into_values().flat_map(ids_of).collect(),
        _ => Vec::new(),
    }
}

async fn ack(env: &Env, group: &str, ids: &[(u64, u64)]) {
    if ids.is_empty() {
        return;
    }
    let mut args: Vec<Value> = vec![env.key(KEY).into(), group.into()];
    args.extend(
        ids.iter()
            .map(|(ms, seq)| Value::from(format!("{ms}-{seq}"))),
    );
    let _: Value = env.cmd("XACK", args).await.expect("XACK");
}

/// Checks what the hand-driven group `slow` needs is all there, and returns the lowest id it
/// needs.
async fn check_kept(env: &Env, read: usize, published: usize) -> (u64, u64) {
    let ids = stream_ids(env).await;
    let present: HashSet<(u64, u64)> = ids.iter().copied().collect();
    let (pending, last) = group_state(env, "slow").await;
    for id in &pending {
        assert!(present.contains(id), "pending entry {id:?} was trimmed");
    }
    let unread = ids.iter().filter(|id| **id > last).count();
    assert_eq!(unread, published - read, "an unread entry was trimmed");
    pending.iter().copied().chain([last]).min().expect("an id")
}

/// Creates the group `other` at `0`, then starts an app whose group `fast` acknowledges
/// everything and trims what is acknowledged every [`PERIOD`].
async fn start_trimming(env: &Env, other: &str) -> (RedisBroker, Worker, RunningApp) {
    group_create(env, other, "0").await;
    let worker = Worker::acking();
    let source = RedisStream::new(KEY).group("fast").trim_acked(PERIOD);
    let broker = env.broker();
    let app = env
        .start(app_of(broker.clone(), source, worker.clone()))
        .await;
    (broker, worker, app)
}

async fn trim_acked_never_drops_a_pending_or_unread_entry(env: &Env) {
    let (broker, worker, app) = start_trimming(env, "slow").await;
    let mut rng = fastrand::Rng::with_seed(14);
    let (mut published, mut read) = (0_usize, 0_usize);
    let mut trimmed_while_pending = false;
    let slack = slack(env).await;
    for round in 0..12 {
        let batch = jobs(u32::try_from(published).expect("count"), 150);
        broker
            .publisher()
            .messages(&batch)
            .to(KEY)
            .publish()
            .await
            .expect("publish");
        published += batch.len();
        read += read_group(env, "slow", rng.usize(0..=150)).await.len();
        let (pending, _) = group_state(env, "slow").await;
        let acked: Vec<_> = pending.into_iter().filter(|_| rng.f32() < 0.7).collect();
        ack(env, "slow", &acked).await;
        env.eventually("the fast group handled everything", async || {
            worker.seen().len() == published
        })
        .await;
        env.advance(PERIOD * 3).await;
        let low = check_kept(env, read, published).await;
        // The stream shrinks to the lowest id the slow group needs, within a node.
        env.eventually(&format!("round {round}: trimmed to {low:?}"), async || {
            let ids = stream_ids(env).await;
            let needed = ids.iter().filter(|id| **id >= low).count();
            i64::try_from(ids.len() - needed).expect("len") <= slack
        })
        .await;
        trimmed_while_pending |= stream_ids(env).await.len() < published;
        check_kept(env, read, published).await;
    }
    assert!(
        trimmed_while_pending,
        "the trim ran while entries were pending"
    );
    // Everything read and acknowledged: the stream shrinks to the last entry and a node.
    loop {
        let got = read_group(env, "slow", 1000).await;
        if got.is_empty() {
            break;
        }
        read += got.len();
    }
    let (pending, _) = group_state(env, "slow").await;
    ack(env, "slow", &pending).await;
    env.eventually("the stream trimmed to its last entry", async || {
        xlen(env).await <= 1 + slack
    })
    .await;
    check_kept(env, read, published).await;
    env.stop(app).await;
}

async fn a_group_that_read_nothing_keeps_the_whole_stream(env: &Env) {
    let (broker, worker, app) = start_trimming(env, "idle").await;
    broker
        .publisher()
        .messages(&jobs(0, 300))
        .to(KEY)
        .publish()
        .await
        .expect("publish");
    env.eventually("all handled", async || worker.seen().len() == 300)
        .await;
    env.advance(PERIOD * 6).await;
    assert_eq!(xlen(env).await, 300, "the idle group needs every entry");
    let _: Value = env
        .client
        .custom(
            fred::cmd!("XGROUP", hash: ClusterHash::from(env.key(KEY).as_str())),
            vec!["DESTROY", &env.key(KEY), "idle"],
        )
        .await
        .expect("XGROUP DESTROY");
    let slack = slack(env).await;
    env.eventually("trimmed once the idle group is gone", async || {
        xlen(env).await <= 1 + slack
    })
    .await;
    env.stop(app).await;
}

// -- configuration ---------------------------------------------------------------------------

async fn bad_bounds_are_refused_at_startup(env: &Env) {
    let cases: [(stream::Publish, Option<Duration>, &str); 4] = [
        (stream::Publish::new().maxlen(0), None, "maxlen(0)"),
        (
            stream::Publish::new().minid(Duration::ZERO),
            None,
            "at least a millisecond",
        ),
        (
            stream::Publish::new()
                .maxlen(5)
                .minid(Duration::from_secs(1)),
            None,
            "choose one",
        ),
        (stream::Publish::new(), Some(Duration::ZERO), "trim_acked"),
    ];
    for (policy, every, says) in cases {
        let broker = env.broker_with(|b| b.route(KEY, policy));
        let mut source = RedisStream::new(KEY).group("g");
        if let Some(every) = every {
            source = source.trim_acked(every);
        }
        let e = env
            .try_start(app_of(broker, source, Worker::acking()))
            .await
            .err()
            .unwrap_or_else(|| panic!("{policy:?} / {every:?} is refused"));
        assert!(e.to_string().contains(says), "{e} says {says}");
    }
}

// -- TestApp ---------------------------------------------------------------------------------

fn testapp(policy: stream::Publish, source: RedisStream) -> RustStream {
    RustStream::new(AppInfo::new("bounded", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379")
            .prefix("t:")
            .route(KEY, policy),
        |b| {
            b.include(subscriber(source, Worker::acking()).build());
        },
    )
}

fn broker_error(e: fred::error::Error) -> ruststream::Error {
    ruststream::redis::error::core(e)
}

#[tokio::test(start_paused = true)]
async fn testapp_maxlen_bounds_the_stream() -> ruststream::Result<()> {
    let source = RedisStream::new(KEY).group("g");
    let tb = TestApp::start(testapp(stream::Publish::new().maxlen(100), source)).await?;
    let b = tb.broker::<RedisBroker>();
    b.messages(&jobs(0, 250)).to(KEY).publish().await?;
    let client = b.client().await?;
    let len: i64 = client.xlen("t:{ev}").await.map_err(broker_error)?;
    assert_eq!(len, 100, "the model trims `~` as exactly as Redis may");
    // The batch went out before the app read: maxlen dropped the oldest 150 unread, which is
    // what a publish-side bound does (trim_acked is the one that waits for the groups).
    assert_eq!(
        b.subscriber(KEY).calls().len(),
        100,
        "the newest 100 were handled"
    );
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn testapp_trim_acked_waits_for_every_group() -> ruststream::Result<()> {
    let source = RedisStream::new(KEY)
        .group("g")
        .trim_acked(Duration::from_secs(1));
    let tb = TestApp::start(testapp(stream::Publish::new(), source)).await?;
    let b = tb.broker::<RedisBroker>();
    let client = b.client().await?;
    let q = |r: Result<Value, fred::error::Error>| r.map_err(broker_error);
    q(client
        .custom(fred::cmd!("XGROUP"), vec!["CREATE", "t:{ev}", "audit", "0"])
        .await)?;
    b.messages(&jobs(0, 50)).to(KEY).publish().await?;
    tb.advance(Duration::from_secs(5)).await?;
    let len: i64 = client.xlen("t:{ev}").await.map_err(broker_error)?;
    assert_eq!(len, 50, "the audit group has read nothing");
    let read = q(client
        .custom(
            fred::cmd!("XREADGROUP"),
            vec![
                "GROUP", "audit", "a", "COUNT", "50", "STREAMS", "t:{ev}", ">",
            ],
        )
        .await)?;
    let Value::Array(mut streams) = read else {
        panic!("XREADGROUP: {read:?}")
    };
    let Value::Array(mut kv) = streams.swap_remove(0) else {
        panic!("a stream")
    };
    let ids = ids_of(kv.swap_remove(1));
    let mut args: Vec<Value> = vec!["t:{ev}".into(), "audit".into()];
    args.extend(
        ids.iter()
            .take(30)
            .map(|(ms, seq)| format!("{ms}-{seq}").into()),
    );
    q(client.custom(fred::cmd!("XACK"), args).await)?;
    tb.advance(Duration::from_secs(2)).await?;
    let len: i64 = client.xlen("t:{ev}").await.map_err(broker_error)?;
    assert_eq!(
        len, 20,
        "trimmed up to the audit group's oldest pending entry"
    );
    tb.shutdown().await
}

// -- dead-letter lists -------------------------------------------------------------------------

/// Drops every message it gets (each becomes a dead letter) and counts them.
#[derive(Clone, Default)]
struct Dropper {
    seen: Arc<Mutex<Vec<u32>>>,
}

impl Dropper {
    fn count(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }
}

impl Handle<Job> for Dropper {
    async fn handle(&self, job: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.seen.lock().expect("lock").push(job.n);
        Err(HandlerOutcome::drop())
    }
}

/// The jobs of the dead-letter list `dead` (a name without the prefix), newest first.
async fn dead_jobs(env: &Env, dead: &str) -> Vec<u32> {
    env.frames(dead)
        .await
        .into_iter()
        .map(|f| serde_json::from_slice::<Job>(&f.payload).expect("a Job").n)
        .collect()
}

/// `ruststream_dead_letters_trimmed_total` of the queue `queue` (its full name).
fn trimmed_metric(queue: &str) -> f64 {
    let label = format!("queue=\"{queue}\"");
    sample(
        &prometheus().render(),
        "ruststream_dead_letters_trimmed_total",
        &[&label],
    )
    .unwrap_or(0.0)
}

/// Starts `source` into a [`Dropper`], publishes jobs `0..12` one by one (each dead-lettered
/// before the next), and checks the dead-letter list `dead` keeps the newest 5 and the metric
/// of `queue` (a name without the prefix) counts the 7 trimmed.
async fn trims_past_max_len(
    env: &Env,
    source: impl ruststream::Source<Broker = RedisBroker>,
    queue: &str,
    dead: &str,
) {
    prometheus();
    let dropper = Dropper::default();
    let handler = dropper.clone();
    let app = env
        .start_with(move |b| {
            b.include(subscriber(source, handler).build());
        })
        .await;
    let publisher = env.broker().publisher();
    for n in 0..12_u32 {
        publisher
            .message(&Job { n })
            .to(queue)
            .publish()
            .await
            .expect("publish");
        let want = usize::try_from(n).expect("n") + 1;
        env.eventually(&format!("job {n} dead-lettered"), async || {
            dropper.count() == want && dead_jobs(env, dead).await.first() == Some(&n)
        })
        .await;
    }
    env.stop(app).await;
    assert_eq!(
        dead_jobs(env, dead).await,
        vec![11, 10, 9, 8, 7],
        "the newest 5 are kept, the oldest trimmed"
    );
    for f in env.frames(dead).await {
        let at: u64 = f
            .headers
            .get(ruststream::redis::DEAD_AT_HEADER)
            .and_then(|t| t.parse().ok())
            .expect("each dead letter has its dead-at");
        assert!(at > 0, "dead-at {at}");
    }
    assert_eq!(trimmed_metric(&env.key(queue)), 7.0, "7 trims counted");
}

async fn dead_letters_past_max_len_are_trimmed_oldest_first_on_a_list_with_priorities(env: &Env) {
    let source = RedisList::new("{dl}")
        .reliable()
        .priorities(3)
        .concurrency(1)
        .dead_letter_max_len(5);
    trims_past_max_len(env, source, "{dl}", "{dl}.dead").await;
}

async fn dead_letters_past_max_len_are_trimmed_oldest_first_on_a_stream(env: &Env) {
    let source = RedisStream::new("{ds}")
        .group("g")
        .concurrency(1)
        .dead_letter_max_len(5);
    trims_past_max_len(env, source, "{ds}", "{ds}.dead").await;
}

async fn dead_letters_past_max_len_are_trimmed_oldest_first_on_a_simple_list(env: &Env) {
    let source = RedisList::new("{dsimple}")
        .concurrency(1)
        .dead_letter_max_len(5);
    trims_past_max_len(env, source, "{dsimple}", "{dsimple}.dead").await;
}

/// Starts a reliable list `{dage}` whose dead letters are kept `age`, publishes `jobs` to it
/// and waits until its dead-letter list holds `then` (newest first), then stops it.
async fn dead_letter_aged(env: &Env, age: Duration, jobs: &[Job], then: &[u32]) {
    let handler = Dropper::default();
    let app = env
        .start_with(move |b| {
            let source = RedisList::new("{dage}")
                .reliable()
                .concurrency(1)
                .dead_letter_max_age(age);
            b.include(subscriber(source, handler).build());
        })
        .await;
    env.broker()
        .publisher()
        .messages(jobs)
        .to("{dage}")
        .publish()
        .await
        .expect("publish");
    env.eventually(&format!("the dead letters {then:?}"), async || {
        dead_jobs(env, "{dage}.dead").await == then
    })
    .await;
    env.stop(app).await;
}

async fn dead_letters_past_max_age_are_trimmed(env: &Env) {
    // The default (30 days) on the model's virtual clock; a short age on a server, long enough
    // that a loaded machine's app start (between the last two dead letters) stays well inside
    // its half. The app is stopped while the time passes: on the virtual clock its timers would
    // fire for 30 days.
    let age = if env.is_memory() {
        ruststream::redis::DEFAULT_DEAD_LETTER_MAX_AGE
    } else {
        Duration::from_secs(2)
    };
    prometheus();
    let metric = || trimmed_metric(&env.key("{dage}"));
    dead_letter_aged(env, age, &jobs(0, 3), &[2, 1, 0]).await;
    env.advance(age / 2).await;
    dead_letter_aged(env, age, &jobs(3, 1), &[3, 2, 1, 0]).await;
    assert_eq!(metric(), 0.0, "none is older than the age yet");
    env.advance(age / 2 + Duration::from_millis(50)).await;
    dead_letter_aged(env, age, &jobs(4, 1), &[4, 3]).await;
    assert_eq!(
        metric(),
        3.0,
        "the first 3 trimmed for their age, and counted"
    );
}

async fn zero_dead_letter_bounds_are_refused_at_startup(env: &Env) {
    let refused = |source: RedisList| {
        env.app(move |b| {
            b.include(subscriber(source, Dropper::default()).build());
        })
    };
    let e = env
        .refusal(refused(RedisList::new("{z}").dead_letter_max_len(0)))
        .await;
    assert!(
        e.contains("dead_letter_max_len must be at least 1")
            && e.contains(".dead_letter_max_len(1_000_000)"),
        "{e}"
    );
    let e = env
        .refusal(refused(
            RedisList::new("{z}").dead_letter_max_age(Duration::ZERO),
        ))
        .await;
    assert!(
        e.contains("dead_letter_max_age must be at least 1 ms")
            && e.contains("Duration::from_secs"),
        "{e}"
    );
}

// -- the periodic registry ---------------------------------------------------------------------

/// A daily job `name` publishing a [`Job`] to `{ticks}`.
fn daily(name: &str) -> Periodic {
    Periodic::new(name, "0 0 0 * * *", ruststream::periodic::Tz::UTC)
        .to("{ticks}")
        .message(|| Job { n: 0 })
}

/// The registry, last-tick and seen hashes' full names (in the registry's slot on a cluster).
fn registry_keys(env: &Env) -> [String; 3] {
    let registry = env.key("ruststream:periodic");
    let derived = |suffix: &str| {
        if env.is_cluster() {
            format!("{{{registry}}}{suffix}")
        } else {
            format!("{registry}{suffix}")
        }
    };
    [registry.clone(), derived(".last"), derived(".seen")]
}

/// The job names of the hash `key`, sorted.
async fn names(env: &Env, key: &str) -> Vec<String> {
    let mut names: Vec<String> = env.client.hkeys(key).await.expect("HKEYS");
    names.sort();
    names
}

async fn start_jobs(env: &Env, jobs: Vec<Periodic>) -> RunningApp {
    env.start_with(move |b| {
        for j in jobs {
            b.periodic(j);
        }
    })
    .await
}

async fn the_periodic_registry_forgets_a_job_not_seen_for_its_bound(env: &Env) {
    let [registry, last, seen] = registry_keys(env);
    let app = start_jobs(env, vec![daily("kept"), daily("removed")]).await;
    env.stop(app).await;
    assert_eq!(names(env, &registry).await, ["kept", "removed"]);
    // `removed` was last seen long ago (its keep-until time is past), as if its code was
    // removed a week ago; `kept` is registered again by the next start.
    let _: i64 = env
        .client
        .hset(&seen, ("removed", "1000"))
        .await
        .expect("HSET");
    let _: i64 = env
        .client
        .hset(&last, ("removed", "1000"))
        .await
        .expect("HSET");
    let app = start_jobs(env, vec![daily("kept")]).await;
    env.stop(app).await;
    assert_eq!(
        names(env, &registry).await,
        ["kept"],
        "the registry forgot it"
    );
    assert_eq!(names(env, &seen).await, ["kept"]);
    assert!(
        !names(env, &last).await.contains(&"removed".to_owned()),
        "its last tick is forgotten too"
    );
}

async fn the_periodic_registry_forgets_a_removed_job_after_a_week_and_keeps_a_live_one(env: &Env) {
    let [registry, _, seen] = registry_keys(env);
    let app = start_jobs(env, vec![daily("live"), daily("removed")]).await;
    env.stop(app).await;
    // The next version of the code has `live` only, and runs for 8 days: its daily ticks mark
    // it seen, and the tick after `removed`'s week is over forgets `removed`.
    let app = start_jobs(env, vec![daily("live")]).await;
    env.advance(Duration::from_secs(6 * 24 * 3600)).await;
    assert_eq!(
        names(env, &registry).await,
        ["live", "removed"],
        "a job is kept a week"
    );
    env.advance(Duration::from_secs(2 * 24 * 3600)).await;
    env.eventually("the removed job forgotten", async || {
        names(env, &registry).await == ["live"]
    })
    .await;
    assert_eq!(names(env, &seen).await, ["live"]);
    env.stop(app).await;
}

// -- stream consumers ---------------------------------------------------------------------------

/// The consumer names of group `g` of `stream` (a name without the prefix), sorted.
pub(crate) async fn consumer_names(env: &Env, stream: &str) -> Vec<String> {
    let reply: Value = env
        .client
        .custom(
            fred::cmd!("XINFO", hash: ClusterHash::from(env.key(stream).as_str())),
            vec!["CONSUMERS", &env.key(stream), "g"],
        )
        .await
        .expect("XINFO CONSUMERS");
    let Value::Array(consumers) = reply else {
        return Vec::new();
    };
    let mut names: Vec<String> = consumers
        .into_iter()
        .filter_map(|c| match c {
            Value::Array(f) => f.get(1).and_then(Value::as_string),
            _ => None,
        })
        .collect();
    names.sort();
    names
}

async fn a_streams_sweep_forgets_the_consumers_of_gone_instances(env: &Env) {
    let stream = env.key("{dc}");
    let _: Value = env
        .client
        .custom(
            fred::cmd!("XGROUP", hash: ClusterHash::from(stream.as_str())),
            vec!["CREATE", &stream, "g", "0", "MKSTREAM"],
        )
        .await
        .expect("XGROUP CREATE");
    for gone in ["gone-1", "gone-2", "live-2"] {
        let _: Value = env
            .client
            .custom(
                fred::cmd!("XGROUP", hash: ClusterHash::from(stream.as_str())),
                vec!["CREATECONSUMER", &stream, "g", gone],
            )
            .await
            .expect("XGROUP CREATECONSUMER");
    }
    // `gone-3` holds a pending entry: it is left to the sweep, which claims it first.
    let _: String = env
        .client
        .xadd(&stream, false, None, "*", ("payload", r#"{"n":1}"#))
        .await
        .expect("XADD");
    let _: Value = env
        .client
        .xreadgroup("g", "gone-3", Some(1), None, false, &stream, ">")
        .await
        .expect("XREADGROUP");
    let worker = Worker::acking();
    let source = RedisStream::new("{dc}")
        .group("g")
        .consumer("live")
        .min_idle(Duration::from_millis(100))
        .block(Duration::from_millis(100));
    let app = env
        .start(app_of(env.broker(), source, worker.clone()))
        .await;
    env.eventually("the pending entry swept and handled", async || {
        worker.seen().len() == 1
    })
    .await;
    // `live-2`, the subscription's second reader (two by default at concurrency 128), is as
    // idle as the gone ones (it exists before it reads, and on Redis 7.0 a read that got
    // nothing neither makes a consumer nor resets its idle time) and is never forgotten; `live`
    // is in the group only if it was the reader that claimed the pending entry.
    env.eventually("only the live consumers are left", async || {
        let names = consumer_names(env, "{dc}").await;
        names.contains(&"live-2".to_owned()) && names.iter().all(|n| n.starts_with("live"))
    })
    .await;
    env.stop(app).await;
}

/// Drops every batch whole, counting the items.
#[derive(Clone, Default)]
struct BatchDropper(Arc<Mutex<usize>>);

impl HandleBatch<Job> for BatchDropper {
    async fn handle_batch(&self, jobs: &[Job], _: &mut BatchContext<'_>) -> BatchOutcome {
        *self.0.lock().expect("lock") += jobs.len();
        BatchOutcome::all(HandlerOutcome::drop())
    }
}

async fn a_batch_handler_on_partitions_keeps_each_partitions_dead_letters_within_the_bound(
    env: &Env,
) {
    prometheus();
    let broker = env.broker_with(|b| b.route("dbp", list::Publish::new().partitions(2)));
    let handler = BatchDropper::default();
    let h = handler.clone();
    let app = env
        .start(
            RustStream::new(AppInfo::new("bounded", "0.0.0"))
                .shutdown_timeout(Duration::from_secs(1))
                .with_broker(broker.clone(), move |b| {
                    let source = RedisList::new("dbp")
                        .reliable()
                        .partitions(2)
                        .dead_letter_max_len(3);
                    b.include(subscriber(source, h).batch(4).build());
                }),
        )
        .await;
    broker
        .publisher()
        .messages(&jobs(0, 20))
        .to("dbp")
        .publish()
        .await
        .expect("publish");
    env.eventually(
        "every job dead-lettered, each partition trimmed to 3",
        async || {
            *handler.0.lock().expect("lock") == 20
                && env.llen("{dbp:0}.dead").await == 3
                && env.llen("{dbp:1}.dead").await == 3
        },
    )
    .await;
    env.stop(app).await;
    let trims: f64 = ["{dbp:0}", "{dbp:1}"]
        .iter()
        .map(|p| trimmed_metric(&env.key(p)))
        .sum();
    assert_eq!(trims, 14.0, "20 dead letters, 6 kept: 14 trims counted");
}
