//! [`RedisBroker`]: configuration, connections, and the [`Broker`] implementation.
//!
//! One fred [`Pool`] carries settles and publishes (multiplexed, auto-pipelined); every
//! subscription gets a [`Client`] of its own for its blocking reads, so a `BRPOP` never stalls
//! the shared connections, and every Pub/Sub subscription a `SubscriberClient` of its own (see
//! [`pubsub`](crate::pubsub)). All reconnect with capped exponential backoff.
//! Commands sent here: `XGROUP CREATE .. MKSTREAM` (stream sources), `SCRIPT LOAD`, and
//! `SUBSCRIBE` to the delayed sets' wake-up channels.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::config::{Blocking, ReconnectPolicy};
use ruststream_core::{
    Broker, BrokerSource, ChannelDoc, Error as CoreError, OutMessage, Publisher, Result,
    SubscribeOptions,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::{RedisError, redact};
use crate::list;
use crate::publish::RedisPublisher;
use crate::pubsub::RedisChannel;
use crate::reader::RedisReceiver;
use crate::{RedisList, RedisStream, scripts};

/// A subscription source on Redis: a list, a stream or a Pub/Sub channel.
#[derive(Debug, Clone, PartialEq)]
pub enum RedisSource {
    /// A work queue on a list.
    List(RedisList),
    /// A stream with a consumer group.
    Stream(RedisStream),
    /// A Pub/Sub channel or pattern (at most once).
    Channel(RedisChannel),
}

impl BrokerSource for RedisSource {
    fn key(&self) -> &str {
        match self {
            Self::List(l) => l.key(),
            Self::Stream(s) => s.key(),
            Self::Channel(c) => c.key(),
        }
    }
    fn options(&self) -> &SubscribeOptions {
        match self {
            Self::List(l) => l.options(),
            Self::Stream(s) => s.options(),
            Self::Channel(c) => c.options(),
        }
    }
    fn describe(&self) -> ChannelDoc {
        match self {
            Self::List(l) => l.describe(),
            Self::Stream(s) => s.describe(),
            Self::Channel(c) => c.describe(),
        }
    }

    fn no_redelivery(&self) -> Option<&'static str> {
        match self {
            Self::Channel(c) => c.no_redelivery(),
            Self::List(_) | Self::Stream(_) => None,
        }
    }
}

/// How a message is published to a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishPolicy {
    /// `LPUSH` onto a list, optionally re-arming its expiry.
    List(list::Publish),
    /// `XADD` onto a stream.
    Stream,
    /// `PUBLISH` on a Pub/Sub channel (nothing is stored).
    PubSub,
}

impl PublishPolicy {
    /// The transport this policy publishes on, as the AsyncAPI document names it.
    pub fn transport(&self) -> &'static str {
        match self {
            Self::List(_) => "list",
            Self::Stream => "stream",
            Self::PubSub => "pubsub",
        }
    }
}

impl From<crate::stream::Publish> for PublishPolicy {
    fn from(_: crate::stream::Publish) -> Self {
        Self::Stream
    }
}

impl From<crate::pubsub::Publish> for PublishPolicy {
    fn from(_: crate::pubsub::Publish) -> Self {
        Self::PubSub
    }
}

impl From<list::Publish> for PublishPolicy {
    fn from(p: list::Publish) -> Self {
        Self::List(p)
    }
}

/// The Redis broker.
///
/// ```no_run
/// use ruststream_redis::RedisBroker;
/// let broker = RedisBroker::standalone("redis://127.0.0.1:6379").prefix("images:");
/// let from_env = RedisBroker::from_env(); // REDIS_URL, default redis://127.0.0.1:6379
/// ```
#[derive(Clone)]
#[must_use]
pub struct RedisBroker {
    pub(crate) inner: Arc<Inner>,
}

/// Where the servers are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One server (or a primary with replicas the client does not use).
    Standalone,
    /// A Redis Cluster, reached through any of these nodes.
    Cluster(Vec<String>),
    /// A primary found through these sentinels under `service`.
    Sentinel {
        service: String,
        sentinels: Vec<String>,
    },
}

pub(crate) struct Inner {
    /// The standalone URL, or the first node's (credentials, TLS and database come from it).
    pub(crate) url: String,
    pub(crate) topology: Topology,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// PEM file of the CAs to trust for TLS (see `crate::tls`); setting it turns TLS on.
    pub(crate) tls_ca: Option<std::path::PathBuf>,
    pub(crate) prefix: String,
    pub(crate) pool_size: usize,
    pub(crate) scheduling: bool,
    pub(crate) pool: RwLock<Option<Pool>>,
    /// Held while the pool connects, so concurrent first uses connect once.
    pub(crate) connecting: tokio::sync::Mutex<()>,
    /// Wakes readers when a publish schedules a new earliest delayed entry: delayed set name
    /// (the `PUBLISH` channel) to the readers' notifier.
    pub(crate) wakes: Mutex<HashMap<String, Arc<Notify>>>,
    pub(crate) subscriber: tokio::sync::OnceCell<SubscriberClient>,
    /// The in-memory server commands go to instead of Redis, in tests (see `crate::memory`).
    pub(crate) memory: crate::memory::MemorySlot,
    /// Default publish policy per destination (unprefixed), learnt from the subscriptions.
    pub(crate) routes: RwLock<HashMap<String, PublishPolicy>>,
}

impl fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBroker")
            .field("target", &self.inner.target())
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisBroker {
    /// A broker on one Redis server: `redis://[user:password@]host:port[/db]`.
    pub fn standalone(url: impl Into<String>) -> Self {
        Self {
            inner: Arc::new(Inner {
                url: url.into(),
                topology: Topology::Standalone,
                username: None,
                password: None,
                tls_ca: None,
                prefix: String::new(),
                pool_size: 2,
                scheduling: true,
                pool: RwLock::new(None),
                connecting: tokio::sync::Mutex::new(()),
                wakes: Mutex::new(HashMap::new()),
                subscriber: tokio::sync::OnceCell::new(),
                memory: crate::memory::MemorySlot::default(),
                routes: RwLock::new(HashMap::new()),
            }),
        }
    }

    /// A standalone broker on `REDIS_URL`, or `redis://127.0.0.1:6379` when it is not set.
    pub fn from_env() -> Self {
        Self::standalone(
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned()),
        )
    }

    fn with(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => f(inner),
            None => {
                let old = &self.inner;
                let mut inner = Inner {
                    url: old.url.clone(),
                    topology: old.topology.clone(),
                    username: old.username.clone(),
                    password: old.password.clone(),
                    tls_ca: old.tls_ca.clone(),
                    prefix: old.prefix.clone(),
                    pool_size: old.pool_size,
                    scheduling: old.scheduling,
                    pool: RwLock::new(None),
                    connecting: tokio::sync::Mutex::new(()),
                    wakes: Mutex::new(HashMap::new()),
                    subscriber: tokio::sync::OnceCell::new(),
                    memory: crate::memory::MemorySlot::default(),
                    routes: RwLock::new(old.routes.read().map(|r| r.clone()).unwrap_or_default()),
                };
                f(&mut inner);
                self.inner = Arc::new(inner);
            }
        }
        self
    }

    /// A broker on a Redis Cluster, reached through any of `nodes` (`redis://host:port` each; the
    /// first one's credentials and TLS apply to all).
    pub fn cluster<I, S>(nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let nodes: Vec<String> = nodes.into_iter().map(Into::into).collect();
        let first = nodes.first().cloned().unwrap_or_default();
        Self::standalone(first).with(|i| i.topology = Topology::Cluster(nodes))
    }

    /// A broker on the primary that the sentinels at `sentinels` (`host:port` or
    /// `redis://host:port`) name for `service`; it follows failovers.
    pub fn sentinel<I, S>(service: impl Into<String>, sentinels: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let sentinels: Vec<String> = sentinels.into_iter().map(Into::into).collect();
        let service = service.into();
        Self::standalone("redis://127.0.0.1:6379")
            .with(|i| i.topology = Topology::Sentinel { service, sentinels })
    }

    /// How this broker's publisher sends to `destination` when no subscription of the app reads
    /// it: `.route("uploads", stream::Publish::new())` makes a producer-only process `XADD` to
    /// the `uploads` stream (the default for an unknown key is a list `LPUSH`).
    pub fn route(self, destination: impl Into<String>, policy: impl Into<PublishPolicy>) -> Self {
        let (destination, policy) = (destination.into(), policy.into());
        if let Ok(mut routes) = self.inner.routes.write() {
            routes.insert(destination, policy);
        }
        self
    }

    /// The ACL user name (overrides the URL's).
    pub fn username(self, user: impl Into<String>) -> Self {
        let user = user.into();
        self.with(|i| i.username = Some(user))
    }

    /// The password (overrides the URL's). It never appears in logs or errors.
    pub fn password(self, password: impl Into<String>) -> Self {
        let password = password.into();
        self.with(|i| i.password = Some(password))
    }

    /// Connects with TLS, trusting only the CA certificates in this PEM file (for a server whose
    /// certificate a private CA signed). Without it, a `rediss://` URL trusts the system's roots.
    pub fn tls_ca_file(self, path: impl Into<std::path::PathBuf>) -> Self {
        let path = path.into();
        self.with(|i| i.tls_ca = Some(path))
    }

    /// A prefix put before every key this broker touches (the seed's `dataSetPrefix`).
    pub fn prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.with(|i| i.prefix = prefix)
    }

    /// Connections in the shared pool for settles and publishes (default 2).
    pub fn pool_size(self, n: usize) -> Self {
        self.with(|i| i.pool_size = n.max(1))
    }

    /// Whether this broker's subscriptions move due delayed entries (default on). Off makes the
    /// node a pure handler; some other node must schedule (the seed's `enableScheduling`).
    pub fn scheduling(self, on: bool) -> Self {
        self.with(|i| i.scheduling = on)
    }

    pub(crate) fn scheduling_on(&self) -> bool {
        self.inner.scheduling
    }

    /// The notifier a reader of `delayed_set` waits on; subscribes to its channel on first use.
    pub(crate) async fn wake_for(&self, delayed_set: &str) -> Result<Arc<Notify>> {
        let notify = {
            let mut wakes = self.inner.wakes.lock().map_err(poisoned)?;
            if let Some(n) = wakes.get(delayed_set) {
                return Ok(n.clone());
            }
            let n = Arc::new(Notify::new());
            wakes.insert(delayed_set.to_owned(), n.clone());
            n
        };
        if self.inner.memory.forward_wakes(delayed_set, &notify) {
            return Ok(notify);
        }
        let subscriber = self
            .inner
            .subscriber
            .get_or_try_init(|| async {
                let client = self
                    .inner
                    .builder(false)?
                    .build_subscriber_client()
                    .map_err(|e| self.inner.connect_error(&e))?;
                client
                    .init()
                    .await
                    .map_err(|e| self.inner.connect_error(&e))?;
                let _resubscribe = client.manage_subscriptions();
                let mut messages = client.message_rx();
                let inner = Arc::downgrade(&self.inner);
                tokio::spawn(async move {
                    loop {
                        let message = match messages.recv().await {
                            Ok(m) => m,
                            // A missed wake-up only delays a reader until its next poll.
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                        };
                        let Some(inner) = inner.upgrade() else { break };
                        let Ok(wakes) = inner.wakes.lock() else { break };
                        if let Some(n) = wakes.get(&*message.channel) {
                            n.notify_one();
                        }
                    }
                });
                Ok::<_, CoreError>(client)
            })
            .await?;
        subscriber
            .subscribe(delayed_set)
            .await
            .map_err(crate::error::core)?;
        Ok(notify)
    }

    /// The prefixed key.
    pub(crate) fn key(&self, key: &str) -> String {
        self.inner.key(key)
    }

    pub(crate) fn pool(&self) -> Result<Pool> {
        self.inner.pool()
    }

    /// A publisher whose destinations use their subscriptions' transports (list by default).
    pub fn publisher(&self) -> Publisher {
        Publisher::new(Arc::new(RedisPublisher {
            inner: self.inner.clone(),
        }))
    }

    /// Connects the shared pool, if not yet connected. Publishing from outside an app needs it.
    pub async fn connect(&self) -> Result<()> {
        let _one_at_a_time = self.inner.connecting.lock().await;
        if self.inner.pool.read().map_err(poisoned)?.is_some() {
            return Ok(());
        }
        let pool = self
            .inner
            .builder(false)?
            .build_pool(self.inner.pool_size)
            .map_err(|e| self.inner.connect_error(&e))?;
        pool.init()
            .await
            .map_err(|e| self.inner.connect_error(&e))?;
        for c in pool.clients() {
            watch(c, "shared", self.inner.target());
        }
        let client = pool.next();
        for script in [
            &*scripts::CLAIM,
            &*scripts::SETTLE_LIST,
            &*scripts::MOVE_DUE,
            &*scripts::SCHEDULE,
            &*scripts::PUSH_TTL,
            &*scripts::SETTLE_STREAM,
        ] {
            script.load(client).await.map_err(RedisError::from)?;
        }
        *self.inner.pool.write().map_err(poisoned)? = Some(pool);
        Ok(())
    }

    /// A client of its own for one subscription's blocking reads.
    pub(crate) async fn reader_client(&self) -> Result<Client> {
        let client = self
            .inner
            .builder(true)?
            .build()
            .map_err(|e| self.inner.connect_error(&e))?;
        client
            .init()
            .await
            .map_err(|e| self.inner.connect_error(&e))?;
        watch(&client, "reader", self.inner.target());
        Ok(client)
    }

    /// A connected subscriber client of its own for one Pub/Sub subscription, whose broadcast
    /// channel holds `buffer` messages (fred's `broadcast_channel_capacity`).
    pub(crate) async fn subscriber_client(&self, buffer: usize) -> Result<SubscriberClient> {
        let client = self
            .inner
            .builder(false)?
            .with_performance_config(|c| c.broadcast_channel_capacity = buffer.max(1))
            .build_subscriber_client()
            .map_err(|e| self.inner.connect_error(&e))?;
        client
            .init()
            .await
            .map_err(|e| self.inner.connect_error(&e))?;
        watch(&client, "pubsub", self.inner.target());
        Ok(client)
    }
}

/// Logs a connection's losses and reconnections (fred reconnects on its own, with backoff;
/// meanwhile commands wait), so an outage shows in the app's logs.
fn watch(client: &impl EventInterface, role: &'static str, target: String) {
    let lost_at = target.clone();
    let _lost = client.on_error(move |(e, _)| {
        tracing::warn!(connection = role, target = %lost_at, error = %redact(e.details()),
            "redis connection lost; reconnecting with backoff");
        async { Ok(()) }
    });
    let _back = client.on_reconnect(move |_| {
        tracing::info!(connection = role, target = %target, "redis connection back");
        async { Ok(()) }
    });
}

pub(crate) fn poisoned<T>(_: T) -> CoreError {
    CoreError::Broker("internal lock poisoned by a panic".into())
}

impl Inner {
    pub(crate) fn key(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}{key}", self.prefix)
        }
    }

    pub(crate) fn pool(&self) -> Result<Pool> {
        self.pool
            .read()
            .map_err(poisoned)?
            .clone()
            .ok_or(CoreError::NotConnected)
    }

    fn connect_error(&self, e: &fred::error::Error) -> CoreError {
        let hint = match e.kind() {
            fred::error::ErrorKind::Auth => {
                "check the user name and password (RedisBroker::username/password or the URL)"
            }
            // rustls reports a certificate it rejects as an I/O error.
            _ if *e.kind() == fred::error::ErrorKind::Tls
                || e.details().contains("Certificate") =>
            {
                "check the TLS setup: a rediss:// URL to a TLS port, and the CA that signed the server's certificate (RedisBroker::tls_ca_file)"
            }
            fred::error::ErrorKind::Config | fred::error::ErrorKind::Url => {
                "the URL must look like redis://[user:password@]host:port[/db]"
            }
            _ => "is Redis running there? set REDIS_URL or the broker's URL",
        };
        CoreError::Broker(format!(
            "cannot connect to {}: {}; {hint}",
            self.target(),
            redact(e.details())
        ))
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.topology, Topology::Cluster(_))
    }

    /// The delayed set and payload hash of the (prefixed) destination `key`, in its slot.
    pub(crate) fn delayed_keys(&self, key: &str) -> (String, String) {
        let cluster = self.is_cluster();
        (
            list::derived(key, ".delayed", cluster),
            list::derived(key, ".delayed.payloads", cluster),
        )
    }

    /// The (prefixed) dead-letter list of a source: its explicit name, or the default
    /// `K.dead` derived in the queue's slot; `None` without one.
    pub(crate) fn dead_key(&self, source: &RedisSource) -> Option<String> {
        let (key, dead) = match source {
            RedisSource::List(l) => (&l.key, &l.dead_letter),
            RedisSource::Stream(s) => (&s.key, &s.dead_letter),
            RedisSource::Channel(c) => (&c.name, &c.dead_letter),
        };
        self.dead_key_of(key, dead.as_ref())
    }

    /// The (prefixed) dead-letter list of the source `key` whose setting is `dead` (`None`: the
    /// default name; `Some(None)`: none).
    pub(crate) fn dead_key_of(&self, key: &str, dead: Option<&Option<String>>) -> Option<String> {
        match dead {
            None => Some(list::derived(&self.key(key), ".dead", self.is_cluster())),
            Some(named) => named.as_deref().map(|k| self.key(k)),
        }
    }

    /// Where this broker connects, with passwords removed.
    fn target(&self) -> String {
        match &self.topology {
            Topology::Standalone => redact(&self.url),
            Topology::Cluster(nodes) => format!("cluster {}", redact(&nodes.join(","))),
            Topology::Sentinel { service, sentinels } => {
                format!("`{service}` via sentinels {}", redact(&sentinels.join(",")))
            }
        }
    }

    fn builder(&self, blocking: bool) -> Result<Builder> {
        let mut config = Config::from_url(&self.url).map_err(|e| self.connect_error(&e))?;
        match &self.topology {
            Topology::Standalone => {}
            Topology::Cluster(nodes) => {
                let mut hosts = Vec::new();
                for node in nodes {
                    let c = Config::from_url(node).map_err(|e| self.connect_error(&e))?;
                    hosts.extend(
                        c.server
                            .hosts()
                            .into_iter()
                            .map(|s| (s.host.to_string(), s.port)),
                    );
                }
                config.server = ServerConfig::new_clustered(hosts);
            }
            Topology::Sentinel { service, sentinels } => {
                let mut hosts = Vec::new();
                for s in sentinels {
                    let url = if s.contains("://") {
                        s.clone()
                    } else {
                        format!("redis://{s}")
                    };
                    let c = Config::from_url(&url).map_err(|e| self.connect_error(&e))?;
                    hosts.extend(
                        c.server
                            .hosts()
                            .into_iter()
                            .map(|s| (s.host.to_string(), s.port)),
                    );
                }
                config.server = ServerConfig::new_sentinel(hosts, service.clone());
            }
        }
        if self.username.is_some() {
            config.username.clone_from(&self.username);
        }
        if self.password.is_some() {
            config.password.clone_from(&self.password);
        }
        if let Some(ca) = &self.tls_ca {
            config.tls = Some(crate::tls::with_ca_file(ca)?);
        }
        if blocking {
            // A command sent while a read blocks interrupts it with CLIENT UNBLOCK: that is
            // how a stop wakes a reader at once.
            config.blocking = Blocking::Interrupt;
        }
        self.memory.configure(&mut config);
        let mut builder = Builder::from_config(config);
        builder
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 5_000, 2))
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_secs(5);
                c.max_command_attempts = 3;
            });
        Ok(builder)
    }
}

impl Broker for RedisBroker {
    type Source = RedisSource;
    type Policy = PublishPolicy;
    type Receiver = RedisReceiver;

    fn validate(&self, sources: &[&RedisSource]) -> Result<()> {
        for s in sources {
            crate::validate::source(s)?;
            if matches!(self.inner.topology, Topology::Cluster(_)) {
                let keys = crate::validate::keys_used_together(s, &self.inner.prefix);
                crate::validate::same_slot(s.key(), &keys)?;
            }
        }
        Ok(())
    }

    async fn connect(&self, sources: &[&RedisSource]) -> Result<()> {
        {
            let mut routes = self.inner.routes.write().map_err(poisoned)?;
            for s in sources {
                match s {
                    RedisSource::Stream(st) => {
                        routes
                            .entry(st.key.clone())
                            .or_insert(PublishPolicy::Stream);
                    }
                    RedisSource::Channel(c) if !c.pattern => {
                        routes
                            .entry(c.name.clone())
                            .or_insert(PublishPolicy::PubSub);
                    }
                    _ => {}
                }
            }
        }
        RedisBroker::connect(self).await?;
        let pool = self.pool()?;
        for s in sources {
            if let RedisSource::Stream(st) = s {
                crate::reader::create_group(&pool, &self.key(&st.key), st.group_name()).await?;
            }
        }
        Ok(())
    }

    async fn receiver(
        &self,
        source: &RedisSource,
        stop: CancellationToken,
    ) -> Result<RedisReceiver> {
        RedisReceiver::open(self, source, stop).await
    }

    fn publisher(&self) -> Publisher {
        RedisBroker::publisher(self)
    }

    /// The reply's own policy, else the destination's [`route`](RedisBroker::route).
    fn reply_transport(
        &self,
        destination: Option<&str>,
        policy: Option<&PublishPolicy>,
    ) -> Option<&'static str> {
        if let Some(policy) = policy {
            return Some(policy.transport());
        }
        let routes = self.inner.routes.read().ok()?;
        routes.get(destination?).map(PublishPolicy::transport)
    }

    async fn publish_with(&self, policy: &PublishPolicy, messages: Vec<OutMessage>) -> Result<()> {
        crate::publish::publish(&self.inner, messages, Some(*policy)).await
    }

    async fn close(&self) {
        let pool = self.inner.pool.write().ok().and_then(|mut p| p.take());
        if let Some(pool) = pool {
            let _ = pool.quit().await;
        }
        if let Some(subscriber) = self.inner.subscriber.get() {
            let _ = subscriber.quit().await;
        }
    }
}
