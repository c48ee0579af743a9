//! [`RedisBroker`]: its configuration, and the core's [`Broker`] contract carried out by handing
//! each subscription to its transport. Sends no command itself (see `conn` and the transports).

use std::fmt;
use std::sync::Arc;

use ruststream_core::{Broker, BrokerSource, ConfigError, OutMessage, Publisher, Result, Source};
use tokio_util::sync::CancellationToken;

use crate::conn::{Connections, Settings, Topology};
use crate::policy::PublishPolicy;
use crate::publisher::RedisPublisher;
use crate::transport::{RedisReceiver, RedisSource};
use crate::{RedisChannel, RedisList, RedisStream};

/// `From<$ty> for RedisSource` and `Source for $ty`: what makes a transport's source usable in
/// `subscriber(source, handler)` and `#[subscriber(source)]`. Here, so that the transports need
/// not know the broker.
macro_rules! source_of {
    ($($ty:ty),*) => {$(
        impl From<$ty> for RedisSource {
            fn from(source: $ty) -> Self {
                Self::new(source)
            }
        }

        impl Source for $ty {
            type Broker = RedisBroker;
            fn into_source(self) -> RedisSource {
                self.into()
            }
        }
    )*};
}

source_of!(RedisList, RedisStream, RedisChannel);

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
    conns: Arc<Connections>,
}

impl fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBroker")
            .field("target", &self.conns.target())
            .field("prefix", &self.conns.keys.prefix())
            .finish_non_exhaustive()
    }
}

impl RedisBroker {
    /// A broker on one Redis server: `redis://[user:password@]host:port[/db]`.
    pub fn standalone(url: impl Into<String>) -> Self {
        Self {
            conns: Arc::new(Connections::new(
                Settings::standalone(url.into()),
                crate::flow::repair_boxed,
            )),
        }
    }

    /// A standalone broker on `REDIS_URL`, or `redis://127.0.0.1:6379` when it is not set.
    pub fn from_env() -> Self {
        Self::standalone(
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned()),
        )
    }

    /// The same broker with its settings changed by `f`; a broker shared with clones gets
    /// connections of its own.
    fn with(self, f: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = self.conns.settings.clone();
        f(&mut settings);
        let mut conns = Connections::new(settings, crate::flow::repair_boxed);
        conns.routes = Arc::new(self.conns.routes.copy());
        Self {
            conns: Arc::new(conns),
        }
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
        Self::standalone(first).with(|s| s.topology = Topology::Cluster(nodes))
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
            .with(|s| s.topology = Topology::Sentinel { service, sentinels })
    }

    /// How this broker's publisher sends to `destination`: `.route("uploads",
    /// stream::Publish::new())` makes a producer-only process `XADD` to the `uploads` stream (the
    /// default for a key no subscription of the app reads is a list `LPUSH`). A route wins over
    /// the default of a subscription reading the key, so `.route("events",
    /// stream::Publish::new().maxlen(10_000))` bounds the stream `events` for this app's
    /// publishes and for its subscription's retries, due delayed entries and requeued dead
    /// letters. A route's policy is checked at startup (`validate`).
    pub fn route(self, destination: impl Into<String>, policy: impl Into<PublishPolicy>) -> Self {
        self.conns.routes.set(destination.into(), policy.into());
        self
    }

    /// The ACL user name (overrides the URL's).
    pub fn username(self, user: impl Into<String>) -> Self {
        let user = user.into();
        self.with(|s| s.username = Some(user))
    }

    /// The password (overrides the URL's). It never appears in logs or errors.
    pub fn password(self, password: impl Into<String>) -> Self {
        let password = password.into();
        self.with(|s| s.password = Some(password))
    }

    /// Connects with TLS, trusting only the CA certificates in this PEM file (for a server whose
    /// certificate a private CA signed). Without it, a `rediss://` URL trusts the system's roots.
    pub fn tls_ca_file(self, path: impl Into<std::path::PathBuf>) -> Self {
        let path = path.into();
        self.with(|s| s.tls_ca = Some(path))
    }

    /// A prefix put before every key this broker touches.
    pub fn prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.with(|s| s.prefix = prefix)
    }

    /// Connections in the shared pool for settles and publishes (default 2).
    pub fn pool_size(self, n: usize) -> Self {
        self.with(|s| s.pool_size = n.max(1))
    }

    /// Whether this broker's subscriptions move due delayed entries (default on). Off makes the
    /// node a pure handler; some other node must schedule.
    pub fn scheduling(self, on: bool) -> Self {
        self.with(|s| s.scheduling = on)
    }

    /// How often an idle reader of this broker's subscriptions looks for due delayed entries
    /// when no wake-up came (default 5 s; a subscription's own `.schedule_interval(..)` wins).
    /// Readers are woken when an entry is scheduled, so this bounds only the lateness of an
    /// entry whose wake-up `PUBLISH` was lost: shorter means less lateness then and more idle
    /// calls to Redis (one `move_due.lua` per interval per reader). Zero is refused at startup.
    pub fn schedule_interval(self, interval: std::time::Duration) -> Self {
        self.with(|s| s.schedule.interval = interval)
    }

    /// Most due delayed entries one mover call moves (default 128, 1 to 1,000; a subscription's
    /// own `.move_batch(..)` wins). Larger means fewer round trips when many are due at once,
    /// and longer scripts, during which Redis serves no other client. Out of range is refused
    /// at startup.
    pub fn move_batch(self, n: u32) -> Self {
        self.with(|s| s.schedule.batch = n)
    }

    /// How long a job's progress and result (`Context::progress`, `Context::set_result`, a
    /// dead letter of a message published with `await_result`) live after their last write:
    /// the record's `PEXPIRE`. Default [`DEFAULT_RESULT_TTL`](crate::DEFAULT_RESULT_TTL), 1 h;
    /// it is the handling process's broker that writes, so set it there. Zero is refused at
    /// startup.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use ruststream_redis::RedisBroker;
    /// let broker = RedisBroker::from_env().result_ttl(Duration::from_secs(600));
    /// ```
    pub fn result_ttl(self, ttl: std::time::Duration) -> Self {
        self.with(|s| s.result_ttl = ttl)
    }

    /// How long a flow may be publishing before the readers of its parent's queue publish the
    /// children it left unsent themselves (default [`DEFAULT_FLOW_REPAIR_GRACE`](crate::DEFAULT_FLOW_REPAIR_GRACE),
    /// 30 s): a publisher that stops halfway through a flow leaves it to them. Keep it well
    /// above the time a flow's publish takes, or a slow publish is repaired while it runs and
    /// some children are pushed twice. The readers look for such flows with their delayed
    /// entries (see [`schedule_interval`](Self::schedule_interval)), so a repair comes that
    /// much after the grace at most; a broker with scheduling off repairs nothing. Zero is
    /// refused at startup.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ruststream_redis::RedisBroker;
    /// let broker = RedisBroker::from_env().flow_repair_grace(Duration::from_secs(60));
    /// ```
    pub fn flow_repair_grace(self, grace: std::time::Duration) -> Self {
        self.with(|s| s.flow_grace = grace)
    }

    /// How long a command may go without a reply (default 10 s): past it the command fails (a
    /// settle or publish is then retried; a read replaces its connection and reads again) and
    /// its connection is closed and reconnected, so a connection that stopped answering (a
    /// half-open TCP connection, a server that froze) cannot stall a subscription for ever. A
    /// blocking read may take its wait (`.block(..)`) on top. Zero is refused at startup.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ruststream_redis::RedisBroker;
    /// let broker = RedisBroker::from_env().command_timeout(Duration::from_secs(5));
    /// ```
    pub fn command_timeout(self, timeout: std::time::Duration) -> Self {
        self.with(|s| s.command_timeout = timeout)
    }

    /// Whether each subscription keeps its history in Redis for the dashboard's charts (default
    /// on): its counts and handler times, added once a minute by every worker with one script
    /// call, kept 24 h by the minute and 30 days by the hour (the `history` module's keys).
    /// Off, nothing is written and nothing runs.
    pub fn keep_history(self, on: bool) -> Self {
        self.with(|s| {
            s.history = on.then_some(s.history.unwrap_or(crate::history::DEFAULT_HISTORY_EVERY));
        })
    }

    /// How often each subscription adds its counts to its history (default a minute; at least
    /// 100 ms). Shorter shows a burst sooner, at one script call per interval per
    /// subscription per worker.
    pub fn history_interval(self, every: std::time::Duration) -> Self {
        self.with(|s| s.history = s.history.map(|_| every))
    }

    /// A publisher whose destinations use their subscriptions' transports (list by default).
    pub fn publisher(&self) -> Publisher {
        Publisher::new(Arc::new(RedisPublisher {
            conns: self.conns.clone(),
            routes: self.conns.routes.clone(),
        }))
    }

    /// Publishes `flow` as a publisher that stops halfway would: its record, then only its first
    /// `children` message children, unmarked; the readers of its parent's queue repair the
    /// rest after the grace ([`flow_repair_grace`](Self::flow_repair_grace)). For tests.
    ///
    /// # Errors
    /// As a flow's publish.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub async fn publish_flow_halfway(
        &self,
        flow: ruststream_core::flow::OutFlow,
        children: usize,
    ) -> Result<()> {
        self.conns.connect().await?;
        crate::flow::publish_halfway(&self.conns, &self.conns.routes, flow, children).await
    }

    /// Connects the shared pool, if not yet connected. Publishing from outside an app needs it.
    /// Warns of server settings that can lose its keys (see the README's *Redis settings*).
    pub async fn connect(&self) -> Result<()> {
        self.conns.connect().await?;
        crate::setup::at_connect(&self.conns).await;
        Ok(())
    }

    /// Whether this broker talks to a Redis Cluster (then every key one command or script
    /// touches must hash to one slot).
    pub fn is_cluster(&self) -> bool {
        self.conns.keys.is_cluster()
    }

    /// The prefix put before every key (`""` when none).
    pub fn key_prefix(&self) -> &str {
        self.conns.keys.prefix()
    }

    /// The operator's view of `sources` on this broker (inspect, dead letters, delayed entries,
    /// pause): the `ruststream` CLI's `inspect`, `dead`, `delayed`, `pause` and `resume`.
    pub fn operator(&self, sources: &[RedisSource]) -> crate::operate::Operator {
        crate::operate::Operator::new(self.conns.clone(), sources)
    }

    /// The full name of the delayed set that holds delayed publishes to `key` (prefixed, and on
    /// a cluster derived into `key`'s slot).
    pub fn delayed_set_key(&self, key: &str) -> String {
        let keys = &self.conns.keys;
        keys.delayed(&keys.key(key)).set
    }

    /// The full names of the priority levels above 0 of the list `key`, as its route says
    /// (`list::Publish::priorities`, or a subscription's `RedisList::priorities`); none
    /// without levels.
    pub fn level_keys(&self, key: &str) -> Vec<String> {
        let keys = &self.conns.keys;
        let n = match self.conns.routes.get(key) {
            Some(crate::policy::PublishPolicy::List(p)) => p.layout.priorities.unwrap_or(0),
            _ => 0,
        };
        let full = keys.key(key);
        (1..n).map(|i| keys.level(&full, i)).collect()
    }
}

#[cfg(feature = "testing")]
impl RedisBroker {
    /// Sends every command of this broker (and of its clones) to `server` instead of Redis: no
    /// connection is made. For test harnesses (`ruststream::testing::TestApp` does it for you).
    ///
    /// Call it before the broker connects; it fails once the broker is connected or when a
    /// server is already attached.
    pub fn attach_memory(
        &self,
        server: Arc<dyn crate::memory::MemoryServer>,
    ) -> ruststream_core::Result<()> {
        if self.conns.is_connected() {
            return Err(ruststream_core::Error::broker(
                ruststream_core::ErrorKind::Other,
                "attach_memory: the broker is connected already; attach before the app starts",
            ));
        }
        self.conns.memory.attach(server)
    }

    /// Whether an in-memory server is attached.
    pub fn is_in_memory(&self) -> bool {
        self.conns.memory.is_attached()
    }
}

impl Broker for RedisBroker {
    type Source = RedisSource;
    type Policy = PublishPolicy;
    type Receiver = RedisReceiver;

    fn validate(&self, sources: &[&RedisSource]) -> Result<()> {
        self.conns.settings.check_urls()?;
        self.conns.routes.check()?;
        let schedule = self.conns.settings.schedule;
        crate::options::validate_schedule(None, Some(schedule.interval), Some(schedule.batch))?;
        crate::results::validate_ttl(self.conns.settings.result_ttl)?;
        if self.conns.settings.flow_grace.is_zero() {
            return Err(ConfigError::new(
                "RedisBroker::flow_repair_grace",
                "zero would repair every flow being published at once, its children pushed twice",
                "give it well above a flow's publish time (default 30 s)",
            )
            .into());
        }
        if self.conns.settings.command_timeout.is_zero() {
            return Err(ConfigError::new(
                "RedisBroker::command_timeout",
                "zero would fail a command before Redis could answer",
                "give it at least a few seconds (default 10 s)",
            )
            .into());
        }
        if self
            .conns
            .settings
            .history
            .is_some_and(|every| every < std::time::Duration::from_millis(100))
        {
            return Err(ConfigError::new(
                "RedisBroker::history_interval",
                "under 100 ms would send a script call per subscription that often",
                "give it seconds (default a minute), or keep_history(false)",
            )
            .into());
        }
        for s in sources {
            s.transport().validate(&self.conns.keys)?;
        }
        Ok(())
    }

    async fn connect(&self, sources: &[&RedisSource]) -> Result<()> {
        self.conns.connect().await?;
        self.prepare(sources).await?;
        crate::setup::at_connect(&self.conns).await;
        Ok(())
    }

    /// Each source's server side (`XGROUP CREATE .. MKSTREAM` for a stream group), then its
    /// route (the transport the publisher uses for its key), learned only once that succeeded.
    async fn prepare(&self, sources: &[&RedisSource]) -> Result<()> {
        for s in sources {
            crate::partition::prepare(s.transport(), &self.conns).await?;
        }
        let redis = self.conns.target();
        for s in sources {
            let t = s.transport();
            if let Some(policy) = t.route() {
                self.conns.routes.learn(s.key(), policy);
            }
            for keys in crate::partition::queues(t, &self.conns.keys) {
                tracing::info!(subscription = t.key(), transport = keys.transport,
                    mode = %keys.mode_in_words(), keys = %keys.key_list(),
                    concurrency = keys.concurrency, %redis, "subscription ready");
            }
        }
        Ok(())
    }

    async fn receiver(
        &self,
        source: &RedisSource,
        stop: CancellationToken,
    ) -> Result<RedisReceiver> {
        crate::partition::open(source.transport(), &self.conns, stop).await
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
        self.conns
            .routes
            .get(destination?)
            .as_ref()
            .map(PublishPolicy::transport)
    }

    async fn publish_with(&self, policy: &PublishPolicy, messages: Vec<OutMessage>) -> Result<()> {
        crate::publish::publish(&self.conns, &self.conns.routes, messages, Some(*policy))
            .await
            .map(drop)
    }

    /// Periodic jobs' state in this broker's Redis (see the `periodic` module), on the
    /// broker's clock.
    fn periodic_store(&self) -> Option<Arc<dyn ruststream_core::periodic::PeriodicStore>> {
        Some(Arc::new(crate::periodic::Store::new(self.conns.clone())))
    }

    /// The subscription's history in this broker's Redis (`crate::history`), unless turned off
    /// ([`keep_history`](RedisBroker::keep_history)) or on the in-memory model.
    fn history(
        &self,
        source: &RedisSource,
    ) -> Option<Arc<dyn ruststream_core::history::HistorySink>> {
        let every = self.conns.settings.history?;
        if self.conns.memory.is_attached() {
            return None;
        }
        let t = source.transport();
        let queues = crate::partition::queues(t, &self.conns.keys);
        Some(Arc::new(crate::history::Sink::new(
            self.conns.clone(),
            t.key(),
            &queues,
            every,
        )))
    }

    async fn close(&self) {
        self.conns.close().await;
    }

    /// Whether every connection of the shared pool is up.
    fn ready(&self) -> std::result::Result<(), String> {
        self.conns.ready()
    }
}
