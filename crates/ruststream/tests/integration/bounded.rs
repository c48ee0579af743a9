//! Bounded streams (issue 14): `stream::Publish::{maxlen, minid}` on publishes, and on what a
//! subscription re-adds to its stream (retries, due delayed retries, requeued dead letters);
//! `RedisStream::trim_acked`, which drops only what every group has acknowledged. Each test runs
//! on the model (`memory`, virtual time), the standalone server and the cluster; the last two are
//! `TestApp` tests.
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
use harness::{Env, on};
use ruststream::prelude::*;
use ruststream::redis::operate::Select;
use ruststream::stream;
use ruststream::testing::TestApp;
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
            fred::cmd!("XGROUP", hash: ClusterHash::Offset(1)),
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
            fred::cmd!("XINFO", hash: ClusterHash::Offset(1)),
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
        .custom(fred::cmd!("XREADGROUP", hash: ClusterHash::Offset(6)), args)
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
            fred::cmd!("XGROUP", hash: ClusterHash::Offset(1)),
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
