//! [`TestApp`]: starts an app with every `RedisBroker` on an in-memory [`MemoryRedis`], restarts
//! it on the same models, includes and stops subscriptions, and shuts it down.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::SystemTime;

use ruststream_core::{
    App, ConfigError, Error, ErrorKind, IntoSubscriber, Result, RunningApp, RustStream,
};
use ruststream_redis::RedisBroker;

use crate::MemoryRedis;
use crate::record::{self, Recorder};

/// An app running with no server: every `RedisBroker` sends its commands to an in-memory
/// [`MemoryRedis`] (the broker code above the connection is the production code), handler calls
/// are recorded, and under `#[tokio::test(start_paused = true)]` time is virtual.
///
/// ```no_run
/// # use ruststream_testing::TestApp;
/// # use ruststream_core::{App, HandlerOutcome};
/// # use ruststream_redis::RedisBroker;
/// # #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
/// # struct Warmup { page: String }
/// # ruststream_core::outgoing!(Warmup, "cache.warmups");
/// # async fn demo(app: impl App) -> ruststream_core::Result<()> {
/// let tb = TestApp::start(app).await?;
/// let warmup = Warmup { page: "/".into() };
/// tb.broker::<RedisBroker>().message(&warmup).publish().await?;
/// tb.broker::<RedisBroker>()
///     .subscriber("cache.warmups")
///     .assert_called_once()
///     .with(&warmup)
///     .settled(HandlerOutcome::ack());
/// tb.advance(std::time::Duration::from_secs(120)).await?;
/// tb.shutdown().await?;
/// # Ok(()) }
/// ```
///
/// **The clock.** Under `start_paused`, tokio's clock stands still while anything can run and
/// jumps to the next timer when everything waits; [`advance`](Self::advance) lets it run forward
/// by a given duration, every timer on the way firing in order (the readers' block timeouts,
/// retry delays, recovery sweeps), so an hour of retries takes milliseconds. The model's `TIME`,
/// key expiry, claim scores and due times read the same clock. Without `start_paused` the clock
/// is real and `advance` really waits.
///
/// **Settling.** [`publish`](crate::TestPublish::publish), [`advance`](Self::advance) and
/// [`start`](Self::start) return once the app has settled: nothing left to do without time
/// passing (no command sent to the model and no handler called for a few dozen scheduler
/// rounds). This needs tokio's current-thread runtime, which `#[tokio::test]` uses.
pub struct TestApp {
    pub(super) running: Option<RunningApp>,
    pub(super) brokers: Vec<(RedisBroker, MemoryRedis)>,
    /// The first of `brokers` (`start` refuses an app without a `RedisBroker`).
    pub(super) first: (RedisBroker, MemoryRedis),
    pub(super) recorder: Arc<Recorder>,
    pub(super) reported: AtomicUsize,
}

impl fmt::Debug for TestApp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestApp")
            .field("brokers", &self.brokers.len())
            .finish_non_exhaustive()
    }
}

impl TestApp {
    /// Starts `app` with every `RedisBroker` swapped for an in-memory model (a cluster model for a
    /// broker built with `RedisBroker::cluster`), keeping its key prefix, and waits until it
    /// settles.
    ///
    /// # Errors
    /// When the app has no `RedisBroker`, a broker was connected already, or the app does not
    /// start (a configuration error, as it would be in production).
    pub async fn start(app: impl App) -> Result<Self> {
        let mut app: RustStream = app.into_rust_stream();
        let mut brokers: Vec<(RedisBroker, MemoryRedis)> = Vec::new();
        for b in app.brokers() {
            let Some(redis) = b.downcast_ref::<RedisBroker>() else {
                continue;
            };
            if redis.is_in_memory() {
                // The same broker mounted twice (a clone): it already has its model.
                if let Some((_, m)) = brokers
                    .iter()
                    .find(|(other, _)| other.key_prefix() == redis.key_prefix())
                {
                    let m = m.clone();
                    brokers.push((redis.clone(), m));
                    continue;
                }
                return Err(Error::broker(
                    ErrorKind::Other,
                    "TestApp: a broker of this app already runs on an in-memory server; give TestApp a fresh app",
                ));
            }
            let model = if redis.is_cluster() {
                MemoryRedis::cluster()
            } else {
                MemoryRedis::new()
            };
            redis.attach_memory(Arc::new(model.clone()))?;
            brokers.push((redis.clone(), model));
        }
        let Some(first) = brokers.first() else {
            return Err(ConfigError::new(
                "TestApp",
                "the app has no RedisBroker to run in memory",
                "mount a RedisBroker with `with_broker`",
            )
            .into());
        };
        let first = first.clone();
        let recorder = Arc::new(Recorder::default());
        app = app.observe(record::observer(&recorder));
        let running = app.start().await?;
        let tb = Self {
            running: Some(running),
            brokers,
            first,
            recorder,
            reported: AtomicUsize::new(0),
        };
        tb.settle().await?;
        Ok(tb)
    }

    /// The (virtual) wall-clock time of the first broker's server: `.at(tb.now() + d)` publishes
    /// for `d` from now. `SystemTime::now()` does not follow a paused clock.
    pub fn now(&self) -> SystemTime {
        self.first.1.now()
    }

    /// The model of the first broker.
    pub fn model(&self) -> &MemoryRedis {
        &self.first.1
    }

    /// The running app (to stop one subscription, for instance); `None` only while shutting
    /// down.
    pub fn running(&mut self) -> Option<&mut RunningApp> {
        self.running.as_mut()
    }

    /// Starts `subscriber` on the running app, as [`RunningApp::include`] does: on the app's
    /// `RedisBroker`, so on its in-memory server, with its calls recorded; then waits until the
    /// app settles.
    ///
    /// # Errors
    /// As [`RunningApp::include`] (a refused configuration, several brokers of the type: use
    /// [`running`](Self::running) and `include_on`), or when the app was shut down or does not
    /// settle.
    pub async fn include<S: IntoSubscriber>(&mut self, subscriber: S) -> Result<()> {
        let Some(running) = self.running.as_mut() else {
            return Err(Error::broker(
                ErrorKind::NotConnected,
                "TestApp::include: the app was shut down",
            ));
        };
        running.include(subscriber).await?;
        self.settle().await
    }

    /// Stops the subscription `name` gracefully and waits until it has stopped, as
    /// [`RunningApp::remove_subscription`] does, then until the app settles.
    ///
    /// # Errors
    /// When no running subscription has that name, or the app does not settle.
    pub async fn stop_subscription(&mut self, name: &str) -> Result<()> {
        let Some(running) = self.running.as_mut() else {
            return Err(Error::broker(
                ErrorKind::NotConnected,
                "TestApp::stop_subscription: the app was shut down",
            ));
        };
        running.remove_subscription(name).await?;
        self.settle().await
    }

    /// Stops the running app and starts `app` on the same in-memory Redis, clock and records:
    /// what a service's restart looks like to Redis. Handlers still running get the stopped
    /// app's shutdown timeout (on the virtual clock) and are then abandoned, their messages left
    /// claimed, as a worker that died mid-handler leaves them; give the app a short
    /// `shutdown_timeout` to model a crash. `app`'s brokers run on the models of the brokers
    /// with the same key prefix.
    ///
    /// # Errors
    /// When the stopped app fails to shut down, a broker of `app` has no model of the same
    /// prefix, or `app` does not start.
    pub async fn restart(&mut self, app: impl App) -> Result<()> {
        if let Some(running) = self.running.take() {
            running.shutdown().await?;
        }
        let app: RustStream = app.into_rust_stream();
        for b in app.brokers() {
            let Some(redis) = b.downcast_ref::<RedisBroker>() else {
                continue;
            };
            let Some((_, model)) = self
                .brokers
                .iter()
                .find(|(old, _)| old.key_prefix() == redis.key_prefix())
            else {
                return Err(ConfigError::new(
                    "prefix",
                    "TestApp::restart: no broker of the first app has this key prefix",
                    "give each broker of the new app the prefix of one of the first app's",
                )
                .on(redis.key_prefix())
                .into());
            };
            redis.attach_memory(Arc::new(model.clone()))?;
        }
        let running = app
            .observe(record::observer(&self.recorder))
            .start()
            .await?;
        self.running = Some(running);
        self.settle().await
    }

    /// Stops the app as `RunningApp::shutdown` does (in-flight handlers get the shutdown
    /// timeout, on the virtual clock), and reports any command the model did not implement.
    ///
    /// # Errors
    /// When shutting down fails, or the model met a command it does not implement.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(running) = self.running.take() {
            running.shutdown().await?;
        }
        self.check_model()
    }
}
