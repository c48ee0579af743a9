//! [`Env`]: what a test gets on one topology.

use std::sync::Arc;
use std::time::Duration;

use fred::bytes::Bytes;
use fred::prelude::*;
use ruststream::redis::frame::Frame;
use ruststream::testing::MemoryRedis;
use ruststream::{AppInfo, Mount, RedisBroker, RunningApp, RustStream};

use super::{WAIT, cluster_urls, redis_url, stand, unique, wait_until};

/// Where a test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// The in-memory Redis model, standalone, on the paused (virtual) clock.
    Memory,
    /// The in-memory Redis model in cluster mode (slot checks), on the paused clock.
    MemoryCluster,
    /// The stand's standalone server.
    Standalone,
    /// The stand's cluster.
    Cluster,
}

/// The server behind an [`Env`].
#[derive(Clone)]
enum Server {
    Model(MemoryRedis),
    Standalone(String),
    Cluster(Vec<String>),
}

/// One test on one topology: a key prefix of the test's own, a broker with that prefix, and a
/// raw fred client on the same server (or model) to inspect keys with.
pub struct Env {
    /// Where the test runs.
    pub topology: Topology,
    /// The prefix of every key of this test (`rstest-...:`).
    pub prefix: String,
    /// A raw client on the server (clustered on a cluster) or on the model.
    pub client: Client,
    broker: RedisBroker,
    server: Server,
}

impl Env {
    /// Sets the test up on `topology`, with a prefix named after `tag`; `None` when the
    /// topology's stand variable is not set (the test is skipped, see `stand_var`).
    pub async fn open(topology: Topology, tag: &str) -> Option<Self> {
        let server = match topology {
            Topology::Memory => Server::Model(MemoryRedis::new()),
            Topology::MemoryCluster => Server::Model(MemoryRedis::cluster()),
            Topology::Standalone => Server::Standalone(redis_url()?),
            Topology::Cluster => Server::Cluster(cluster_urls()?),
        };
        let client = match &server {
            Server::Model(model) => {
                let client = model.client().expect("a client on the model");
                super::bounded("client init", WAIT, client.init())
                    .await
                    .expect("the model's client starts");
                client
            }
            Server::Standalone(url) => {
                stand::connect(Config::from_url(url).expect("a valid RUSTSTREAM_REDIS_URL")).await
            }
            Server::Cluster(urls) => stand::connect(stand::cluster_config(urls)).await,
        };
        let prefix = format!("{}:", unique(tag));
        Some(Self {
            topology,
            broker: new_broker(&server, &prefix, |b| b),
            prefix,
            client,
            server,
        })
    }

    /// Whether the test runs on the in-memory model (virtual time).
    pub fn is_memory(&self) -> bool {
        matches!(self.server, Server::Model(_))
    }

    /// Whether the topology is a cluster (the model's or the stand's).
    pub fn is_cluster(&self) -> bool {
        matches!(self.topology, Topology::Cluster | Topology::MemoryCluster)
    }

    /// The standalone server's URL; `None` on the other topologies.
    pub fn url(&self) -> Option<&str> {
        match &self.server {
            Server::Standalone(url) => Some(url),
            _ => None,
        }
    }

    /// The test's broker (clones share its connections and, on the model, its server).
    pub fn broker(&self) -> RedisBroker {
        self.broker.clone()
    }

    /// A broker of its own (own connections) on the same server or model, with the test's
    /// prefix and then whatever `configure` sets (another prefix, `scheduling(false)`, ...).
    /// On the model, the server is attached after `configure`, since a builder call on a shared
    /// broker makes a new one without it.
    pub fn broker_with(&self, configure: impl FnOnce(RedisBroker) -> RedisBroker) -> RedisBroker {
        new_broker(&self.server, &self.prefix, configure)
    }

    /// A fred configuration for another raw client on the server (e.g. a subscriber client).
    /// Not on the model, whose clients come from [`Env::client`].
    pub fn config(&self) -> Config {
        match &self.server {
            Server::Standalone(url) => Config::from_url(url).expect("a valid URL"),
            Server::Cluster(urls) => stand::cluster_config(urls),
            Server::Model(_) => panic!("the model has no address: use env.client"),
        }
    }

    /// One client per node (standalone: the server; on the model: the model), for what a
    /// cluster answers per node (`PUBSUB NUMSUB`, `KEYS`).
    pub async fn node_clients(&self) -> Vec<Client> {
        match &self.server {
            Server::Model(_) => vec![self.client.clone()],
            Server::Standalone(url) => vec![stand::node_client(url).await],
            Server::Cluster(urls) => {
                let mut clients = Vec::new();
                for url in urls {
                    clients.push(stand::node_client(url).await);
                }
                clients
            }
        }
    }

    /// The full name of `key`.
    pub fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    // -- Time -------------------------------------------------------------------------------

    /// Lets `d` pass: virtual on the model (the paused clock jumps), real on a server.
    pub async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// Waits until `check` holds, polling; fails the test after [`WAIT`] (virtual on the model).
    pub async fn eventually(&self, what: &str, check: impl AsyncFnMut() -> bool) {
        wait_until(what, WAIT, check).await;
    }

    // -- Apps -------------------------------------------------------------------------------

    /// An app named after the test on the test's broker, mounted by `mount`; a 1 s shutdown
    /// timeout, so that a hung handler does not hold the test.
    pub fn app(&self, mount: impl FnOnce(&mut Mount<RedisBroker>)) -> RustStream {
        RustStream::new(AppInfo::new("harness", "0.0.0"))
            .shutdown_timeout(Duration::from_secs(1))
            .with_broker(self.broker(), mount)
    }

    /// Starts `app` within [`WAIT`], failing the test if it does not start.
    pub async fn start(&self, app: RustStream) -> RunningApp {
        super::start(app).await
    }

    /// Starts [`Env::app`] with `mount`.
    pub async fn start_with(&self, mount: impl FnOnce(&mut Mount<RedisBroker>)) -> RunningApp {
        self.start(self.app(mount)).await
    }

    /// Starts `app` within [`WAIT`]; its error if it does not start.
    pub async fn try_start(&self, app: RustStream) -> ruststream::Result<RunningApp> {
        super::try_start(app).await
    }

    /// The configuration error `app` is refused with at startup; fails the test if it starts
    /// or is refused with another error.
    pub async fn refusal(&self, app: RustStream) -> ruststream::ConfigError {
        match self.try_start(app).await {
            Ok(_) => panic!("the app started; it should have been refused"),
            Err(e) => super::config_error(&e).clone(),
        }
    }

    /// Shuts `app` down within [`WAIT`].
    pub async fn stop(&self, app: RunningApp) {
        super::stop(app).await;
    }

    // -- Raw commands on the test's keys (names without the prefix) --------------------------

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

    /// A raw `XADD key * payload <payload> [field value ...]`, as a producer in another
    /// language would write an entry.
    pub async fn xadd_raw(&self, key: &str, payload: &str, fields: &[(&str, &str)]) {
        let mut args = vec![
            self.key(key),
            "*".to_owned(),
            "payload".to_owned(),
            payload.to_owned(),
        ];
        for (field, value) in fields {
            args.extend([(*field).to_owned(), (*value).to_owned()]);
        }
        let _: Bytes = self
            .client
            .custom(fred::cmd!("XADD"), args)
            .await
            .expect("XADD");
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

    /// Entries pending in a stream's consumer group (`XPENDING key group`'s count).
    pub async fn pending(&self, key: &str, group: &str) -> i64 {
        let summary: Vec<Value> = self
            .client
            .custom(
                fred::cmd!("XPENDING"),
                vec![self.key(key), group.to_owned()],
            )
            .await
            .expect("XPENDING");
        summary
            .first()
            .and_then(Value::as_i64)
            .expect("XPENDING starts with a count")
    }

    /// Any command, arguments as given (full key names). On the cluster it goes to the node of
    /// its first string argument's slot (fred's default), which fred follows when redirected.
    pub async fn cmd(
        &self,
        name: &'static str,
        args: Vec<Value>,
    ) -> Result<Value, fred::error::Error> {
        self.client.custom(fred::cmd!(name), args).await
    }

    /// Every key under the prefix, without the prefix, sorted; without the subscriptions'
    /// history (`K.history.*`, written when a subscription stops, and expiring on its own).
    pub async fn keys(&self) -> Vec<String> {
        self.keys_matching(&format!("{}*", self.prefix))
            .await
            .into_iter()
            .filter(|k| !is_history(k))
            .map(|k| k[self.prefix.len()..].to_owned())
            .collect()
    }

    /// Every key matching a glob pattern (full names), sorted; on the stand's cluster, of every
    /// node (`KEYS` on a clustered client goes to the node of the pattern's slot only).
    pub async fn keys_matching(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        if matches!(self.server, Server::Cluster(_)) {
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

    /// Deletes every key matching `pattern` (full names), one at a time (a cluster refuses a
    /// `DEL` across slots).
    pub async fn delete_matching(&self, pattern: &str) {
        for key in self.keys_matching(pattern).await {
            let _: i64 = self.client.del(key).await.expect("DEL");
        }
    }

    /// Deletes the test's keys (on a server; the model goes with the test) and disconnects.
    pub async fn cleanup(self) {
        if !self.is_memory() {
            self.delete_matching(&format!("{}*", self.prefix)).await;
        }
        let _ = self.client.quit().await;
    }
}

/// A broker on `server` with `prefix`, then `configure`d; on the model, attached to it last.
fn new_broker(
    server: &Server,
    prefix: &str,
    configure: impl FnOnce(RedisBroker) -> RedisBroker,
) -> RedisBroker {
    let base = match server {
        Server::Model(model) if model.is_cluster() => {
            RedisBroker::cluster(["redis://memory.invalid:7000"])
        }
        Server::Model(_) => RedisBroker::standalone("redis://memory.invalid:6379"),
        Server::Standalone(url) => RedisBroker::standalone(url.clone()),
        Server::Cluster(urls) => RedisBroker::cluster(urls.clone()),
    };
    let broker = configure(base.prefix(prefix));
    if let Server::Model(model) = server {
        broker
            .attach_memory(Arc::new(model.clone()))
            .expect("attach the model");
    }
    broker
}

/// Whether `key` is a subscription's history (`K.history.m:<hour>`, `K.history.h:<day>`).
pub fn is_history(key: &str) -> bool {
    key.contains(".history.m:") || key.contains(".history.h:")
}
