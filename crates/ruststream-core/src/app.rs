//! Applications: [`RustStream`] holds brokers and their subscribers, starts them, and stops them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::dispatch::Subscription;
use crate::health::{BrokerCheck, Health, StateCell, Watched};
use crate::{Broker, BrokerSource, Error, IntoSubscriber, Receiver, Result, Subscriber};

/// The service's name and version, shown in logs and the AsyncAPI document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppInfo {
    /// The service's title.
    pub title: String,
    /// Its version.
    pub version: String,
    /// A description, for the AsyncAPI document.
    pub description: Option<String>,
}

impl AppInfo {
    /// Name and version: `AppInfo::new("images", "0.1.0")`.
    pub fn new(title: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            version: version.into(),
            description: None,
        }
    }

    /// Adds a description.
    #[must_use]
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = Some(text.into());
        self
    }
}

/// Where `with_broker`'s closure mounts subscribers: `b.include(render)`.
pub struct Mount<B: Broker> {
    subscribers: Vec<Subscriber<B>>,
}

impl<B: Broker> Mount<B> {
    /// Mounts a subscriber; the returned reference sets its reply policy with `.out_reply(..)`.
    pub fn include<S: IntoSubscriber<Broker = B>>(&mut self, subscriber: S) -> &mut Subscriber<B> {
        self.subscribers.push(subscriber.into_subscriber());
        let last = self.subscribers.len() - 1;
        &mut self.subscribers[last]
    }
}

/// A RustStream application: brokers, their subscribers, and how to stop.
///
/// ```no_run
/// # use ruststream_core::*;
/// # fn demo<B: Broker>(broker: B) -> impl App {
/// RustStream::new(AppInfo::new("images", "0.1.0"))
///     .shutdown_timeout(std::time::Duration::from_secs(10))
///     .with_broker(broker, |b| { /* b.include(..) */ })
/// # }
/// ```
#[must_use]
pub struct RustStream {
    info: AppInfo,
    brokers: Vec<Box<dyn MountedBroker>>,
    shutdown_timeout: Duration,
    observer: crate::observe::SharedObserver,
}

impl RustStream {
    /// An application with no broker yet.
    pub fn new(info: AppInfo) -> Self {
        Self {
            info,
            brokers: Vec::new(),
            shutdown_timeout: Duration::from_secs(30),
            observer: None,
        }
    }

    /// Adds a broker and mounts its subscribers.
    pub fn with_broker<B: Broker>(mut self, broker: B, mount: impl FnOnce(&mut Mount<B>)) -> Self {
        let mut m = Mount {
            subscribers: Vec::new(),
        };
        mount(&mut m);
        self.brokers.push(Box::new(BrokerApp {
            broker: Arc::new(broker),
            subscribers: m.subscribers,
        }));
        self
    }

    /// How long in-flight handlers get to finish on shutdown (default 30 s); what is unfinished
    /// then stays claimed and is recovered later.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// The brokers of this app, each as `Any`, so a test harness can find a broker of a given
    /// type (`downcast_ref::<RedisBroker>()`) and reconfigure it before the app starts.
    pub fn brokers(&self) -> impl Iterator<Item = &dyn std::any::Any> {
        self.brokers.iter().map(|b| b.broker_any())
    }

    /// Each broker of this app (as `Any`) with the sources of its subscribers (each as `Any`, of
    /// the broker's source type), so operator tools can find a broker's subscriptions.
    pub fn broker_sources(
        &self,
    ) -> impl Iterator<Item = (&dyn std::any::Any, Vec<&dyn std::any::Any>)> {
        self.brokers
            .iter()
            .map(|b| (b.broker_any(), b.sources_any()))
    }

    /// The mounted brokers, for the AsyncAPI document.
    pub(crate) fn mounted(&self) -> impl Iterator<Item = &dyn MountedBroker> {
        self.brokers.iter().map(AsRef::as_ref)
    }

    /// Tells `observer` of every handler call and settlement (see [`crate::observe`]); test
    /// harnesses use it. Replaces any observer set before.
    pub fn observe(mut self, observer: Arc<dyn crate::observe::Observer>) -> Self {
        self.observer = Some(observer);
        self
    }
}

/// What `#[ruststream::app]` and `run_main` take: an application, ready to check or run.
pub trait App: Send + 'static {
    /// Name and version.
    fn info(&self) -> &AppInfo;

    /// Validates every subscription, connects every broker and checks what needs the server, then
    /// disconnects. The `check` command.
    fn check(&self) -> impl Future<Output = Result<()>> + Send;

    /// Validates, connects and starts every subscription.
    fn start(self) -> impl Future<Output = Result<RunningApp>> + Send;

    /// The application as a [`RustStream`], for documents and test harnesses.
    fn into_rust_stream(self) -> RustStream;
}

impl App for RustStream {
    fn info(&self) -> &AppInfo {
        &self.info
    }

    async fn check(&self) -> Result<()> {
        for b in &self.brokers {
            b.check().await?;
        }
        Ok(())
    }

    async fn start(self) -> Result<RunningApp> {
        for b in &self.brokers {
            b.validate()?;
        }
        let stop = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let mut subscriptions = HashMap::new();
        let mut closers = Vec::new();
        let mut watched = Vec::new();
        let mut checks = Vec::new();
        let mut tallies = Vec::new();
        for b in self.brokers {
            let started = b
                .start(stop.clone(), self.shutdown_timeout, self.observer.clone())
                .await?;
            for (watch, token, task, tally) in started.subscriptions {
                tasks.spawn(task);
                tallies.push((watch.name.clone(), tally));
                subscriptions.insert(watch.name.clone(), token);
                watched.push(watch);
            }
            closers.push(started.close);
            checks.push(started.ready);
        }
        tracing::info!(app = %self.info.title, version = %self.info.version, subscriptions = subscriptions.len(), "started");
        Ok(RunningApp {
            stop,
            tasks,
            subscriptions,
            closers,
            health: Health::new(watched, checks),
            tallies,
        })
    }

    fn into_rust_stream(self) -> RustStream {
        self
    }
}

/// A started application. Stop it with [`shutdown`](Self::shutdown).
pub struct RunningApp {
    stop: CancellationToken,
    tasks: JoinSet<()>,
    subscriptions: HashMap<String, CancellationToken>,
    closers: Vec<BoxFuture<'static, ()>>,
    health: Health,
    tallies: Vec<(String, Arc<crate::observe::Tally>)>,
}

impl RunningApp {
    /// A cheap, clonable handle that says whether every broker is connected and every
    /// subscription is reading (see [`crate::health`]); it stays valid after the app stops
    /// (and then says every subscription stopped).
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Each subscription's name with its running totals of settled deliveries, in start order;
    /// they stay live after the app is waited on, e.g. for a dashboard's rates.
    pub fn tallies(&self) -> Vec<(String, Arc<crate::observe::Tally>)> {
        self.tallies.clone()
    }

    /// The names of the running subscriptions (their source keys).
    pub fn subscriptions(&self) -> impl Iterator<Item = &str> {
        self.subscriptions.keys().map(String::as_str)
    }

    /// Stops one subscription gracefully (its in-flight handlers finish and are settled) while
    /// the others go on.
    pub fn stop_subscription(&mut self, name: &str) -> Result<()> {
        match self.subscriptions.remove(name) {
            Some(token) => {
                token.cancel();
                Ok(())
            }
            None => Err(Error::config(format!(
                "no running subscription named `{name}`; running: {}",
                self.subscriptions
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// A token that stops the app when cancelled.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Stops claiming, lets in-flight handlers finish (up to the shutdown timeout), settles them,
    /// and closes every connection.
    pub async fn shutdown(mut self) -> Result<()> {
        self.stop.cancel();
        self.join().await
    }

    /// Waits until the app stops (its stop token is cancelled, e.g. by a signal), then closes.
    pub async fn wait(mut self) -> Result<()> {
        self.stop.cancelled().await;
        self.join().await
    }

    async fn join(&mut self) -> Result<()> {
        while let Some(r) = self.tasks.join_next().await {
            if let Err(e) = r {
                tracing::error!(error = %e, "subscription task failed");
            }
        }
        for close in self.closers.drain(..) {
            close.await;
        }
        Ok(())
    }
}

type SubscriptionTask = (
    Watched,
    CancellationToken,
    BoxFuture<'static, ()>,
    Arc<crate::observe::Tally>,
);

/// What starting one broker yields.
pub(crate) struct Started {
    subscriptions: Vec<SubscriptionTask>,
    close: BoxFuture<'static, ()>,
    ready: BrokerCheck,
}

/// A broker with its subscribers, types erased so one app can hold several brokers.
pub(crate) trait MountedBroker: Send + Sync + 'static {
    /// Validates every subscriber's configuration.
    fn validate(&self) -> Result<()>;
    /// Validates, connects, checks, disconnects.
    fn check(&self) -> BoxFuture<'_, Result<()>>;
    /// Connects and starts every subscription; `observer` is told of every handler call.
    fn start(
        self: Box<Self>,
        stop: CancellationToken,
        shutdown_timeout: Duration,
        observer: Option<Arc<dyn crate::observe::Observer>>,
    ) -> BoxFuture<'static, Result<Started>>;
    /// The subscribers, for the AsyncAPI document.
    fn docs(&self) -> Vec<crate::asyncapi::OperationDoc>;
    /// The broker itself, so a test harness can find a broker of a given type
    /// (`broker_any().downcast_ref::<RedisBroker>()`) and reconfigure it before the app starts.
    fn broker_any(&self) -> &dyn std::any::Any;
    /// The subscribers' sources, for operator tools.
    fn sources_any(&self) -> Vec<&dyn std::any::Any>;
}

struct BrokerApp<B: Broker> {
    broker: Arc<B>,
    subscribers: Vec<Subscriber<B>>,
}

impl<B: Broker> BrokerApp<B> {
    fn sources(&self) -> Vec<&B::Source> {
        self.subscribers.iter().map(|s| &s.source).collect()
    }
}

impl<B: Broker> MountedBroker for BrokerApp<B> {
    fn validate(&self) -> Result<()> {
        for s in &self.subscribers {
            if let crate::subscriber::Handler::Batch(_, batch) = &s.handler {
                batch.validate(s.source.key(), s.source.options().concurrency.max(1))?;
            }
            if let Some(reply) = &s.reply
                && reply.to.is_none()
                && reply.message.name.is_none()
            {
                return Err(Error::config(format!(
                    "the subscriber of `{}` replies with `{}`, which has no outgoing name: add `.to(\"key\")` (or `reply(\"key\")` in #[subscriber]), or `#[outgoing(name = \"...\")]` on the type",
                    s.source.key(),
                    reply.message.short_name()
                )));
            }
        }
        self.broker.validate(&self.sources())
    }

    fn check(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.validate()?;
            let r = self.broker.connect(&self.sources()).await;
            self.broker.close().await;
            r
        })
    }

    fn start(
        self: Box<Self>,
        stop: CancellationToken,
        shutdown_timeout: Duration,
        observer: Option<Arc<dyn crate::observe::Observer>>,
    ) -> BoxFuture<'static, Result<Started>> {
        Box::pin(async move {
            self.broker.connect(&self.sources()).await?;
            let publisher = self.broker.publisher();
            let mut subscriptions = Vec::new();
            let mut names: HashMap<String, usize> = HashMap::new();
            for s in self.subscribers {
                let key = s.source.key().to_owned();
                let n = names.entry(key.clone()).or_default();
                *n += 1;
                let name = if *n == 1 { key } else { format!("{key}#{n}") };
                let token = stop.child_token();
                let receiver = self.broker.receiver(&s.source, token.clone()).await?;
                let watch = Watched {
                    name: name.clone(),
                    state: StateCell::reading(),
                    probe: receiver.probe(),
                };
                let sub = Arc::new(Subscription {
                    name: name.clone(),
                    broker: self.broker.clone(),
                    source: s.source,
                    handler: s.handler,
                    reply_policy: s.reply.and_then(|r| r.policy),
                    publisher: publisher.clone(),
                    shutdown_timeout,
                    observer: observer.clone(),
                    state: watch.state.clone(),
                    tally: Arc::default(),
                });
                let tally = sub.tally.clone();
                let run: BoxFuture<'static, ()> = Box::pin(sub.run(receiver, token.clone()));
                subscriptions.push((watch, token, run, tally));
            }
            let broker = self.broker;
            let probed = broker.clone();
            Ok(Started {
                subscriptions,
                close: Box::pin(async move { broker.close().await }),
                ready: Box::new(move || probed.ready()),
            })
        })
    }

    fn broker_any(&self) -> &dyn std::any::Any {
        &*self.broker
    }

    fn sources_any(&self) -> Vec<&dyn std::any::Any> {
        self.subscribers
            .iter()
            .map(|s| &s.source as &dyn std::any::Any)
            .collect()
    }

    fn docs(&self) -> Vec<crate::asyncapi::OperationDoc> {
        self.subscribers
            .iter()
            .map(|s| crate::asyncapi::OperationDoc {
                channel: s.source.describe(),
                input: s.input,
                reply: s.reply.as_ref().map(|r| (r.to.clone(), r.message)),
                reply_transport: s.reply.as_ref().and_then(|r| {
                    self.broker
                        .reply_transport(r.to.as_deref(), r.policy.as_ref())
                }),
            })
            .collect()
    }
}
