//! Conformance: every scenario runs twice, on the in-memory Redis model of `ruststream::testing`
//! (`memory::<name>`, on a paused, virtual clock) and on a real Redis (`redis::<name>`), with the
//! same code and the same assertions, so the model cannot drift from Redis.
//!
//! A scenario is `async fn name(env: &Env)`: it builds apps on `env.broker()`, publishes, lets
//! time pass with `env.advance(d)` / `env.eventually(..)` (virtual on the model, real on Redis),
//! and inspects keys with raw commands on `env.client` (a fred client on the model or the server).
//! **Adding a feature's scenarios**: write the `async fn` in the section of its feature and add
//! its name to the `conformance!` list at the bottom (or to `conformance_cluster!` for what needs
//! a cluster: the model in cluster mode, and the stand's cluster).
//!
//! Real Redis: `RUSTSTREAM_REDIS_URL` (default `redis://127.0.0.1:6379`), one key prefix per test;
//! the cluster from `RUSTSTREAM_CLUSTER_URLS` (scripts/test sets both; without it the cluster
//! scenarios are skipped with a message, and fail under CI). Every wait is bounded.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::bytes::Bytes;
use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::redis::frame::Frame;
use ruststream::redis::scripts;
use ruststream::testing::MemoryRedis;
use ruststream::{Mount, PublishPolicy, RunningApp, subscriber};
use ruststream_core::Broker as _;
use tokio::time::Instant;

/// The longest any single condition may take (virtual time on the model).
const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The environment a scenario runs in.
// ---------------------------------------------------------------------------------------------

/// Which backend a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Memory,
    Redis,
}

/// A backend, a key prefix of the scenario's own, a broker and a raw client.
struct Env {
    backend: Backend,
    prefix: String,
    broker: RedisBroker,
    client: Client,
}

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!(
        "rsconf-{}-{ms}-{}-{tag}:",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn redis_url() -> String {
    std::env::var("RUSTSTREAM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// The stand's cluster; `None` (skip) when not set, except under CI.
fn cluster_urls() -> Option<Vec<String>> {
    match std::env::var("RUSTSTREAM_CLUSTER_URLS") {
        Ok(v) if !v.is_empty() => Some(v.split(',').map(str::to_owned).collect()),
        _ if std::env::var_os("CI").is_some() => {
            panic!("RUSTSTREAM_CLUSTER_URLS is not set: CI runs the tests through scripts/test")
        }
        _ => {
            eprintln!(
                "SKIPPED: RUSTSTREAM_CLUSTER_URLS is not set; run the tests with scripts/test"
            );
            None
        }
    }
}

async fn bounded<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {WAIT:?}: {what}"),
    }
}

impl Env {
    async fn memory(tag: &str, cluster: bool) -> Self {
        let model = if cluster {
            MemoryRedis::cluster()
        } else {
            MemoryRedis::new()
        };
        let prefix = unique(tag);
        let broker = if cluster {
            RedisBroker::cluster(["redis://memory.invalid:7000"])
        } else {
            RedisBroker::standalone("redis://memory.invalid:6379")
        }
        .prefix(prefix.clone());
        broker
            .attach_memory(Arc::new(model.clone()))
            .expect("attach the model");
        let client = model.client().expect("a client on the model");
        bounded("client init", client.init()).await.expect("init");
        Self {
            backend: Backend::Memory,
            prefix,
            broker,
            client,
        }
    }

    async fn redis(tag: &str, cluster: Option<Vec<String>>) -> Self {
        let prefix = unique(tag);
        let (broker, config) = match &cluster {
            None => (
                RedisBroker::standalone(redis_url()),
                Config::from_url(&redis_url()).expect("RUSTSTREAM_REDIS_URL"),
            ),
            Some(nodes) => {
                let mut config = Config::from_url(&nodes[0]).expect("a cluster URL");
                let hosts = nodes
                    .iter()
                    .flat_map(|n| Config::from_url(n).expect("a cluster URL").server.hosts())
                    .map(|s| (s.host.to_string(), s.port))
                    .collect();
                config.server = ServerConfig::new_clustered(hosts);
                (RedisBroker::cluster(nodes.clone()), config)
            }
        };
        let client = Builder::from_config(config).build().expect("a fred client");
        bounded("connecting to Redis", client.init())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to Redis for the conformance suite: {e}"));
        Self {
            backend: Backend::Redis,
            broker: broker.prefix(prefix.clone()),
            prefix,
            client,
        }
    }

    /// The scenario's broker (clones share its connections and, on the model, its server).
    fn broker(&self) -> RedisBroker {
        self.broker.clone()
    }

    /// The full name of `key`.
    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Starts an app on the scenario's broker.
    async fn start(&self, mount: impl FnOnce(&mut Mount<RedisBroker>)) -> RunningApp {
        let app = RustStream::new(AppInfo::new("conformance", "0.0.0"))
            .shutdown_timeout(Duration::from_secs(1))
            .with_broker(self.broker(), mount);
        bounded("app start", app.start())
            .await
            .expect("the app starts")
    }

    /// Lets `d` pass: virtual on the model, real on Redis.
    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// Waits until `check` holds, polling every 5 ms; fails the test after [`WAIT`].
    async fn eventually(&self, what: &str, mut check: impl AsyncFnMut() -> bool) {
        bounded(what, async {
            while !check().await {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }

    async fn llen(&self, key: &str) -> i64 {
        self.client.llen(self.key(key)).await.expect("LLEN")
    }

    async fn lrange(&self, key: &str) -> Vec<Bytes> {
        self.client
            .lrange(self.key(key), 0, -1)
            .await
            .expect("LRANGE")
    }

    async fn frames(&self, key: &str) -> Vec<Frame> {
        self.lrange(key)
            .await
            .into_iter()
            .map(Frame::decode)
            .collect()
    }

    async fn exists(&self, key: &str) -> bool {
        let n: i64 = self.client.exists(self.key(key)).await.expect("EXISTS");
        n == 1
    }

    async fn zcard(&self, key: &str) -> i64 {
        self.client.zcard(self.key(key)).await.expect("ZCARD")
    }

    async fn pttl(&self, key: &str) -> i64 {
        self.client.pttl(self.key(key)).await.expect("PTTL")
    }

    async fn cmd(&self, name: &'static str, args: Vec<Value>) -> Result<Value, fred::error::Error> {
        self.client.custom(fred::cmd!(name), args).await
    }

    /// The prefixed keys that exist, without the prefix, sorted.
    async fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .client
            .custom(fred::cmd!("KEYS"), vec![format!("{}*", self.prefix)])
            .await
            .unwrap_or_default();
        keys.sort();
        keys.into_iter()
            .map(|k| k[self.prefix.len()..].to_owned())
            .collect()
    }

    async fn cleanup(self) {
        if self.backend == Backend::Redis {
            for k in self.keys().await {
                let _: Result<i64, _> = self.client.del(self.key(&k)).await;
            }
        }
        let _ = self.client.quit().await;
    }
}

// ---------------------------------------------------------------------------------------------
// A handler that records deliveries and settles them as a plan says.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

fn job_json(n: u32) -> String {
    format!("{{\"n\":{n}}}")
}

/// What the handler does on a given attempt.
#[derive(Debug, Clone, Copy)]
enum Act {
    Ack,
    Settle(HandlerOutcome),
    Hang,
}

/// One delivery as the handler saw it.
#[derive(Debug, Clone)]
struct Seen {
    n: u32,
    attempt: u32,
    id: String,
    at: Instant,
}

#[derive(Clone)]
struct Rec {
    seen: Arc<Mutex<Vec<Seen>>>,
    plan: fn(u32) -> Act,
}

impl Rec {
    fn new(plan: fn(u32) -> Act) -> Self {
        Self {
            seen: Arc::default(),
            plan,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    fn attempts(&self) -> Vec<u32> {
        self.seen().iter().map(|s| s.attempt).collect()
    }

    fn count(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }
}

impl Handle<Job> for Rec {
    async fn handle(&self, job: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.seen.lock().expect("lock").push(Seen {
            n: job.n,
            attempt: ctx.attempt(),
            id: ctx.message_id().to_owned(),
            at: Instant::now(),
        });
        match (self.plan)(ctx.attempt()) {
            Act::Ack => Ok(()),
            Act::Settle(o) => Err(o),
            Act::Hang => std::future::pending().await,
        }
    }
}

fn always_ack(_: u32) -> Act {
    Act::Ack
}

async fn publish(env: &Env, key: &str, jobs: &[Job]) {
    env.broker()
        .publisher()
        .messages(jobs)
        .to(key)
        .publish()
        .await
        .expect("publish");
}

async fn wait_seen(env: &Env, rec: &Rec, n: usize) {
    env.eventually(&format!("{n} deliveries"), async || rec.count() >= n)
        .await;
}

async fn stop(app: RunningApp) {
    bounded("app shutdown", app.shutdown())
        .await
        .expect("the app shuts down");
}

// ---------------------------------------------------------------------------------------------
// Reliable lists: ack, retry, retry_after, drop, dead letters, decode failures.
// ---------------------------------------------------------------------------------------------

async fn reliable_acks_in_order(env: &Env) {
    let rec = Rec::new(always_ack);
    let r = rec.clone();
    let app = env
        .start(|b| {
            b.include(subscriber(RedisList::new("q").reliable().concurrency(1), r).build());
        })
        .await;
    publish(env, "q", &[Job { n: 1 }, Job { n: 2 }, Job { n: 3 }]).await;
    wait_seen(env, &rec, 3).await;
    let seen = rec.seen();
    assert_eq!(
        seen.iter().map(|s| s.n).collect::<Vec<_>>(),
        [1, 2, 3],
        "FIFO"
    );
    assert_eq!(rec.attempts(), [1, 1, 1]);
    env.eventually("processing list emptied", async || {
        env.llen("q.processing").await == 0
    })
    .await;
    stop(app).await;
    assert_eq!(env.keys().await, Vec::<String>::new(), "nothing left");
}

fn retry_once(attempt: u32) -> Act {
    if attempt == 1 {
        Act::Settle(HandlerOutcome::retry())
    } else {
        Act::Ack
    }
}

async fn reliable_retry(env: &Env) {
    let rec = Rec::new(retry_once);
    let r = rec.clone();
    let app = env
        .start(|b| {
            b.include(
                subscriber(
                    RedisList::new("q").reliable().retry(Backoff::immediate()),
                    r,
                )
                .build(),
            );
        })
        .await;
    publish(env, "q", &[Job { n: 1 }]).await;
    wait_seen(env, &rec, 2).await;
    let seen = rec.seen();
    assert_eq!(rec.attempts(), [1, 2]);
    assert_eq!(seen[0].id, seen[1].id, "a retry keeps the message id");
    env.eventually("settled", async || env.keys().await.is_empty())
        .await;
    stop(app).await;
}

fn retry_after_300ms(attempt: u32) -> Act {
    if attempt == 1 {
        Act::Settle(HandlerOutcome::retry_after(Duration::from_millis(300)))
    } else {
        Act::Ack
    }
}

async fn reliable_retry_after(env: &Env) {
    let rec = Rec::new(retry_after_300ms);
    let r = rec.clone();
    let app = env
        .start(|b| {
            b.include(subscriber(RedisList::new("q").reliable(), r).build());
        })
        .await;
    publish(env, "q", &[Job { n: 1 }]).await;
    wait_seen(env, &rec, 1).await;
    env.eventually("the retry waits in the delayed set", async || {
        env.zcard("q.delayed").await == 1
    })
    .await;
    wait_seen(env, &rec, 2).await;
    let seen = rec.seen();
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(1800),
        "retried after {waited:?}, asked 300 ms"
    );
    assert_eq!(rec.attempts(), [1, 2]);
    env.eventually("delayed set and payloads emptied", async || {
        env.keys().await.is_empty()
    })
    .await;
    stop(app).await;
}

fn drop_it(_: u32) -> Act {
    Act::Settle(HandlerOutcome::drop())
}

async fn reliable_drop_to_dead_letters(env: &Env) {
    let rec = Rec::new(drop_it);
    let r = rec.clone();
    let app = env
        .start(|b| {
            b.include(subscriber(RedisList::new("q").reliable(), r).build());
        })
        .await;
    publish(env, "q", &[Job { n: 4 }]).await;
    wait_seen(env, &rec, 1).await;
    env.eventually("a dead letter", async || env.llen("q.dead").await == 1)
        .await;
    let dead = env.frames("q.dead").await;
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("dropped")
    );
    assert_eq!(
        (dead[0].attempt, dead[0].id.as_str()),
        (1, rec.seen()[0].id.as_str())
    );
    assert_eq!(&dead[0].payload[..], job_json(4).as_bytes());
    assert_eq!(env.keys().await, ["q.dead"]);
    stop(app).await;
}

fn always_retry(_: u32) -> Act {
    Act::Settle(HandlerOutcome::retry())
}

async fn reliable_max_attempts(env: &Env) {
    let rec = Rec::new(always_retry);
    let r = rec.clone();
    let app = env
        .start(|b| {
            b.include(
                subscriber(
                    RedisList::new("q")
                        .reliable()
                        .max_attempts(2)
                        .retry(Backoff::immediate()),
                    r,
                )
                .build(),
            );
        })
        .await;
    publish(env, "q", &[Job { n: 5 }]).await;
    env.eventually("a dead letter", async || env.llen("q.dead").await == 1)
        .await;
    assert_eq!(rec.attempts(), [1, 2]);
    let dead = env.frames("q.dead").await;
    assert_eq!(
        (
            dead[0].headers.get("reason").map(String::as_str),
            dead[0].attempt
        ),
        (Some("max-attempts"), 2)
    );
    stop(app).await;
}

async fn undecodable_and_raw_values(env: &Env) {
    let rec = Rec::new(always_ack);
    let r = rec.clone();
    let app = env
        .start(|b| {
            b.include(subscriber(RedisList::new("q").reliable().concurrency(1), r).build());
        })
        .await;
    // As `redis-cli LPUSH` would: no frame, no headers.
    let _: i64 = env
        .client
        .lpush(env.key("q"), vec!["not json", job_json(7).as_str()])
        .await
        .expect("LPUSH");
    env.eventually("a dead letter", async || env.llen("q.dead").await == 1)
        .await;
    wait_seen(env, &rec, 1).await;
    let dead = env.frames("q.dead").await;
    let reason = dead[0].headers.get("reason").cloned().unwrap_or_default();
    assert!(reason.starts_with("decode"), "reason: {reason}");
    assert_eq!(&dead[0].payload[..], b"not json");
    let seen = rec.seen();
    assert_eq!((seen[0].n, seen[0].attempt), (7, 1));
    assert!(!seen[0].id.is_empty(), "a raw value gets an id");
    stop(app).await;
}

// ---------------------------------------------------------------------------------------------
// Recovery: the recovery set, min_idle, recovery_ttl.
// ---------------------------------------------------------------------------------------------

fn hang_first(attempt: u32) -> Act {
    if attempt == 1 { Act::Hang } else { Act::Ack }
}

fn recoverable() -> RedisList {
    RedisList::new("{r}")
        .reliable()
        .min_idle(Duration::from_millis(300))
        .recovery_zset("{r}.claims")
        .recovery_ttl(Duration::from_secs(5))
}

async fn recovery_after_min_idle(env: &Env) {
    let rec = Rec::new(hang_first);
    let r = rec.clone();
    let app = env
        .start(|b| {
            b.include(subscriber(recoverable(), r).build());
        })
        .await;
    publish(env, "{r}", &[Job { n: 8 }]).await;
    wait_seen(env, &rec, 1).await;
    env.eventually("the claim is recorded", async || {
        env.zcard("{r}.claims").await == 1
    })
    .await;
    assert_eq!(env.llen("{r}.processing").await, 1);
    let ttl = env.pttl("{r}.claims").await;
    assert!(ttl > 0 && ttl <= 5000, "recovery_ttl armed: {ttl}");
    wait_seen(env, &rec, 2).await;
    let seen = rec.seen();
    assert_eq!(rec.attempts(), [1, 2], "recovery counts an attempt");
    assert_eq!(seen[0].id, seen[1].id);
    // Not before min_idle (less the moment between the claim and the handler's start).
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(2000),
        "recovered after {waited:?}, min_idle 300 ms"
    );
    env.eventually("claims and processing emptied", async || {
        env.zcard("{r}.claims").await == 0 && env.llen("{r}.processing").await == 0
    })
    .await;
    stop(app).await;
}

async fn recovery_frames_a_raw_value(env: &Env) {
    let rec = Rec::new(hang_first);
    let r = rec.clone();
    let app = env
        .start(|b| {
            b.include(subscriber(recoverable(), r).build());
        })
        .await;
    let _: i64 = env
        .client
        .lpush(env.key("{r}"), job_json(9))
        .await
        .expect("LPUSH");
    wait_seen(env, &rec, 2).await;
    let seen = rec.seen();
    assert_eq!((seen[1].n, seen[1].attempt), (9, 2));
    stop(app).await;
}

// ---------------------------------------------------------------------------------------------
// Simple lists.
// ---------------------------------------------------------------------------------------------

async fn simple_ack_drop_and_retry(env: &Env) {
    fn plan(_: u32) -> Act {
        Act::Ack
    }
    let ack = Rec::new(plan);
    let dropped = Rec::new(drop_it);
    let retried = Rec::new(always_retry);
    let (a, d, r) = (ack.clone(), dropped.clone(), retried.clone());
    let app = env
        .start(|b| {
            b.include(subscriber(RedisList::new("sa"), a).build());
            b.include(subscriber(RedisList::new("sd"), d).build());
            b.include(subscriber(RedisList::new("sr"), r).build());
        })
        .await;
    for key in ["sa", "sd", "sr"] {
        publish(env, key, &[Job { n: 1 }]).await;
    }
    wait_seen(env, &ack, 1).await;
    wait_seen(env, &dropped, 1).await;
    wait_seen(env, &retried, 1).await;
    env.eventually("the drop's dead letter", async || {
        env.llen("sd.dead").await == 1
    })
    .await;
    // At most once: a simple list's retry has nothing to put back.
    env.advance(Duration::from_millis(1500)).await;
    assert_eq!(retried.count(), 1);
    let dead = env.frames("sd.dead").await;
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("dropped")
    );
    assert_eq!(env.keys().await, ["sd.dead"]);
    stop(app).await;
}

// ---------------------------------------------------------------------------------------------
// Publishing: TTL, delayed delivery.
// ---------------------------------------------------------------------------------------------

async fn publish_with_ttl_expires_the_queue(env: &Env) {
    env.broker.connect().await.expect("connect");
    let policy = PublishPolicy::List(list::Publish::new().ttl(Duration::from_millis(500)));
    let msg = ruststream::OutMessage::new("t", job_json(1).into());
    env.broker
        .publish_with(&policy, vec![msg])
        .await
        .expect("publish");
    assert_eq!(env.llen("t").await, 1);
    let ttl = env.pttl("t").await;
    assert!(ttl > 0 && ttl <= 500, "ttl armed: {ttl}");
    env.advance(Duration::from_millis(700)).await;
    assert!(!env.exists("t").await, "the queue expired");
    assert_eq!(env.pttl("t").await, -2);
    env.broker.close().await;
}

async fn delayed_publish(env: &Env) {
    let rec = Rec::new(always_ack);
    let r = rec.clone();
    let app = env
        .start(|b| {
            b.include(subscriber(RedisList::new("d").reliable(), r).build());
        })
        .await;
    let sent = Instant::now();
    let p = env.broker().publisher();
    for _ in 0..2 {
        // The same id twice: the second waits on the first's schedule.
        p.message(&Job { n: 3 })
            .to("d")
            .id("once")
            .delay(Duration::from_millis(300))
            .publish()
            .await
            .expect("publish");
    }
    assert_eq!(env.zcard("d.delayed").await, 1);
    env.advance(Duration::from_millis(150)).await;
    if sent.elapsed() < Duration::from_millis(280) {
        assert_eq!(rec.count(), 0, "not before it is due");
    }
    wait_seen(env, &rec, 1).await;
    let late = rec.seen()[0].at - sent;
    // The publish's wake-up (PUBLISH on the delayed set) makes the reader wait for this entry
    // rather than for its next poll.
    assert!(
        late >= Duration::from_millis(300) && late < Duration::from_millis(900),
        "delivered after {late:?}, asked 300 ms"
    );
    env.advance(Duration::from_millis(1200)).await;
    assert_eq!(rec.count(), 1, "one schedule per id");
    assert_eq!(rec.seen()[0].id, "once");
    assert_eq!(env.keys().await, Vec::<String>::new());
    stop(app).await;
}

// ---------------------------------------------------------------------------------------------
// Streams with consumer groups.
// ---------------------------------------------------------------------------------------------

async fn xpending_count(env: &Env, key: &str, group: &str) -> i64 {
    match env
        .cmd("XPENDING", vec![env.key(key).into(), group.into()])
        .await
        .expect("XPENDING")
    {
        Value::Array(v) => v.first().and_then(Value::as_i64).unwrap_or(-1),
        other => panic!("XPENDING: {other:?}"),
    }
}

async fn xlen(env: &Env, key: &str) -> i64 {
    env.client.xlen(env.key(key)).await.expect("XLEN")
}

async fn stream_ack_retry_drop(env: &Env) {
    let ack = Rec::new(always_ack);
    let retried = Rec::new(retry_once);
    let dropped = Rec::new(drop_it);
    let (a, r, d) = (ack.clone(), retried.clone(), dropped.clone());
    let app = env
        .start(|b| {
            b.include(subscriber(RedisStream::new("sa").group("g"), a).build());
            b.include(
                subscriber(
                    RedisStream::new("sr")
                        .group("g")
                        .retry(Backoff::immediate()),
                    r,
                )
                .build(),
            );
            b.include(subscriber(RedisStream::new("sd").group("g"), d).build());
        })
        .await;
    for key in ["sa", "sr", "sd"] {
        publish(env, key, &[Job { n: 2 }]).await;
    }
    wait_seen(env, &ack, 1).await;
    wait_seen(env, &retried, 2).await;
    wait_seen(env, &dropped, 1).await;
    assert_eq!(retried.attempts(), [1, 2]);
    let seen = retried.seen();
    assert_eq!(seen[0].id, seen[1].id, "a retry keeps the message id");
    env.eventually("every entry acknowledged", async || {
        xpending_count(env, "sa", "g").await == 0
            && xpending_count(env, "sr", "g").await == 0
            && xpending_count(env, "sd", "g").await == 0
    })
    .await;
    assert_eq!(
        (
            xlen(env, "sa").await,
            xlen(env, "sr").await,
            xlen(env, "sd").await
        ),
        (1, 2, 1),
        "a retry is a new entry"
    );
    env.eventually("the drop's dead letter", async || {
        env.llen("sd.dead").await == 1
    })
    .await;
    let dead = env.frames("sd.dead").await;
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("dropped")
    );
    stop(app).await;
}

async fn stream_retry_after(env: &Env) {
    let rec = Rec::new(retry_after_300ms);
    let r = rec.clone();
    let app = env
        .start(|b| {
            b.include(subscriber(RedisStream::new("s").group("g"), r).build());
        })
        .await;
    publish(env, "s", &[Job { n: 6 }]).await;
    wait_seen(env, &rec, 2).await;
    let seen = rec.seen();
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(1800),
        "retried after {waited:?}, asked 300 ms"
    );
    assert_eq!(
        (rec.attempts(), seen[0].id == seen[1].id),
        (vec![1, 2], true)
    );
    env.eventually("acknowledged, moved from the delayed set", async || {
        xpending_count(env, "s", "g").await == 0 && !env.exists("s.delayed").await
    })
    .await;
    assert_eq!(xlen(env, "s").await, 2);
    stop(app).await;
}

/// Groups, pending entries and delivery counts with raw commands.
async fn stream_pending_entries_and_delivery_counts(env: &Env) {
    let k = env.key("raw");
    let s = |v: &str| Value::from(v.to_owned());
    env.cmd(
        "XGROUP",
        vec![s("CREATE"), s(&k), s("g"), s("0"), s("MKSTREAM")],
    )
    .await
    .expect("XGROUP CREATE");
    let busy = env
        .cmd(
            "XGROUP",
            vec![s("CREATE"), s(&k), s("g"), s("0"), s("MKSTREAM")],
        )
        .await
        .expect_err("a second CREATE");
    assert!(busy.details().starts_with("BUSYGROUP"), "{busy:?}");
    for v in ["1", "2"] {
        env.cmd("XADD", vec![s(&k), s("*"), s("a"), s(v)])
            .await
            .expect("XADD");
    }
    let read = |id: &'static str| {
        vec![
            s("GROUP"),
            s("g"),
            s("c1"),
            s("COUNT"),
            s("10"),
            s("STREAMS"),
            s(&k),
            s(id),
        ]
    };
    let new = env
        .cmd("XREADGROUP", read(">"))
        .await
        .expect("XREADGROUP >");
    assert_eq!(entries(&new).len(), 2);
    let again = env
        .cmd("XREADGROUP", read(">"))
        .await
        .expect("XREADGROUP >");
    assert!(again.is_null(), "nothing new: {again:?}");
    let history = env
        .cmd("XREADGROUP", read("0"))
        .await
        .expect("XREADGROUP 0");
    let ids = entries(&history);
    assert_eq!(ids.len(), 2, "the consumer's pending entries");
    let pending = env
        .cmd("XPENDING", vec![s(&k), s("g"), s("-"), s("+"), s("10")])
        .await
        .expect("XPENDING");
    let counts: Vec<(String, i64)> = pending
        .into_array()
        .into_iter()
        .map(|p| {
            let p = p.into_array();
            (
                p[1].as_string().unwrap_or_default(),
                p[3].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(
        counts,
        [("c1".to_owned(), 2), ("c1".to_owned(), 2)],
        "reading history counts a delivery"
    );
    let acked = env
        .cmd("XACK", vec![s(&k), s("g"), s(&ids[0])])
        .await
        .expect("XACK");
    assert_eq!(acked.as_i64(), Some(1));
    let claimed = env
        .cmd("XCLAIM", vec![s(&k), s("g"), s("c2"), s("0"), s(&ids[1])])
        .await
        .expect("XCLAIM");
    assert_eq!(claimed.into_array().len(), 1);
    let summary = env
        .cmd("XPENDING", vec![s(&k), s("g")])
        .await
        .expect("XPENDING")
        .into_array();
    assert_eq!(summary[0].as_i64(), Some(1));
    let per_consumer = summary[3].clone().into_array();
    let first = per_consumer[0].clone().into_array();
    assert_eq!(first[0].as_string().as_deref(), Some("c2"));
    let nogroup = env
        .cmd(
            "XREADGROUP",
            vec![s("GROUP"), s("nope"), s("c"), s("STREAMS"), s(&k), s(">")],
        )
        .await
        .expect_err("an unknown group");
    assert!(nogroup.details().starts_with("NOGROUP"), "{nogroup:?}");
}

/// The ids of an `XREADGROUP` reply's entries.
fn entries(reply: &Value) -> Vec<String> {
    let mut ids = Vec::new();
    if let Value::Array(streams) = reply {
        for s in streams {
            if let Value::Array(kv) = s
                && let Some(Value::Array(es)) = kv.get(1)
            {
                for e in es {
                    if let Value::Array(parts) = e
                        && let Some(id) = parts.first().and_then(Value::as_string)
                    {
                        ids.push(id);
                    }
                }
            }
        }
    }
    ids
}

// ---------------------------------------------------------------------------------------------
// Keys, expiry and the scripts, with raw commands.
// ---------------------------------------------------------------------------------------------

async fn lists_sets_and_expiry(env: &Env) {
    let (l, z, h) = (env.key("l"), env.key("z"), env.key("h"));
    let _: i64 = env.client.lpush(&l, vec!["a", "b"]).await.expect("LPUSH");
    let _: bool = env.client.pexpire(&l, 10_000, None).await.expect("PEXPIRE");
    let _: i64 = env.client.lpush(&l, "c").await.expect("LPUSH");
    assert!(env.pttl("l").await > 0, "a push keeps the expiry");
    let popped: Vec<String> = env.client.rpop(&l, Some(5)).await.expect("RPOP");
    assert_eq!(popped, ["a", "b", "c"]);
    assert_eq!(
        (env.exists("l").await, env.pttl("l").await),
        (false, -2),
        "an emptied list is gone, with its expiry"
    );
    let s = |v: &str| Value::from(v.to_owned());
    env.cmd(
        "ZADD",
        vec![
            s(&z),
            s("1700000000000"),
            s("m1"),
            s("1.5"),
            s("m0"),
            s("1.5"),
            s("a"),
        ],
    )
    .await
    .expect("ZADD");
    let r = env
        .cmd(
            "ZRANGEBYSCORE",
            vec![
                s(&z),
                s("-inf"),
                s("+inf"),
                s("WITHSCORES"),
                s("LIMIT"),
                s("0"),
                s("10"),
            ],
        )
        .await
        .expect("ZRANGEBYSCORE");
    let got: Vec<String> = r
        .into_array()
        .into_iter()
        .filter_map(|v| v.as_string())
        .collect();
    assert_eq!(got, ["a", "1.5", "m0", "1.5", "m1", "1700000000000"]);
    let wrong = env
        .client
        .llen::<i64, _>(&z)
        .await
        .expect_err("LLEN of a zset");
    assert!(wrong.details().starts_with("WRONGTYPE"), "{wrong:?}");
    let _: i64 = env.client.hset(&h, ("f", "v")).await.expect("HSET");
    let set: i64 = env
        .cmd("HSETNX", vec![s(&h), s("f"), s("w")])
        .await
        .expect("HSETNX")
        .as_i64()
        .unwrap_or(-1);
    assert_eq!(set, 0);
    let _: i64 = env.client.hdel(&h, "f").await.expect("HDEL");
    assert!(!env.exists("h").await, "an emptied hash is gone");
}

async fn delayed_scripts_order_and_idempotence(env: &Env) {
    let pool = env.client.clone();
    for script in [&*scripts::SCHEDULE, &*scripts::MOVE_DUE] {
        script.load(&pool).await.expect("SCRIPT LOAD");
    }
    let (zset, hash, list, stream) = (
        env.key("{j}.delayed"),
        env.key("{j}.delayed.payloads"),
        env.key("{j}"),
        env.key("{j}s"),
    );
    let frame = |id: &str| {
        ruststream::redis::frame::encode_parts(id, 1, &Default::default(), job_json(1).as_bytes())
    };
    let mut args: Vec<Value> = Vec::new();
    for (id, at) in [("a", 1000), ("b", 3000), ("c", 2000)] {
        args.extend([
            Value::from("at"),
            Value::Integer(at),
            Value::from(id),
            Value::Bytes(frame(id)),
        ]);
    }
    let added: i64 = scripts::SCHEDULE
        .evalsha(&pool, vec![zset.clone(), hash.clone()], args.clone())
        .await
        .expect("SCHEDULE");
    assert_eq!(added, 3);
    let again: i64 = scripts::SCHEDULE
        .evalsha(&pool, vec![zset.clone(), hash.clone()], args)
        .await
        .expect("SCHEDULE");
    assert_eq!(again, 0, "ids already waiting keep their schedule");
    let moved: Vec<i64> = scripts::MOVE_DUE
        .evalsha(
            &pool,
            vec![zset.clone(), hash.clone(), list.clone()],
            vec![Value::Integer(2), Value::from("list")],
        )
        .await
        .expect("MOVE_DUE");
    assert_eq!(
        (moved[0], moved[2]),
        (2, 3000),
        "two moved, the next due at 3000"
    );
    assert_eq!(moved.len(), 5, "with each one's lateness");
    let ids: Vec<String> = env.frames("{j}").await.into_iter().map(|f| f.id).collect();
    assert_eq!(ids, ["c", "a"], "the earliest at the consuming (right) end");
    let moved: Vec<i64> = scripts::MOVE_DUE
        .evalsha(
            &pool,
            vec![zset, hash, stream.clone()],
            vec![Value::Integer(10), Value::from("stream")],
        )
        .await
        .expect("MOVE_DUE");
    assert_eq!((moved[0], moved[2]), (1, -1));
    let entries: Value = env
        .cmd("XRANGE", vec![stream.into(), "-".into(), "+".into()])
        .await
        .expect("XRANGE");
    let fields: Vec<String> = entries.into_array()[0].clone().into_array()[1]
        .clone()
        .into_array()
        .into_iter()
        .filter_map(|v| v.as_string())
        .collect();
    assert_eq!(
        fields,
        ["rs.id", "b", "rs.attempt", "1", "payload", &job_json(1)]
    );
    assert_eq!(
        env.keys().await,
        ["{j}", "{j}s"],
        "the delayed set and payloads are gone"
    );
}

// ---------------------------------------------------------------------------------------------
// Cluster: the slot rule.
// ---------------------------------------------------------------------------------------------

async fn cluster_slot_rule(env: &Env) {
    scripts::SCHEDULE
        .load(&env.client)
        .await
        .expect("SCRIPT LOAD");
    let args = |id: &str| {
        vec![
            Value::from("in"),
            Value::Integer(60_000),
            Value::from(id),
            Value::from("v"),
        ]
    };
    let split = scripts::SCHEDULE
        .evalsha::<i64, _, _, _>(
            &env.client,
            vec![env.key("jobs.delayed"), env.key("jobs.delayed.payloads")],
            args("x"),
        )
        .await
        .expect_err("keys in two slots");
    // The server says CROSSSLOT; fred says so first when the two slots are on different nodes.
    assert!(
        split.details().starts_with("CROSSSLOT")
            || split
                .details()
                .contains("must belong to the same cluster node"),
        "{split:?}"
    );
    let tagged: i64 = scripts::SCHEDULE
        .evalsha(
            &env.client,
            vec![
                env.key("{jobs}.delayed"),
                env.key("{jobs}.delayed.payloads"),
            ],
            args("x"),
        )
        .await
        .expect("keys in one slot");
    assert_eq!(tagged, 1);
    // Through the broker: the delayed set of an untagged queue is derived into the queue's slot.
    env.broker.connect().await.expect("connect");
    env.broker
        .publisher()
        .message(&Job { n: 1 })
        .to("jobs")
        .delay(Duration::from_secs(60))
        .publish()
        .await
        .expect("a delayed publish to an untagged queue");
    let delayed = env.broker.delayed_set_key("jobs");
    let n: i64 = env.client.zcard(&delayed).await.expect("ZCARD");
    assert_eq!(n, 1, "scheduled in {delayed}");
    env.broker.close().await;
    for k in [
        env.key("{jobs}.delayed"),
        env.key("{jobs}.delayed.payloads"),
        delayed.clone(),
        delayed.replace(".delayed", ".delayed.payloads"),
    ] {
        let _: i64 = env.client.del(k).await.expect("DEL");
    }
}

// ---------------------------------------------------------------------------------------------
// Pub/Sub: channels and patterns, no redelivery.
// ---------------------------------------------------------------------------------------------

/// Retries 1, drops 2, acks the rest; records the numbers and the source channels.
#[derive(Clone, Default)]
struct ChannelRec(Arc<Mutex<Vec<(u32, String)>>>);

impl Handle<Job> for ChannelRec {
    async fn handle(&self, job: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.0
            .lock()
            .expect("lock")
            .push((job.n, ctx.source().to_owned()));
        match job.n {
            1 => Err(HandlerOutcome::retry()),
            2 => Err(HandlerOutcome::drop()),
            _ => Ok(()),
        }
    }
}

async fn numsub(env: &Env, channel: &str) -> i64 {
    let reply = env
        .cmd(
            "PUBSUB",
            vec!["NUMSUB".into(), env.key(channel).as_str().into()],
        )
        .await
        .expect("PUBSUB NUMSUB");
    match reply {
        Value::Array(v) => v.get(1).and_then(Value::as_i64).unwrap_or(0),
        _ => 0,
    }
}

async fn pubsub_channel_and_pattern(env: &Env) {
    let (one, all) = (ChannelRec::default(), ChannelRec::default());
    let (o, a) = (one.clone(), all.clone());
    let app = env
        .start(|b| {
            b.include(subscriber(RedisChannel::new("ev"), o).build());
            b.include(subscriber(RedisChannel::pattern("ev.*"), a).build());
        })
        .await;
    env.eventually("the channel's subscriber", async || {
        numsub(env, "ev").await == 1
    })
    .await;
    // The app reads `ev` as a channel: its publisher PUBLISHes there.
    publish(env, "ev", &[Job { n: 1 }, Job { n: 2 }, Job { n: 3 }]).await;
    let raw: i64 = env
        .client
        .publish(env.key("ev"), "not json")
        .await
        .expect("PUBLISH");
    assert_eq!(raw, 1, "one subscriber of `ev`");
    let to_pattern: i64 = env
        .client
        .publish(env.key("ev.x"), job_json(9))
        .await
        .expect("PUBLISH");
    assert_eq!(to_pattern, 1, "one subscriber of `ev.*`");
    env.eventually("three dead letters", async || {
        env.llen("ev.dead").await == 3
    })
    .await;
    env.eventually("the pattern's message", async || {
        !all.0.lock().expect("lock").is_empty()
    })
    .await;
    // Nothing comes back: Pub/Sub cannot redeliver.
    env.advance(Duration::from_millis(1500)).await;
    stop(app).await;

    let mut seen = one.0.lock().expect("lock").clone();
    seen.sort();
    assert_eq!(
        seen,
        [
            (1, "ev".to_owned()),
            (2, "ev".to_owned()),
            (3, "ev".to_owned())
        ]
    );
    assert_eq!(*all.0.lock().expect("lock"), [(9, "ev.x".to_owned())]);
    let mut reasons: Vec<String> = env
        .frames("ev.dead")
        .await
        .iter()
        .map(|f| f.headers.get("reason").cloned().unwrap_or_default())
        .map(|r| {
            if r.starts_with("decode:") {
                "decode".to_owned()
            } else {
                r
            }
        })
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "decode".to_owned(),
            "dropped".to_owned(),
            ruststream::pubsub::NO_REDELIVERY.to_owned()
        ]
    );
    assert_eq!(env.keys().await, ["ev.dead"]);
    env.eventually("no subscriber left", async || numsub(env, "ev").await == 0)
        .await;
}

// ---------------------------------------------------------------------------------------------
// The lists: one line per scenario.
// ---------------------------------------------------------------------------------------------

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        /// Every scenario on the in-memory model, on a paused (virtual) clock.
        mod memory {$(
            #[tokio::test(start_paused = true)]
            async fn $name() {
                let env = super::Env::memory(stringify!($name), false).await;
                super::$name(&env).await;
                env.cleanup().await;
            }
        )*}
        /// Every scenario on a real Redis.
        mod redis {$(
            #[tokio::test]
            async fn $name() {
                let env = super::Env::redis(stringify!($name), None).await;
                super::$name(&env).await;
                env.cleanup().await;
            }
        )*}
    };
}

macro_rules! conformance_cluster {
    ($($name:ident),* $(,)?) => {
        /// Cluster scenarios on the model in cluster mode.
        mod memory_cluster {$(
            #[tokio::test(start_paused = true)]
            async fn $name() {
                let env = super::Env::memory(stringify!($name), true).await;
                super::$name(&env).await;
                env.cleanup().await;
            }
        )*}
        /// Cluster scenarios on the stand's cluster.
        mod redis_cluster {$(
            #[tokio::test]
            async fn $name() {
                let Some(nodes) = super::cluster_urls() else { return };
                let env = super::Env::redis(stringify!($name), Some(nodes)).await;
                super::$name(&env).await;
                env.cleanup().await;
            }
        )*}
    };
}

conformance! {
    // reliable lists
    reliable_acks_in_order,
    reliable_retry,
    reliable_retry_after,
    reliable_drop_to_dead_letters,
    reliable_max_attempts,
    undecodable_and_raw_values,
    // recovery
    recovery_after_min_idle,
    recovery_frames_a_raw_value,
    // simple lists
    simple_ack_drop_and_retry,
    // publishing
    publish_with_ttl_expires_the_queue,
    delayed_publish,
    // streams
    stream_ack_retry_drop,
    stream_retry_after,
    stream_pending_entries_and_delivery_counts,
    // pub/sub
    pubsub_channel_and_pattern,
    // keys and scripts
    lists_sets_and_expiry,
    delayed_scripts_order_and_idempotence,
}

conformance_cluster! {
    cluster_slot_rule,
}
