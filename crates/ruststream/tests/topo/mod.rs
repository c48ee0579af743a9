//! Topologies for the real-Redis tests: the stand's standalone server, cluster, sentinel set and
//! TLS server (scripts/stand exports where they are), raw inspection clients on each, and
//! dedicated sets that a test starts through the stand's own functions (for tests that kill
//! servers and must not disturb the shared ones).
//!
//! A behaviour test is written once as `async fn name(t: Topo)` and [`on_both!`] turns it into
//! `name::standalone` and `name::cluster`. A topology whose variable is not set (a plain
//! `cargo test` without scripts/test) is skipped with a message, except under CI, where that is a
//! failure.

#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use ruststream::RedisBroker;

/// Generates `name::standalone` and `name::cluster` tests from `async fn name(t: Topo)`; with a
/// leading `multi_thread:`, on tokio's multi-threaded runtime (4 workers).
#[allow(unused_macros)]
macro_rules! on_both {
    (multi_thread: $($name:ident),* $(,)?) => {
        crate::topo::on_both!(@on (flavor = "multi_thread", worker_threads = 4) $($name),*);
    };
    (@on $flavor:tt $($name:ident),*) => {$(
        mod $name {
            #[tokio::test $flavor]
            async fn standalone() {
                super::$name(crate::topo::Topo::Standalone).await;
            }
            #[tokio::test $flavor]
            async fn cluster() {
                if let Some(t) = crate::topo::Topo::cluster() {
                    super::$name(t).await;
                }
            }
        }
    )*};
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn standalone() {
                super::$name(crate::topo::Topo::Standalone).await;
            }
            #[tokio::test]
            async fn cluster() {
                if let Some(t) = crate::topo::Topo::cluster() {
                    super::$name(t).await;
                }
            }
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use on_both;

/// The standalone server: `RUSTSTREAM_REDIS_URL`, or `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("RUSTSTREAM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// The value of a stand variable; `None` (the test skips) when unset outside CI.
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

/// Where a behaviour test runs.
#[derive(Debug, Clone)]
pub enum Topo {
    /// The standalone server.
    Standalone,
    /// A cluster, through these node URLs.
    Cluster(Vec<String>),
}

impl Topo {
    /// The stand's cluster (`RUSTSTREAM_CLUSTER_URLS`), if set.
    pub fn cluster() -> Option<Self> {
        stand_var("RUSTSTREAM_CLUSTER_URLS")
            .map(|v| Self::Cluster(v.split(',').map(str::to_owned).collect()))
    }

    /// A broker on this topology (no prefix).
    pub fn broker(&self) -> RedisBroker {
        match self {
            Self::Standalone => RedisBroker::standalone(redis_url()),
            Self::Cluster(urls) => RedisBroker::cluster(urls.clone()),
        }
    }

    /// A raw fred client on this topology (clustered on a cluster).
    pub async fn client(&self) -> Client {
        match self {
            Self::Standalone => connect(Config::from_url(&redis_url()).expect("a valid URL")).await,
            Self::Cluster(urls) => cluster_client(urls).await,
        }
    }
}

/// A connected fred client for `config`, within 10 s.
pub async fn connect(config: Config) -> Client {
    let client = Builder::from_config(config).build().expect("a fred client");
    bounded(
        "connecting to Redis",
        Duration::from_secs(10),
        client.init(),
    )
    .await
    .expect("connected");
    client
}

/// A fred configuration for the cluster of these node URLs.
pub fn cluster_config(urls: &[String]) -> Config {
    let mut config = Config::from_url(&urls[0]).expect("a valid URL");
    let hosts = urls
        .iter()
        .map(|u| {
            let hp = u.rsplit('/').next().unwrap_or(u);
            let (h, p) = hp.rsplit_once(':').expect("host:port");
            (h.to_owned(), p.parse::<u16>().expect("a port"))
        })
        .collect::<Vec<_>>();
    config.server = ServerConfig::new_clustered(hosts);
    config
}

/// A clustered fred client on these node URLs.
pub async fn cluster_client(urls: &[String]) -> Client {
    connect(cluster_config(urls)).await
}

/// A client on one node of the stand (no cluster redirects): `host:port` or a URL.
pub async fn node_client(addr: &str) -> Client {
    let url = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("redis://{addr}")
    };
    connect(Config::from_url(&url).expect("a valid URL")).await
}

/// A name no other test (in this process or another) uses.
pub fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!(
        "{tag}-{}-{ms}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Waits until `check` holds, polling every 10 ms; panics with `what` after `limit`.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let ok = tokio::time::timeout(limit, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(ok.is_ok(), "timed out after {limit:?} waiting until {what}");
}

/// Awaits `fut`, panicking with `what` if it takes longer than `limit`.
pub async fn bounded<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Servers of the test's own, started by `scripts/stand` functions in a bash process that stops
/// them (its EXIT trap) when this guard drops: stdin closes, the shell's `read` ends.
pub struct Stand {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The `RUSTSTREAM_*` variables the functions exported.
    pub vars: HashMap<String, String>,
}

impl Stand {
    /// Runs `calls` (e.g. `stand_cluster --cluster-node-timeout 1000`) after sourcing
    /// scripts/stand; returns once they have finished (the servers are ready).
    pub fn start(calls: &str) -> Self {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/stand");
        let body = format!(
            ". \"$1\"; {calls}; env | grep '^RUSTSTREAM_'; echo STAND-READY; read -r _ || true"
        );
        let mut child = Command::new("bash")
            // `$0` is not the script, so sourcing it only defines the functions.
            .args(["-c", &body, "stand-helper", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("bash runs scripts/stand");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let mut vars = HashMap::new();
        let mut ready = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line == "STAND-READY" {
                ready = true;
                break;
            }
            if let Some((k, v)) = line.split_once('=') {
                vars.insert(k.to_owned(), v.to_owned());
            }
        }
        let mut stand = Self { child, stdin, vars };
        assert!(
            ready,
            "scripts/stand failed to run `{calls}` (its errors are above)"
        );
        stand.vars.retain(|k, _| k.starts_with("RUSTSTREAM_"));
        stand
    }

    /// An exported variable.
    pub fn var(&self, name: &str) -> String {
        self.vars
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("scripts/stand did not export {name}"))
    }
}

impl Drop for Stand {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SIGKILL would skip the trap that stops the servers: ask with SIGTERM first.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// The pid of the redis-server at `addr` (`INFO server`'s `process_id`).
pub async fn server_pid(client: &Client) -> u32 {
    let info: String = client
        .custom(fred::cmd!("INFO"), vec!["server"])
        .await
        .expect("INFO server");
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("process_id in INFO server")
}

/// Sends SIGKILL to `pid`.
pub fn kill9(pid: u32) {
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -KILL {pid} failed");
}

/// A key prefix no other test run uses: [`unique`] and a colon.
pub fn prefix(tag: &str) -> String {
    format!("{}:", unique(tag))
}
