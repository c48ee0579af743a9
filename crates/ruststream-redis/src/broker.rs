//! [`RedisBroker`]: configuration, connections, and the [`Broker`] implementation.
//!
//! One fred [`Pool`] carries settles and publishes (multiplexed, auto-pipelined); every
//! subscription gets a [`Client`] of its own for its blocking reads, so a `BRPOP` never stalls
//! the shared connections. Both reconnect with capped exponential backoff.
//! Commands sent here: `XGROUP CREATE .. MKSTREAM` (stream sources), `SCRIPT LOAD`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::{Blocking, ReconnectPolicy};
use ruststream_core::{
    Broker, BrokerSource, ChannelDoc, Error as CoreError, OutMessage, Publisher, Result,
    SubscribeOptions,
};
use tokio_util::sync::CancellationToken;

use crate::error::{RedisError, redact};
use crate::list;
use crate::publish::RedisPublisher;
use crate::reader::RedisReceiver;
use crate::{RedisList, RedisStream, scripts};

/// A subscription source on Redis: a list or a stream.
#[derive(Debug, Clone, PartialEq)]
pub enum RedisSource {
    /// A work queue on a list.
    List(RedisList),
    /// A stream with a consumer group.
    Stream(RedisStream),
}

impl BrokerSource for RedisSource {
    fn key(&self) -> &str {
        match self {
            Self::List(l) => l.key(),
            Self::Stream(s) => s.key(),
        }
    }
    fn options(&self) -> &SubscribeOptions {
        match self {
            Self::List(l) => l.options(),
            Self::Stream(s) => s.options(),
        }
    }
    fn describe(&self) -> ChannelDoc {
        match self {
            Self::List(l) => l.describe(),
            Self::Stream(s) => s.describe(),
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
    pub(crate) prefix: String,
    pub(crate) pool_size: usize,
    pub(crate) pool: RwLock<Option<Pool>>,
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
                prefix: String::new(),
                pool_size: 2,
                pool: RwLock::new(None),
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
                    prefix: old.prefix.clone(),
                    pool_size: old.pool_size,
                    pool: RwLock::new(None),
                    routes: RwLock::new(HashMap::new()),
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

    /// A prefix put before every key this broker touches (the seed's `dataSetPrefix`).
    pub fn prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.with(|i| i.prefix = prefix)
    }

    /// Connections in the shared pool for settles and publishes (default 2).
    pub fn pool_size(self, n: usize) -> Self {
        self.with(|i| i.pool_size = n.max(1))
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
        Ok(client)
    }
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
        if blocking {
            // A command sent while a read blocks interrupts it with CLIENT UNBLOCK: that is
            // how a stop wakes a reader at once.
            config.blocking = Blocking::Interrupt;
        }
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
                if let RedisSource::Stream(st) = s {
                    routes.insert(st.key.clone(), PublishPolicy::Stream);
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

    async fn publish_with(&self, policy: &PublishPolicy, messages: Vec<OutMessage>) -> Result<()> {
        crate::publish::publish(&self.inner, messages, Some(*policy)).await
    }

    async fn close(&self) {
        let pool = self.inner.pool.write().ok().and_then(|mut p| p.take());
        if let Some(pool) = pool {
            let _ = pool.quit().await;
        }
    }
}
