//! [`TestApp`]: runs an app with every `RedisBroker` on an in-memory [`MemoryRedis`], records its
//! handler calls, and moves the clock.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use ruststream_core::{
    App, Broker, Enqueued, Error, IntoSubscriber, MessageType, PublishBuilder, Publisher, Result,
    RunningApp, RustStream,
};
use ruststream_redis::RedisBroker;
use ruststream_redis::frame::Frame;

use crate::MemoryRedis;
use crate::model::Pushed;
use crate::published::{Message, Published};
use crate::record::{self, Calls, Recorder};

/// Scheduler rounds in a row with no progress after which the app counts as settled.
const QUIET_ROUNDS: u32 = 64;
/// Most scheduler rounds one settle may take.
const MAX_ROUNDS: u32 = 200_000;

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
/// **Settling.** [`publish`](TestPublish::publish), [`advance`](Self::advance) and
/// [`start`](Self::start) return once the app has settled: nothing left to do without time
/// passing (no command sent to the model and no handler called for a few dozen scheduler
/// rounds). This needs tokio's current-thread runtime, which `#[tokio::test]` uses.
pub struct TestApp {
    running: Option<RunningApp>,
    brokers: Vec<(RedisBroker, MemoryRedis)>,
    /// The first of `brokers` (`start` refuses an app without a `RedisBroker`).
    first: (RedisBroker, MemoryRedis),
    recorder: Arc<Recorder>,
    reported: AtomicUsize,
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
                return Err(Error::config(
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
            return Err(Error::config(
                "TestApp: the app has no RedisBroker to run in memory",
            ));
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

    /// The first broker of type `B` (`RedisBroker`), to publish to and assert on.
    pub fn broker<B: InMemoryBroker>(&self) -> TestBroker<'_> {
        self.test_broker(&self.first.0, &self.first.1)
    }

    /// The `n`-th (0-based) broker of type `B`, in the order the app mounted them.
    pub fn nth_broker<B: InMemoryBroker>(&self, n: usize) -> Option<TestBroker<'_>> {
        self.brokers
            .get(n)
            .map(|(broker, model)| self.test_broker(broker, model))
    }

    fn test_broker(&self, broker: &RedisBroker, model: &MemoryRedis) -> TestBroker<'_> {
        TestBroker {
            app: self,
            broker: broker.clone(),
            model: model.clone(),
            publisher: broker.publisher(),
        }
    }

    /// Lets `d` of (virtual) time pass, every timer on the way firing in order, then waits until
    /// the app settles.
    ///
    /// # Errors
    /// When the model met a command or script it does not implement, or the app does not settle.
    pub async fn advance(&self, d: Duration) -> Result<()> {
        tokio::time::sleep(d).await;
        self.settle().await
    }

    /// Waits until the app has nothing left to do without time passing.
    ///
    /// # Errors
    /// When the model met a command or script it does not implement, or the app keeps working
    /// without time passing (a busy loop).
    pub async fn settle(&self) -> Result<()> {
        let mut last = self.progress();
        let mut quiet = 0;
        for _ in 0..MAX_ROUNDS {
            tokio::task::yield_now().await;
            let now = self.progress();
            if now == last {
                quiet += 1;
                if quiet >= QUIET_ROUNDS {
                    return self.check_model();
                }
            } else {
                quiet = 0;
                last = now;
            }
        }
        self.check_model()?;
        Err(Error::broker(
            ruststream_core::ErrorKind::Timeout,
            format!(
                "TestApp: the app did not settle within {MAX_ROUNDS} scheduler rounds: something keeps sending commands without time passing"
            ),
        ))
    }

    fn progress(&self) -> u64 {
        self.brokers
            .iter()
            .map(|(_, m)| m.commands_processed())
            .sum::<u64>()
            + self.recorder.events()
    }

    /// Errors the model reported since the last check.
    fn check_model(&self) -> Result<()> {
        let errors: Vec<String> = self.brokers.iter().flat_map(|(_, m)| m.errors()).collect();
        let seen = self.reported.swap(errors.len(), Ordering::Relaxed);
        match errors.get(seen..) {
            Some(new) if !new.is_empty() => Err(Error::broker(
                ruststream_core::ErrorKind::Other,
                format!("in-memory Redis model: {}", new.join("; ")),
            )),
            _ => Ok(()),
        }
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

    /// Starts `subscriber` on the running app, as [`RunningApp::include`] does (seed 001's
    /// `addHandler`): on the app's `RedisBroker`, so on its in-memory server, with its calls
    /// recorded; then waits until the app settles.
    ///
    /// # Errors
    /// As [`RunningApp::include`] (a refused configuration, several brokers of the type: use
    /// [`running`](Self::running) and `include_on`), or when the app was shut down or does not
    /// settle.
    pub async fn include<S: IntoSubscriber>(&mut self, subscriber: S) -> Result<()> {
        let Some(running) = self.running.as_mut() else {
            return Err(Error::config("TestApp::include: the app was shut down"));
        };
        running.include(subscriber).await?;
        self.settle().await
    }

    /// Stops the subscription `name` gracefully and waits until it has stopped, as
    /// [`RunningApp::remove_subscription`] does (seed 001's `removeHandler`), then until the
    /// app settles.
    ///
    /// # Errors
    /// When no running subscription has that name, or the app does not settle.
    pub async fn stop_subscription(&mut self, name: &str) -> Result<()> {
        let Some(running) = self.running.as_mut() else {
            return Err(Error::config(
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
                return Err(Error::config(format!(
                    "TestApp::restart: no broker of the first app has the key prefix `{}`",
                    redis.key_prefix()
                )));
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

/// A broker type `TestApp` runs in memory: `RedisBroker`.
pub trait InMemoryBroker: Broker + sealed::Sealed {}

impl InMemoryBroker for RedisBroker {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for ruststream_redis::RedisBroker {}
}

/// One broker of a [`TestApp`]: publish to it, and assert on its subscribers and keys.
pub struct TestBroker<'a> {
    app: &'a TestApp,
    broker: RedisBroker,
    model: MemoryRedis,
    publisher: Publisher,
}

impl fmt::Debug for TestBroker<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestBroker")
            .field("broker", &self.broker)
            .finish_non_exhaustive()
    }
}

impl<'a> TestBroker<'a> {
    /// Starts a publish of `value`, to its type's outgoing name unless `.to("key")` says
    /// otherwise; `.publish().await` returns once the app has settled.
    pub fn message<'b, T: MessageType>(&'b self, value: &'b T) -> TestPublish<'b, T> {
        TestPublish {
            inner: self.publisher.message(value),
            app: self.app,
        }
    }

    /// Starts a publish of many values in one round trip.
    pub fn messages<'b, T: MessageType>(&'b self, values: &'b [T]) -> TestPublish<'b, T> {
        TestPublish {
            inner: self.publisher.messages(values),
            app: self.app,
        }
    }

    /// The calls so far of the subscriber of `name`: its source key (every subscriber of that
    /// key), or a subscription name such as `key#2`.
    pub fn subscriber(&self, name: &str) -> Calls {
        Calls::new(
            name,
            self.app.recorder.calls(name),
            self.app.recorder.names(),
        )
    }

    /// What publishes put on `key` so far (lists, streams, delayed sets, channels, and a
    /// list's priority levels after level 0's), decoded as `T` on assertion. Entries that claims and settles move between keys (retries, recovery,
    /// dead letters of reliable lists) are not publishes; read those keys with
    /// [`client`](Self::client).
    pub fn published<T: MessageType + PartialEq + fmt::Debug>(&self, key: &str) -> Published<T> {
        let full = format!("{}{key}", self.broker.key_prefix());
        let delayed = self.broker.delayed_set_key(key);
        // A list's priority levels hold its messages too (their `PUBLISH`ed wake-ups are not).
        let levels = self.broker.level_keys(key);
        let levels: Vec<&str> = levels.iter().map(String::as_str).collect();
        let on_levels = self
            .model
            .pushes(&levels)
            .into_iter()
            .filter(|p| matches!(p, Pushed::List(_)));
        let messages = self
            .model
            .pushes(&[&full, &delayed])
            .into_iter()
            .chain(on_levels)
            .map(|p| match p {
                Pushed::List(v) => Message::of_frame(Frame::decode(v), false),
                Pushed::Scheduled(v) => Message::of_frame(Frame::decode(v), true),
                Pushed::Channel(v) => Message::of_frame(Frame::decode(v), false),
                Pushed::Stream(fields) => Message::of_stream_entry(fields),
            })
            .collect();
        Published::new(key, messages)
    }

    /// The broker, e.g. to publish from a task of the test.
    pub fn broker(&self) -> &RedisBroker {
        &self.broker
    }

    /// The in-memory server this broker runs on.
    pub fn model(&self) -> &MemoryRedis {
        &self.model
    }

    /// A fred client on this broker's in-memory server, for any command (`LLEN`, `ZCARD`,
    /// `XPENDING`, ...); keys are full keys, with the broker's prefix. Already initialized.
    ///
    /// # Errors
    /// When fred cannot build the client.
    pub async fn client(&self) -> Result<fred::clients::Client> {
        use fred::interfaces::ClientLike;
        let client = self.model.client().map_err(ruststream_redis::error::core)?;
        client.init().await.map_err(ruststream_redis::error::core)?;
        Ok(client)
    }
}

/// A publish through a [`TestBroker`]; `.publish().await` returns once the app has settled.
#[must_use = "a publish does nothing until `.publish().await`"]
pub struct TestPublish<'a, T> {
    inner: PublishBuilder<'a, T>,
    app: &'a TestApp,
}

impl<T> std::fmt::Debug for TestPublish<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPublish")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<T: MessageType> TestPublish<'_, T> {
    /// The destination key; without it the type's outgoing name is used.
    pub fn to(mut self, destination: impl Into<String>) -> Self {
        self.inner = self.inner.to(destination);
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.inner = self.inner.header(name, value);
        self
    }

    /// Sets the message id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.inner = self.inner.id(id);
        self
    }

    /// Delivers the message once `delay` has passed (on the model's clock).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.inner = self.inner.delay(delay);
        self
    }

    /// Enqueues the message only when no publish of its id to the destination holds a window
    /// (`PublishBuilder::unique_for`; the window runs on the model's clock). Needs `.id(..)`.
    pub fn unique_for(mut self, window: Duration) -> Self {
        self.inner = self.inner.unique_for(window);
        self
    }

    /// Makes the publish durable (`PublishBuilder::durable`). The model has no replicas and
    /// acknowledges at once, as a server with `replicas` replicas would: the publish returns
    /// `Ok` and never `Error::NotDurable`.
    pub fn durable(mut self, replicas: u32, timeout: Duration) -> Self {
        self.inner = self.inner.durable(replicas, timeout);
        self
    }

    /// On a destination spread over partitions, the key that picks the partition.
    pub fn partition_key(mut self, key: impl Into<String>) -> Self {
        self.inner = self.inner.partition_key(key);
        self
    }

    /// On a queue with priority levels, the level (see
    /// [`PublishBuilder::priority`](ruststream_core::PublishBuilder::priority)).
    pub fn priority(mut self, level: u8) -> Self {
        self.inner = self.inner.priority(level);
        self
    }

    /// Delivers the message at `when`, on the model's clock: compute it from
    /// [`TestApp::now`] (`tb.now() + d`), which follows the virtual clock.
    pub fn at(mut self, when: SystemTime) -> Self {
        self.inner = self.inner.at(when);
        self
    }

    /// Publishes, then waits until the app has settled (the handlers it triggers have run);
    /// returns what was [`Enqueued`].
    ///
    /// # Errors
    /// When the publish fails (no destination, an encoding error), or the app does not settle.
    pub async fn publish(self) -> Result<Enqueued> {
        let enqueued = self.inner.publish().await?;
        self.app.settle().await?;
        Ok(enqueued)
    }
}
