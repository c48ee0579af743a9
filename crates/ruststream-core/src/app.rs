//! Applications: [`RustStream`] holds brokers and their subscribers, starts them, and stops them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::running::Live;
pub use crate::running::RunningApp;
use crate::{Broker, BrokerSource, IntoSubscriber, Result, Subscriber};

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
    periodics: Vec<crate::Periodic>,
}

impl<B: Broker> std::fmt::Debug for Mount<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount")
            .field("subscribers", &self.subscribers)
            .finish_non_exhaustive()
    }
}

impl<B: Broker> Mount<B> {
    /// Mounts a subscriber; the returned reference sets its reply policy with `.out_reply(..)`.
    pub fn include<S: IntoSubscriber<Broker = B>>(&mut self, subscriber: S) -> &mut Subscriber<B> {
        self.subscribers.push(subscriber.into_subscriber());
        let last = self.subscribers.len() - 1;
        &mut self.subscribers[last]
    }

    /// Mounts a periodic job (see [`crate::periodic`]): `b.periodic(Periodic::new(..))`, or a
    /// fn marked `#[periodic("0 */5 * * * *", tz = "UTC")]`. It runs on this broker's clock and
    /// state, and publishes through the broker's publisher unless it was made with
    /// [`Publisher::every`](crate::Publisher::every).
    pub fn periodic<P: crate::IntoPeriodic>(&mut self, job: P) -> &mut Self {
        self.periodics.push(job.into_periodic());
        self
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

impl std::fmt::Debug for RustStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RustStream")
            .field("info", &self.info)
            .field("brokers", &self.brokers.len())
            .field("shutdown_timeout", &self.shutdown_timeout)
            .finish_non_exhaustive()
    }
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
            periodics: Vec::new(),
        };
        mount(&mut m);
        self.brokers.push(Box::new(BrokerApp {
            broker: Arc::new(broker),
            subscribers: m.subscribers,
            periodics: m.periodics,
        }));
        self
    }

    /// How long in-flight handlers get to finish on shutdown, and their settles to go through
    /// (default 30 s); what is unfinished then, or whose settle still fails, stays claimed and
    /// is recovered later, and the shutdown ends (within this plus a quarter second). A handler
    /// that used steps and is still running then is cut off, and its message put back on its
    /// queue at once (see [`Context::stopping`](crate::Context::stopping)).
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
        let mut running = RunningApp::new(self.info.clone());
        for b in self.brokers {
            if let Err(e) = b
                .start(&mut running, self.shutdown_timeout, self.observer.clone())
                .await
            {
                // What started stops: its tasks end with the app's token.
                running.stop_token().cancel();
                return Err(e);
            }
        }
        running.run_added();
        tracing::info!(app = %self.info.title, version = %self.info.version, subscriptions = running.subscriptions().count(), "started");
        Ok(running)
    }

    fn into_rust_stream(self) -> RustStream {
        self
    }
}

/// A broker with its subscribers, types erased so one app can hold several brokers.
pub(crate) trait MountedBroker: Send + Sync + 'static {
    /// Validates every subscriber's configuration.
    fn validate(&self) -> Result<()>;
    /// Validates, connects, checks, disconnects.
    fn check(&self) -> BoxFuture<'_, Result<()>>;
    /// Connects and starts every subscription in `app`; `observer` is told of every handler
    /// call.
    fn start<'a>(
        self: Box<Self>,
        app: &'a mut RunningApp,
        shutdown_timeout: Duration,
        observer: Option<Arc<dyn crate::observe::Observer>>,
    ) -> BoxFuture<'a, Result<()>>;
    /// The subscribers, for the AsyncAPI document.
    fn docs(&self) -> Vec<crate::asyncapi::OperationDoc>;
    /// The periodic jobs, for the AsyncAPI document.
    fn sends(&self) -> Vec<crate::asyncapi::SendDoc>;
    /// The broker itself, so a test harness can find a broker of a given type
    /// (`broker_any().downcast_ref::<RedisBroker>()`) and reconfigure it before the app starts.
    fn broker_any(&self) -> &dyn std::any::Any;
    /// The subscribers' sources, for operator tools.
    fn sources_any(&self) -> Vec<&dyn std::any::Any>;
}

struct BrokerApp<B: Broker> {
    broker: Arc<B>,
    subscribers: Vec<Subscriber<B>>,
    periodics: Vec<crate::Periodic>,
}

impl<B: Broker> BrokerApp<B> {
    fn sources(&self) -> Vec<&B::Source> {
        self.subscribers.iter().map(|s| &s.source).collect()
    }
}

impl<B: Broker> MountedBroker for BrokerApp<B> {
    fn validate(&self) -> Result<()> {
        for s in &self.subscribers {
            s.validate()?;
        }
        crate::periodic::validate_all(&self.periodics, self.broker.periodic_store().is_some())?;
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

    fn start<'a>(
        self: Box<Self>,
        app: &'a mut RunningApp,
        shutdown_timeout: Duration,
        observer: Option<Arc<dyn crate::observe::Observer>>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.broker.connect(&self.sources()).await?;
            let live = Live::new(self.broker.clone(), shutdown_timeout, observer);
            for s in self.subscribers {
                let name = app.free_name(s.source.key());
                let opened = live.open(s, name, app.child_token()).await?;
                app.add(opened);
            }
            if !self.periodics.is_empty() {
                let store = self
                    .broker
                    .periodic_store()
                    .ok_or_else(crate::periodic::no_store)?;
                for job in self.periodics {
                    let schedule = job.validate()?;
                    let task = crate::periodic::spawn(
                        job,
                        schedule,
                        store.clone(),
                        self.broker.publisher(),
                        app.child_token(),
                    )
                    .await?;
                    app.add_task(task);
                }
            }
            let broker = self.broker;
            let probed = broker.clone();
            app.add_broker(
                live,
                Box::pin(async move { broker.close().await }),
                Box::new(move || probed.ready()),
            );
            Ok(())
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

    fn sends(&self) -> Vec<crate::asyncapi::SendDoc> {
        self.periodics
            .iter()
            .filter_map(|p| {
                Some(crate::asyncapi::SendDoc {
                    name: p.name.clone(),
                    schedule: p.describe(),
                    to: p.to.clone(),
                    message: p.doc?,
                    transport: self.broker.reply_transport(p.to.as_deref(), None),
                })
            })
            .collect()
    }

    fn docs(&self) -> Vec<crate::asyncapi::OperationDoc> {
        self.subscribers
            .iter()
            .map(|s| s.doc(&self.broker))
            .collect()
    }
}
