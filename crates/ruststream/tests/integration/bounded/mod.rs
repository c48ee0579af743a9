//! Bounded streams: `stream::Publish::{maxlen, minid}` on publishes, and on what a
//! subscription re-adds to its stream (retries, due delayed retries, requeued dead letters);
//! `RedisStream::trim_acked`, which drops only what every group has acknowledged. Dead-letter
//! lists: `.dead_letter_max_len(n)` trims the oldest past `n` exactly, on a reliable
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

mod dead_letters;
mod forgotten;
mod trim_acked;

use crate::harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use fred::types::ClusterHash;
use harness::{Env, on};
use ruststream::RedisSource;
use ruststream::prelude::*;
use ruststream::redis::operate::Select;
use ruststream::stream;

on!(
    [memory, standalone, cluster] multi_thread:
    maxlen_keeps_a_stream_under_steady_publish_within_its_bound,
    minid_drops_entries_older_than_the_age,
    a_retry_is_readded_within_the_bound,
    a_delayed_retry_is_moved_in_within_the_bound,
    a_requeued_dead_letter_is_added_within_the_bound,
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

// -- configuration ---------------------------------------------------------------------------

async fn bad_bounds_are_refused_at_startup(env: &Env) {
    let cases: [(stream::Publish, Option<Duration>, &str); 4] = [
        (stream::Publish::new().maxlen(0), None, "maxlen"),
        (stream::Publish::new().minid(Duration::ZERO), None, "minid"),
        (
            stream::Publish::new()
                .maxlen(5)
                .minid(Duration::from_secs(1)),
            None,
            "maxlen",
        ),
        (stream::Publish::new(), Some(Duration::ZERO), "trim_acked"),
    ];
    for (policy, every, option) in cases {
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
        let config = harness::config_error(&e);
        assert_eq!(config.option, option, "{e}");
        assert_eq!(config.subject.as_deref(), Some(KEY), "{e}");
    }
}

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
