//! What the reliability tests share: a job type, recording handlers, captured logs, a metrics
//! recorder, and small helpers on the test's keys.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::redis::frame::Frame;
use ruststream::{Mount, RunningApp};

use crate::harness::{Env, WAIT, start, wait_until};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct Job {
    pub n: u32,
}
outgoing!(Job);

pub use crate::harness::{Verdict, ack, hang, settle};

/// One delivery as a handler saw it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seen {
    pub n: u32,
    pub attempt: u32,
}

/// `(n, attempt)` pairs, for comparisons.
pub fn seen(pairs: &[(u32, u32)]) -> Vec<Seen> {
    pairs
        .iter()
        .map(|&(n, attempt)| Seen { n, attempt })
        .collect()
}

/// The harness's recorder of [`Job`]s ([`harness::Seen`]): records every delivery, then settles
/// as `Rec::deciding(|job, attempt, index of the call| ..)` says.
pub type Rec = crate::harness::Seen<Job>;

impl Rec {
    /// The deliveries as `(n, attempt)`, sorted.
    pub fn sorted(&self) -> Vec<Seen> {
        let mut s: Vec<Seen> = self.seen().iter().map(Seen::from).collect();
        s.sort();
        s
    }

    /// How many distinct jobs were delivered.
    pub fn distinct(&self) -> usize {
        let mut ns: Vec<u32> = self.seen().iter().map(|s| s.n).collect();
        ns.sort_unstable();
        ns.dedup();
        ns.len()
    }
}

impl From<&crate::harness::Delivery<Job>> for Seen {
    fn from(d: &crate::harness::Delivery<Job>) -> Self {
        Self {
            n: d.n,
            attempt: d.attempt,
        }
    }
}

/// A delivery compares with its `(n, attempt)`.
impl PartialEq<Seen> for crate::harness::Delivery<Job> {
    fn eq(&self, other: &Seen) -> bool {
        self.n == other.n && self.attempt == other.attempt
    }
}

/// A handler of raw payloads that records `(payload, attempt)` and never finishes.
#[derive(Clone, Default)]
pub struct RawHang {
    seen: Arc<Mutex<Vec<(Bytes, u32)>>>,
}

impl RawHang {
    pub fn seen(&self) -> Vec<(Bytes, u32)> {
        self.seen.lock().unwrap().clone()
    }
}

impl Handle<Bytes> for RawHang {
    fn handle(
        &self,
        payload: &Bytes,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> + Send {
        self.seen
            .lock()
            .unwrap()
            .push((payload.clone(), ctx.attempt()));
        std::future::pending()
    }
}

/// An app of its own on `broker` (another worker process, as far as Redis can tell), whose
/// shutdown gives handlers `grace` and then abandons them.
pub fn app_on(
    broker: RedisBroker,
    grace: Duration,
    mount: impl FnOnce(&mut Mount<RedisBroker>),
) -> RustStream {
    RustStream::new(AppInfo::new("reliability", "0"))
        .shutdown_timeout(grace)
        .with_broker(broker, mount)
}

/// Starts an app of its own (own broker and connections) with one subscription.
pub async fn worker(env: &Env, mount: impl FnOnce(&mut Mount<RedisBroker>)) -> RunningApp {
    start(app_on(
        env.broker_with(|b| b),
        Duration::from_millis(100),
        mount,
    ))
    .await
}

/// Publishes `jobs` to the list (or routed stream) `key` with the test's broker.
pub async fn publish(env: &Env, key: &str, jobs: &[Job]) {
    let broker = env.broker();
    broker.connect().await.unwrap();
    broker
        .publisher()
        .messages(jobs)
        .to(key)
        .publish()
        .await
        .unwrap();
}

/// Loads the reliable list's scripts into the server's script cache: a job through a reliable
/// list of its own, claimed and settled. A fresh server answers a script's first `EVALSHA` with
/// `NOSCRIPT` (the client then loads it and sends it again), so a test that cuts a script call
/// to lose the reply of a run that happened warms the cache first.
pub async fn load_list_scripts(env: &Env) {
    const WARM: &str = "{warm-up}";
    let rec = Rec::acking();
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(
            subscriber(
                RedisList::new(WARM)
                    .reliable()
                    .block(Duration::from_millis(100)),
                r,
            )
            .build(),
        );
    })
    .await;
    publish(env, WARM, &[Job { n: 0 }]).await;
    eventually("the warm-up job settled", async || {
        rec.count() == 1 && env.llen(&format!("{WARM}.processing")).await == 0
    })
    .await;
    crate::harness::stop(app).await;
}

/// `n` jobs numbered from 0.
pub fn jobs(n: u32) -> Vec<Job> {
    (0..n).map(|n| Job { n }).collect()
}

/// A raw `SET key value` (a key of the wrong type for RustStream).
pub async fn set_string(env: &Env, key: &str) {
    let _: () = env
        .client
        .set(env.key(key), "not RustStream's", None, None, false)
        .await
        .expect("SET");
}

/// `DEL key`.
pub async fn del(env: &Env, key: &str) {
    let _: i64 = env.client.del(env.key(key)).await.expect("DEL");
}

/// The `reason` header of each dead letter on `key`, newest first.
pub async fn reasons(env: &Env, key: &str) -> Vec<String> {
    env.frames(key)
        .await
        .iter()
        .map(|f| f.headers.get("reason").cloned().unwrap_or_default())
        .collect()
}

/// The dead letters of `key` decoded, newest first.
pub async fn dead_frames(env: &Env, key: &str) -> Vec<Frame> {
    env.frames(key).await
}

/// `XPENDING key group`'s count.
pub async fn pending_count(env: &Env, stream: &str, group: &str) -> i64 {
    let v = env
        .cmd("XPENDING", vec![env.key(stream).into(), group.into()])
        .await
        .expect("XPENDING");
    match v {
        Value::Array(items) => items.first().and_then(Value::as_i64).unwrap_or(0),
        _ => 0,
    }
}

/// `(consumer, deliveries)` of each pending entry of `group` on `stream`.
pub async fn pending_entries(env: &Env, stream: &str, group: &str) -> Vec<(String, i64)> {
    let v = env
        .cmd(
            "XPENDING",
            vec![
                env.key(stream).into(),
                group.into(),
                "-".into(),
                "+".into(),
                100.into(),
            ],
        )
        .await
        .expect("XPENDING");
    let Value::Array(rows) = v else {
        return Vec::new();
    };
    rows.into_iter()
        .filter_map(|row| {
            let Value::Array(row) = row else { return None };
            let consumer = row.get(1)?.as_string()?;
            Some((consumer, row.get(3)?.as_i64()?))
        })
        .collect()
}

/// `XLEN`.
pub async fn xlen(env: &Env, stream: &str) -> i64 {
    env.client.xlen(env.key(stream)).await.expect("XLEN")
}

/// Waits (bounded by [`WAIT`]) until `check` holds.
pub async fn eventually(what: &str, check: impl AsyncFnMut() -> bool) {
    wait_until(what, WAIT, check).await;
}

/// The RESP bytes that start a script call on `numkeys` keys whose first key is `first`: a needle
/// that tells the scripts of one queue apart by their number of keys (a reliable list's claim
/// has 2 or 3, its settle 6, the mover 4, a lease 1).
pub fn script_call(numkeys: usize, first: &str) -> Vec<u8> {
    let n = numkeys.to_string();
    crate::harness::proxy::resp_args(&[n.as_bytes(), first.as_bytes()])
}

/// Captured logs and the metrics recorder: the harness's, one each for the test process.
pub use crate::harness::logs;
pub use crate::harness::metrics::prometheus;

/// The value of the sample of `name` whose labels include all of `labels`.
pub fn sample(name: &str, labels: &[&str]) -> Option<f64> {
    crate::harness::metrics::sample(&prometheus().render(), name, labels)
}
