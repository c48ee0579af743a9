//! The one harness of the `ruststream` integration tests: a behaviour test is written once and
//! runs on every topology it applies to.
//!
//! - **Topologies** ([`Topology`]): `memory` (the in-memory Redis model of `ruststream::testing`,
//!   on tokio's paused, virtual clock), `memory_cluster` (the model in cluster mode, same clock),
//!   `standalone` (the stand's server, `RUSTSTREAM_REDIS_URL`) and `cluster` (the stand's
//!   cluster, `RUSTSTREAM_CLUSTER_URLS`). scripts/test starts the stand and sets the variables.
//! - **A test** is `async fn name(env: &Env)`; one line of [`on!`] lists where it runs and
//!   generates `name::memory`, `name::standalone`, ... so that `cargo test name::cluster` picks
//!   one of them. [`Env`] gives a broker with a key prefix of the test's own, a raw fred client
//!   on the same server (or model), virtual or real time, bounded waits and cleanup.
//! - **Skipping**: a server topology whose variable is not set (a plain `cargo test`) is skipped
//!   with a printed message, except under `CI`, where it fails the test ([`stand_var`]).
//! - **Dedicated servers** for fault tests (killed, restarted): [`stand`].
//!
//! - **HTTP** ([`http`]): GET a server's endpoints (the metrics server's).
//! - **Logs** ([`logs`]): capture what a test process logs.
//! - **Metrics** ([`metrics`]): the test process's Prometheus recorder.
//!
//! A test binary holds many test files (`tests/integration/main.rs`), all in one process: what is
//! process-wide (the log subscriber, the metrics recorder) is installed here once, and a test
//! reads only what names its own keys, ids or subscriptions.
//!
//! Every helper exists once, here: [`redis_url`], [`unique`], [`wait_until`], [`bounded`],
//! [`config_error`], [`pubsub_refusal`], [`Seen`] (a handler that records what it handled),
//! [`Stuck`] (one that never finishes).
//! Every wait is bounded; a condition is polled, never slept on.

// Each test binary includes this module and uses part of it.
#![allow(dead_code, unused_imports, unused_macros)]

mod env;
pub mod http;
pub mod logs;
pub mod metrics;
pub mod process;
pub mod proxy;
mod seen;
pub mod stand;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use env::{Env, Topology, is_history};
use ruststream::{App, RunningApp, RustStream};
pub use seen::{Delivery, Seen, Stuck, Verdict, ack, hang, settle};

/// The longest any single condition or start/stop may take (virtual time on the model).
pub const WAIT: Duration = Duration::from_secs(10);

/// How often [`wait_until`] checks its condition.
const POLL: Duration = Duration::from_millis(5);

/// Generates one `#[tokio::test]` per topology for each `async fn name(env: &Env)`:
///
/// ```ignore
/// on!([memory, standalone, cluster] reliable_acks_in_order, reliable_retry);
/// on!([standalone, cluster] multi_thread: the_concurrency_limit_is_never_exceeded);
/// ```
///
/// gives `reliable_acks_in_order::memory`, `reliable_acks_in_order::standalone`, ... The
/// topologies are `memory`, `memory_cluster`, `standalone` and `cluster`. With `multi_thread:`,
/// the server topologies run on tokio's multi-threaded runtime (4 workers); the model always runs
/// on the paused current-thread runtime its virtual clock needs.
macro_rules! on {
    (@mod $name:ident [$($topo:ident),+ $(,)?] $flavor:tt) => {
        mod $name {
            $( crate::harness::on!(@test $name $topo $flavor); )+
        }
    };
    (@test $name:ident memory $flavor:tt) => {
        #[tokio::test(start_paused = true)]
        async fn memory() {
            crate::harness::on!(@body $name Memory);
        }
    };
    (@test $name:ident memory_cluster $flavor:tt) => {
        #[tokio::test(start_paused = true)]
        async fn memory_cluster() {
            crate::harness::on!(@body $name MemoryCluster);
        }
    };
    (@test $name:ident standalone ($($flavor:tt)*)) => {
        #[tokio::test($($flavor)*)]
        async fn standalone() {
            crate::harness::on!(@body $name Standalone);
        }
    };
    (@test $name:ident cluster ($($flavor:tt)*)) => {
        #[tokio::test($($flavor)*)]
        async fn cluster() {
            crate::harness::on!(@body $name Cluster);
        }
    };
    (@body $name:ident $topology:ident) => {
        let topology = crate::harness::Topology::$topology;
        if let Some(env) = crate::harness::Env::open(topology, stringify!($name)).await {
            super::$name(&env).await;
            env.cleanup().await;
        }
    };
    ($topos:tt multi_thread: $($name:ident),+ $(,)?) => {
        $( crate::harness::on!(@mod $name $topos (flavor = "multi_thread", worker_threads = 4)); )+
    };
    ($topos:tt $($name:ident),+ $(,)?) => {
        $( crate::harness::on!(@mod $name $topos ()); )+
    };
}
pub(crate) use on;

/// The value of a stand variable; `None` (the test skips, saying so) when it is not set, except
/// under CI, where a missing variable fails the test: CI runs the tests through scripts/test.
pub fn stand_var(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => Some(v),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{name} is not set: CI runs the tests through scripts/test, which sets it")
        }
        _ => {
            eprintln!("SKIPPED: {name} is not set; run the tests with scripts/test");
            None
        }
    }
}

/// The stand's sentinel set: its service name (`RUSTSTREAM_SENTINEL_SERVICE`) and the sentinels'
/// addresses (`RUSTSTREAM_SENTINEL_HOSTS`, comma-separated); `None`: skip (see [`stand_var`]).
pub fn sentinel_stand() -> Option<(String, Vec<String>)> {
    match (
        stand_var("RUSTSTREAM_SENTINEL_SERVICE"),
        stand_var("RUSTSTREAM_SENTINEL_HOSTS"),
    ) {
        (Some(service), Some(hosts)) => {
            Some((service, hosts.split(',').map(str::to_owned).collect()))
        }
        _ => None,
    }
}

/// The stand's TLS server: its URL (`RUSTSTREAM_TLS_URL`) and the PEM file of its private CA
/// (`RUSTSTREAM_TLS_CA`); `None`: skip (see [`stand_var`]).
pub fn tls_stand() -> Option<(String, String)> {
    match (
        stand_var("RUSTSTREAM_TLS_URL"),
        stand_var("RUSTSTREAM_TLS_CA"),
    ) {
        (Some(url), Some(ca)) => Some((url, ca)),
        _ => None,
    }
}

/// The stand's standalone server (`RUSTSTREAM_REDIS_URL`); `None`: skip (see [`stand_var`]).
pub fn redis_url() -> Option<String> {
    stand_var("RUSTSTREAM_REDIS_URL")
}

/// The stand's cluster node URLs (`RUSTSTREAM_CLUSTER_URLS`); `None`: skip.
pub fn cluster_urls() -> Option<Vec<String>> {
    stand_var("RUSTSTREAM_CLUSTER_URLS").map(|v| v.split(',').map(str::to_owned).collect())
}

/// `url` with database `db` selected (drops any path or query of the URL).
pub fn with_db(url: &str, db: u8) -> String {
    let host_start = url.find("://").map_or(0, |i| i + 3);
    let host_end = url[host_start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| host_start + i);
    format!("{}/{db}", &url[..host_end])
}

/// A name no other test (in this process or another) uses: pid, clock and a counter.
pub fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("rstest-{}-{ms}-{n}-{tag}", std::process::id())
}

/// The configuration error `e` is; panics (failing the test) on any other error.
pub fn config_error(e: &ruststream::Error) -> &ruststream::ConfigError {
    e.config_error()
        .unwrap_or_else(|| panic!("a configuration error, not: {e}"))
}

/// A step's error as a test keeps it: its text, and the configuration error it carries.
pub type StepFailure = (String, Option<ruststream::ConfigError>);

/// `e` as a test keeps it ([`StepFailure`]).
pub fn step_failure<E: std::fmt::Display>(e: &ruststream::steps::StepError<E>) -> StepFailure {
    let config = match e {
        ruststream::steps::StepError::Record(r) => r.config_error().cloned(),
        _ => None,
    };
    (e.to_string(), config)
}

/// What `inspect_err` takes to keep a step's error in `errors` ([`step_failure`]).
pub fn keep_failure<E: std::fmt::Display>(
    errors: &std::sync::Mutex<Vec<StepFailure>>,
) -> impl Fn(&ruststream::steps::StepError<E>) + '_ {
    move |e| errors.lock().expect("lock").push(step_failure(e))
}

/// The Pub/Sub refusal `e` carries as its source, checked to be of kind `Configuration`;
/// panics (failing the test) on any other error.
pub fn pubsub_refusal(e: &ruststream::Error) -> &ruststream::redis::error::PubSubError {
    assert_eq!(e.kind(), ruststream::ErrorKind::Configuration, "{e}");
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref())
        .unwrap_or_else(|| panic!("a Pub/Sub refusal, not: {e}"))
}

/// Waits until `check` holds, polling every few milliseconds; panics with `what` after `limit`.
pub async fn wait_until(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let polled = tokio::time::timeout(limit, async {
        while !check().await {
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    assert!(
        polled.is_ok(),
        "timed out after {limit:?} waiting until {what}"
    );
}

/// Awaits `fut`, panicking with `what` if it takes longer than `limit`.
pub async fn bounded<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Starts `app` within [`WAIT`]; its error if it does not start.
pub async fn try_start(app: RustStream) -> ruststream::Result<RunningApp> {
    bounded("app start", WAIT, App::start(app)).await
}

/// Starts `app` within [`WAIT`], failing the test if it does not start.
pub async fn start(app: RustStream) -> RunningApp {
    try_start(app).await.expect("the app starts")
}

/// Shuts `app` down within [`WAIT`], failing the test if that fails.
pub async fn stop(app: RunningApp) {
    bounded("app shutdown", WAIT, app.shutdown())
        .await
        .expect("the app shuts down");
}
