//! Shared helpers of the real-Redis behaviour tests.
//!
//! Every test gets a key prefix of its own ([`Redis::connect`]), so tests run in parallel on one
//! server; keys are inspected with raw commands on a fred client of the test's own. Conditions
//! are awaited with [`wait_until`] (bounded polling), never with sleeps.

#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::bytes::Bytes;
use fred::prelude::*;
use ruststream::{RedisBroker, RunningApp};
use ruststream_redis::frame::Frame;

/// How often [`wait_until`] checks its condition.
const POLL: Duration = Duration::from_millis(5);

/// The server under test: `RUSTSTREAM_REDIS_URL`, or `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("RUSTSTREAM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// The server under test with database `db` selected (drops any path or query of the URL).
pub fn redis_url_with_db(db: u8) -> String {
    let url = redis_url();
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

/// Waits until `check` holds, polling every few milliseconds; panics with `what` after `timeout`.
pub async fn wait_until(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let polled = tokio::time::timeout(timeout, async {
        while !check().await {
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    assert!(
        polled.is_ok(),
        "timed out after {timeout:?} waiting for: {what}"
    );
}

/// Awaits `fut`, panicking with `what` if it takes longer than `timeout`.
pub async fn bounded<T>(what: &str, timeout: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(timeout, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {timeout:?}: {what}"),
    }
}

/// Starts an app, failing the test if it does not start within 10 s.
pub async fn start(app: ruststream::RustStream) -> RunningApp {
    bounded(
        "app start",
        Duration::from_secs(10),
        ruststream::App::start(app),
    )
    .await
    .expect("the app starts")
}

/// Shuts an app down, failing the test if that takes longer than 10 s.
pub async fn stop(app: RunningApp) {
    bounded("app shutdown", Duration::from_secs(10), app.shutdown())
        .await
        .expect("the app shuts down");
}

/// A raw client on the test server (or cluster) and the test's key prefix.
pub struct Redis {
    /// The raw fred client (clustered on a cluster).
    pub client: Client,
    /// The prefix of every key of this test (`rstest-...:`).
    pub prefix: String,
    /// The cluster's node URLs when `client` is clustered; `None`: the standalone server.
    pub cluster: Option<Vec<String>>,
}

impl Redis {
    /// Connects, with a fresh prefix named after `tag`.
    pub async fn connect(tag: &str) -> Self {
        Self::with_prefix(format!("{}:", unique(tag))).await
    }

    /// Connects, with a given prefix (`""` for absolute key names).
    pub async fn with_prefix(prefix: String) -> Self {
        Self::with_url(&redis_url(), prefix).await
    }

    /// Connects to `url`, with a given prefix.
    pub async fn with_url(url: &str, prefix: String) -> Self {
        let config = Config::from_url(url).expect("a valid RUSTSTREAM_REDIS_URL");
        let client = Builder::from_config(config).build().expect("a fred client");
        bounded(
            "connecting to Redis",
            Duration::from_secs(10),
            client.init(),
        )
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
        Self::with_client(client, prefix, None)
    }

    /// Wraps a connected client (e.g. a topology's), with a given prefix; `cluster` holds the
    /// node URLs when the client is clustered, so that [`Redis::broker`] goes there too.
    pub fn with_client(client: Client, prefix: String, cluster: Option<Vec<String>>) -> Self {
        Self {
            client,
            prefix,
            cluster,
        }
    }

    /// A broker on the test server (or cluster) with the test's prefix.
    pub fn broker(&self) -> RedisBroker {
        let broker = match &self.cluster {
            Some(nodes) => RedisBroker::cluster(nodes.clone()),
            None => RedisBroker::standalone(redis_url()),
        };
        broker.prefix(self.prefix.clone())
    }

    /// The absolute name of `key`.
    pub fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// `LLEN`.
    pub async fn llen(&self, key: &str) -> i64 {
        self.client.llen(self.key(key)).await.expect("LLEN")
    }

    /// `LRANGE key 0 -1`, head (newest) first.
    pub async fn lrange(&self, key: &str) -> Vec<Bytes> {
        self.client
            .lrange(self.key(key), 0, -1)
            .await
            .expect("LRANGE")
    }

    /// The entries of a list decoded as frames, head (newest) first.
    pub async fn frames(&self, key: &str) -> Vec<Frame> {
        self.lrange(key)
            .await
            .into_iter()
            .map(Frame::decode)
            .collect()
    }

    /// A raw `LPUSH key value`, as `redis-cli` would.
    pub async fn lpush_raw(&self, key: &str, value: &str) {
        let _: i64 = self
            .client
            .lpush(self.key(key), value)
            .await
            .expect("LPUSH");
    }

    /// `EXISTS`.
    pub async fn exists(&self, key: &str) -> bool {
        let n: i64 = self.client.exists(self.key(key)).await.expect("EXISTS");
        n == 1
    }

    /// `PTTL` in ms (`-1` no expiry, `-2` no key).
    pub async fn pttl(&self, key: &str) -> i64 {
        self.client.pttl(self.key(key)).await.expect("PTTL")
    }

    /// `ZCARD`.
    pub async fn zcard(&self, key: &str) -> i64 {
        self.client.zcard(self.key(key)).await.expect("ZCARD")
    }

    /// `HLEN`.
    pub async fn hlen(&self, key: &str) -> i64 {
        self.client.hlen(self.key(key)).await.expect("HLEN")
    }

    /// Every key under the prefix, without the prefix, sorted.
    pub async fn keys(&self) -> Vec<String> {
        self.keys_matching(&format!("{}*", self.prefix))
            .await
            .into_iter()
            .map(|k| k[self.prefix.len()..].to_owned())
            .collect()
    }

    /// Every key matching a glob pattern (absolute names), sorted; on a cluster, of every
    /// primary (`KEYS` of a clustered client would go to the node of the pattern's slot only).
    pub async fn keys_matching(&self, pattern: &str) -> Vec<String> {
        let mut keys = Vec::new();
        if self.client.is_clustered() {
            for node in self.client.active_connections() {
                let some: Vec<String> = self
                    .client
                    .with_cluster_node(node)
                    .custom(fred::cmd!("KEYS"), vec![pattern])
                    .await
                    .expect("KEYS");
                keys.extend(some);
            }
        } else {
            keys = self
                .client
                .custom(fred::cmd!("KEYS"), vec![pattern])
                .await
                .expect("KEYS");
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// Deletes every key matching `pattern` (absolute names), one at a time (a cluster refuses
    /// a `DEL` across slots).
    pub async fn delete_matching(&self, pattern: &str) {
        for key in self.keys_matching(pattern).await {
            let _: i64 = self.client.del(key).await.expect("DEL");
        }
    }

    /// Deletes the test's keys and disconnects.
    pub async fn cleanup(self) {
        if !self.prefix.is_empty() {
            self.delete_matching(&format!("{}*", self.prefix)).await;
        }
        let _ = self.client.quit().await;
    }
}
