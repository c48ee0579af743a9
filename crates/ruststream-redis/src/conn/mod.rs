//! Connections: building fred clients for standalone, cluster and sentinel targets (credentials,
//! TLS, reconnect policy), the shared pool, each subscription's own reading connection, and the
//! Pub/Sub connection that wakes readers.
//!
//! One fred [`Pool`] carries settles and publishes (multiplexed, auto-pipelined); every
//! subscription reads on a [`Client`] of its own ([`ReadConn`]), so a blocking read never stalls
//! the shared connections; every Pub/Sub subscription gets a `SubscriberClient` of its own. All
//! reconnect with capped exponential backoff, and their losses and returns are logged.
//!
//! Commands sent here: `SUBSCRIBE` to wake-up channels ([`Connections::notifier`]) and to
//! signal channels ([`Connections::signals`]); on a
//! [`ReadConn`], `PING` to interrupt a blocking read (fred then sends `CLIENT UNBLOCK`).
//!
//! With the `testing` feature a broker may run on an in-memory server (see
//! [`memory`](crate::memory)); this module is where that seam sits: client configurations point
//! at it, and [`ReadConn::blocking`] awaits it before a blocking read.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Connections`]: the pool's lifecycle, building clients, the connection log |
//! | `settings.rs` | [`Settings`], [`Topology`]: what a broker connects to, checked before it does |
//! | `read.rs` | [`ReadConn`]: a subscription's reading connection, its bounds and its replacement |
//! | `wakes.rs` | the fan-out of wake-up messages to the readers' notifiers |
//! | `wire.rs` | a connection outside fred: Pub/Sub subscriptions and native reads |

mod read;
mod settings;
mod wakes;
pub(crate) mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::config::{Blocking, ReconnectPolicy};
use ruststream_core::{Error as CoreError, ErrorKind, Result};
use tokio::sync::Notify;

pub(crate) use self::read::ReadConn;
pub(crate) use self::settings::{Settings, Topology};
use crate::error::{core, redact};
use crate::keys::KeySpace;
use crate::memory::{BlockingRead, MemorySlot};
use crate::policy::Routes;

/// A broker's connections, built from its [`Settings`].
pub(crate) struct Connections {
    pub(crate) settings: Settings,
    /// Names every key; built from the settings' prefix and topology.
    pub(crate) keys: KeySpace,
    pool: RwLock<Option<Pool>>,
    /// Held while the pool connects, so concurrent first uses connect once.
    connecting: tokio::sync::Mutex<()>,
    /// Wake-up channel name → the notifier of its readers.
    wakes: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    /// Signal channel name → the sender of its messages to their listeners.
    signals: Mutex<HashMap<String, tokio::sync::broadcast::Sender<bytes::Bytes>>>,
    subscriber: tokio::sync::OnceCell<SubscriberClient>,
    /// Pause key → whether it is set, shared by every reader of that key in this process.
    pub(crate) pauses: crate::pause::Pauses,
    /// The in-memory server commands go to instead of Redis, in tests.
    pub(crate) memory: MemorySlot,
    /// Each destination's publish policy: publishes, and the scripts that re-add to a stream,
    /// follow it.
    pub(crate) routes: Arc<Routes>,
    /// Whether the server takes `WAITAOF`, found out on the first durable publish
    /// (`crate::durable`).
    pub(crate) waitaof: tokio::sync::OnceCell<bool>,
    /// How a delayed set's mover repairs a flow whose publish stopped halfway
    /// (`crate::flow::repair`). The broker hands it in, so that the mover does not depend on
    /// flows, nor flows (which publish onto lists and streams) on the mover's readers.
    pub(crate) repair_flow: RepairFlow,
}

/// A repair of the flow whose record is `record`, in the publishing set `publishing`: the
/// outcome's label for `ruststream_flow_repairs_total`.
pub(crate) type RepairFlow = for<'a> fn(
    &'a Connections,
    &'a str,
    &'a str,
) -> futures::future::BoxFuture<'a, Result<&'static str>>;

impl Connections {
    pub(crate) fn new(settings: Settings, repair_flow: RepairFlow) -> Self {
        let cluster = matches!(settings.topology, Topology::Cluster(_));
        Self {
            keys: KeySpace::new(settings.prefix.clone(), cluster),
            settings,
            pool: RwLock::new(None),
            connecting: tokio::sync::Mutex::new(()),
            wakes: Arc::default(),
            signals: Mutex::default(),
            subscriber: tokio::sync::OnceCell::new(),
            pauses: crate::pause::Pauses::default(),
            memory: MemorySlot::default(),
            routes: Arc::default(),
            waitaof: tokio::sync::OnceCell::new(),
            repair_flow,
        }
    }

    /// The shared pool; [`CoreError::NotConnected`] before [`connect`](Self::connect).
    pub(crate) fn pool(&self) -> Result<Pool> {
        self.pool
            .read()
            .map_err(poisoned)?
            .clone()
            .ok_or(CoreError::NotConnected)
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.pool.read().is_ok_and(|p| p.is_some())
    }

    /// Connects the shared pool, if not yet connected, and refuses a server older than
    /// RustStream needs (`crate::version`).
    pub(crate) async fn connect(&self) -> Result<()> {
        let _one_at_a_time = self.connecting.lock().await;
        if self.is_connected() {
            return Ok(());
        }
        let pool = self
            .builder(false)?
            .build_pool(self.settings.pool_size)
            .map_err(|e| self.connect_error(&e))?;
        pool.init().await.map_err(|e| self.connect_error(&e))?;
        if let Err(e) = crate::version::check(pool.next(), &self.target()).await {
            let _ = pool.quit().await;
            return Err(e);
        }
        for c in pool.clients() {
            watch(c, "shared", self.target());
        }
        *self.pool.write().map_err(poisoned)? = Some(pool);
        Ok(())
    }

    /// Closes the pool and the wake-up connection.
    pub(crate) async fn close(&self) {
        let pool = self.pool.write().ok().and_then(|mut p| p.take());
        if let Some(pool) = pool {
            let _ = pool.quit().await;
        }
        if let Some(subscriber) = self.subscriber.get() {
            let _ = subscriber.quit().await;
        }
    }

    /// A connection of its own for one subscription's blocking reads of `read`, which wait up
    /// to `block`.
    pub(crate) async fn reader(&self, read: BlockingRead, block: Duration) -> Result<ReadConn> {
        let mut builder = self.builder(true)?;
        // A backstop for the commands that do not block: `ReadConn::blocking` bounds the reads
        // that do (at their wait plus the command timeout, before this fires).
        let backstop = block + 2 * self.settings.command_timeout;
        builder.with_performance_config(|p| p.default_command_timeout = backstop);
        ReadConn::open(
            builder,
            self.target(),
            self.settings.command_timeout,
            self.memory.waiter(read),
        )
        .await
        .map_err(|e| self.connect_error(&e))
    }

    /// A connected subscriber client whose broadcast channel holds `buffer` messages (fred's
    /// `broadcast_channel_capacity`): the wake-up connection's.
    pub(crate) async fn subscriber(&self, buffer: usize) -> Result<SubscriberClient> {
        let client = self
            .builder(false)?
            .with_performance_config(|c| c.broadcast_channel_capacity = buffer.max(1))
            .build_subscriber_client()
            .map_err(|e| self.connect_error(&e))?;
        client.init().await.map_err(|e| self.connect_error(&e))?;
        watch(&client, "pubsub", self.target());
        Ok(client)
    }

    /// A notifier woken by every `PUBLISH` on `channel` (full name); subscribes on first use.
    /// All callers for one channel share one notifier.
    pub(crate) async fn notifier(&self, channel: &str) -> Result<Arc<Notify>> {
        let notify = {
            let mut wakes = self.wakes.lock().map_err(poisoned)?;
            if let Some(n) = wakes.get(channel) {
                return Ok(n.clone());
            }
            let n = Arc::new(Notify::new());
            wakes.insert(channel.to_owned(), n.clone());
            n
        };
        if self.memory.forward_wakes(channel, &notify) {
            return Ok(notify);
        }
        self.wake_subscriber()
            .await?
            .subscribe(channel)
            .await
            .map_err(core)?;
        Ok(notify)
    }

    /// The messages `PUBLISH`ed on `channel` (full name) from now on, for one listener;
    /// subscribes on first use, on the wake-up connection. A listener more than
    /// [`wakes::SIGNAL_BUFFER`] messages behind loses the oldest.
    pub(crate) async fn signals(
        &self,
        channel: &str,
    ) -> Result<tokio::sync::broadcast::Receiver<bytes::Bytes>> {
        let sender = {
            let mut signals = self.signals.lock().map_err(poisoned)?;
            if let Some(s) = signals.get(channel) {
                return Ok(s.subscribe());
            }
            let (sender, _) = tokio::sync::broadcast::channel(wakes::SIGNAL_BUFFER);
            signals.insert(channel.to_owned(), sender.clone());
            sender
        };
        let listener = sender.subscribe();
        if let Some(messages) = self.memory.messages(channel) {
            tokio::spawn(wakes::forward_memory_signals(messages, sender));
            return Ok(listener);
        }
        let subscriber = self.wake_subscriber().await?;
        tokio::spawn(wakes::forward_signals(
            subscriber.message_rx(),
            channel.to_owned(),
            sender,
        ));
        subscriber.subscribe(channel).await.map_err(core)?;
        Ok(listener)
    }

    /// The connection that subscribes to wake-up and signal channels, connected on first use.
    async fn wake_subscriber(&self) -> Result<&SubscriberClient> {
        self.subscriber
            .get_or_try_init(|| async {
                // fred's default capacity (32) at least: wake-ups are rare and a missed one only
                // delays a poll; a cancel's signal is rare too.
                let client = self.subscriber(wakes::SIGNAL_BUFFER).await?;
                let _resubscribe = client.manage_subscriptions();
                tokio::spawn(wakes::forward_wakes(
                    client.message_rx(),
                    Arc::downgrade(&self.wakes),
                ));
                Ok::<_, CoreError>(client)
            })
            .await
    }

    /// `Ok` when every connection of the shared pool is up; else what is down (no I/O).
    pub(crate) fn ready(&self) -> std::result::Result<(), String> {
        let down = match self.pool.read().ok().and_then(|p| p.clone()) {
            None => return Err(format!("redis {}: not connected", self.target())),
            Some(pool) => pool.clients().iter().filter(|c| !c.is_connected()).count(),
        };
        if down == 0 {
            Ok(())
        } else {
            Err(format!(
                "redis {}: {down} shared connection(s) down, reconnecting",
                self.target()
            ))
        }
    }

    /// Where this broker connects, with passwords removed.
    pub(crate) fn target(&self) -> String {
        let s = &self.settings;
        match &s.topology {
            Topology::Standalone => redact(&s.url),
            Topology::Cluster(nodes) => format!("cluster {}", redact(&nodes.join(","))),
            Topology::Sentinel { service, sentinels } => {
                format!("`{service}` via sentinels {}", redact(&sentinels.join(",")))
            }
        }
    }

    fn connect_error(&self, e: &fred::error::Error) -> CoreError {
        let kind = crate::error::kind_of(e);
        let hint = match kind {
            ErrorKind::Auth => {
                "check the user name and password (RedisBroker::username/password or the URL)"
            }
            ErrorKind::Tls => {
                "check the TLS setup: a rediss:// URL to a TLS port, and the CA that signed the server's certificate (RedisBroker::tls_ca_file)"
            }
            ErrorKind::Configuration => {
                "the URL must look like redis://[user:password@]host:port[/db]"
            }
            _ => "is Redis running there? set REDIS_URL or the broker's URL",
        };
        let message = format!(
            "cannot connect to {}: {}; {hint}",
            self.target(),
            crate::error::in_words(e)
        );
        crate::error::core_as(e.clone(), message)
    }

    /// The hosts of `urls` (`redis://host:port` or `host:port`).
    fn hosts(&self, urls: &[String]) -> Result<Vec<(String, u16)>> {
        let mut hosts = Vec::new();
        for url in urls {
            let url = if url.contains("://") {
                url.clone()
            } else {
                format!("redis://{url}")
            };
            let c = Config::from_url(&url).map_err(|e| self.connect_error(&e))?;
            hosts.extend(
                c.server
                    .hosts()
                    .into_iter()
                    .map(|s| (s.host.to_string(), s.port)),
            );
        }
        Ok(hosts)
    }

    /// fred's configuration of the broker's connections: the servers, credentials and TLS.
    pub(crate) fn client_config(&self) -> Result<Config> {
        let s = &self.settings;
        s.check_urls()?;
        let mut config = Config::from_url(&s.url).map_err(|e| self.connect_error(&e))?;
        match &s.topology {
            Topology::Standalone => {}
            Topology::Cluster(nodes) => {
                config.server = ServerConfig::new_clustered(self.hosts(nodes)?);
            }
            Topology::Sentinel { service, sentinels } => {
                config.server = ServerConfig::new_sentinel(self.hosts(sentinels)?, service.clone());
            }
        }
        if s.username.is_some() {
            config.username.clone_from(&s.username);
        }
        if s.password.is_some() {
            config.password.clone_from(&s.password);
        }
        if let Some(ca) = &s.tls_ca {
            config.tls = Some(crate::tls::with_ca_file(ca)?);
        }
        Ok(config)
    }

    fn builder(&self, blocking: bool) -> Result<Builder> {
        let s = &self.settings;
        let mut config = self.client_config()?;
        if blocking {
            // A command sent while a read blocks interrupts it with CLIENT UNBLOCK: that is
            // how a stop wakes a reader at once.
            config.blocking = Blocking::Interrupt;
        }
        self.memory.configure(&mut config);
        let mut builder = Builder::from_config(config);
        let timeout = s.command_timeout;
        builder
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 5_000, 2))
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_secs(5);
                c.max_command_attempts = 3;
                // A connection whose replies stopped coming (half-open, or a frozen server) is
                // closed and reconnected, and its commands sent again. fred skips a connection
                // blocked in a read: the reader bounds those itself (`ReadConn::blocking`).
                c.unresponsive.max_timeout = Some(timeout);
                c.unresponsive.interval = (timeout / 4).max(Duration::from_millis(100));
            });
        if !blocking {
            // A command that never gets a reply fails (settles and publishes are retried) rather
            // than waiting for ever. The reader's blocking reads wait longer than this on
            // purpose, so its commands are bounded by `ReadConn` instead.
            builder.with_performance_config(|p| p.default_command_timeout = timeout);
        }
        Ok(builder)
    }
}

/// Logs a connection's losses and reconnections (fred reconnects on its own, with backoff;
/// meanwhile commands wait), so an outage shows in the app's logs.
pub(super) fn watch(client: &impl EventInterface, role: &'static str, target: String) {
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

/// The error of a lock a panic poisoned.
pub(crate) fn poisoned<T>(_: T) -> CoreError {
    CoreError::broker(ErrorKind::Other, "internal lock poisoned by a panic")
}
