//! [`RunningApp`]: a started application, whose subscriptions can be stopped one by one
//! ([`RunningApp::stop_subscription`], or [`RunningApp::remove_subscription`] to wait until it
//! has stopped) and added while it runs ([`RunningApp::include`]), each with its own
//! concurrency. Its [`Health`], tallies, metrics (registered by subscription name) and AsyncAPI
//! document ([`RunningApp::asyncapi`]) follow what runs now.
//!
//! Sends no command itself: adding a subscription asks its broker to validate it
//! ([`Broker::validate`]), prepare the server for it ([`Broker::prepare`]: a stream's consumer
//! group) and open its receiver ([`Broker::receiver`]), in that order, and starts it only when all
//! three succeeded; a failure leaves nothing running and nothing in the app's lists (what
//! `prepare` created on the server, such as an empty consumer group, stays and is reused by the
//! next try).

use std::any::{Any, type_name};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::asyncapi::OperationDoc;
use crate::dispatch::Subscription;
use crate::health::{BrokerCheck, Health, StateCell, Watched};
use crate::observe::{SharedObserver, Tally};
use crate::{
    AppInfo, Broker, BrokerSource, ConfigError, Error, ErrorKind, IntoSubscriber, Publisher,
    Receiver, Result, Subscriber,
};

/// A started broker: what starting one more subscription on it needs.
pub(crate) struct Live<B: Broker> {
    broker: Arc<B>,
    publisher: Publisher,
    shutdown_timeout: Duration,
    observer: SharedObserver,
}

/// One subscription whose receiver is open, ready to run.
pub(crate) struct Opened {
    watch: Watched,
    token: CancellationToken,
    run: BoxFuture<'static, ()>,
    tally: Arc<Tally>,
    doc: OperationDoc,
}

impl<B: Broker> Live<B> {
    pub(crate) fn new(
        broker: Arc<B>,
        shutdown_timeout: Duration,
        observer: SharedObserver,
    ) -> Self {
        Self {
            publisher: broker.publisher(),
            broker,
            shutdown_timeout,
            observer,
        }
    }

    /// Opens the receiver of `s` as the subscription `name`, which reads until `token` is
    /// cancelled once it runs.
    pub(crate) async fn open(
        &self,
        s: Subscriber<B>,
        name: String,
        token: CancellationToken,
    ) -> Result<Opened> {
        let doc = s.doc(&self.broker);
        let receiver = self.broker.receiver(&s.source, token.clone()).await?;
        let watch = Watched {
            name: name.clone(),
            state: StateCell::reading(),
            probe: receiver.probe(),
        };
        let sub = Arc::new(Subscription {
            name,
            broker: self.broker.clone(),
            source: s.source,
            handler: s.handler,
            reply_policy: s.reply.and_then(|r| r.policy),
            publisher: self.publisher.clone(),
            shutdown_timeout: self.shutdown_timeout,
            observer: self.observer.clone(),
            state: watch.state.clone(),
            tally: Arc::default(),
        });
        let tally = sub.tally.clone();
        let run = Box::pin(sub.run(receiver, token.clone()));
        Ok(Opened {
            watch,
            token,
            run,
            tally,
            doc,
        })
    }
}

/// One running subscription.
struct Running {
    name: String,
    token: CancellationToken,
    tally: Arc<Tally>,
    doc: OperationDoc,
    /// Resolves when its task has ended (its last handler settled or abandoned).
    ended: oneshot::Receiver<()>,
}

/// A started application. Stop it with [`shutdown`](Self::shutdown).
pub struct RunningApp {
    info: AppInfo,
    stop: CancellationToken,
    tasks: JoinSet<()>,
    /// Registered, not yet running (see [`add`](Self::add)).
    added: Vec<BoxFuture<'static, ()>>,
    running: Vec<Running>,
    /// Each started broker, a `Live<B>`, in mount order.
    live: Vec<Arc<dyn Any + Send + Sync>>,
    closers: Vec<BoxFuture<'static, ()>>,
    health: Health,
}

impl std::fmt::Debug for RunningApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningApp")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl RunningApp {
    /// An app with nothing started yet.
    pub(crate) fn new(info: AppInfo) -> Self {
        Self {
            info,
            stop: CancellationToken::new(),
            tasks: JoinSet::new(),
            added: Vec::new(),
            running: Vec::new(),
            live: Vec::new(),
            closers: Vec::new(),
            health: Health::new(),
        }
    }

    /// Adds a started broker: its handle for later subscriptions, how to close it, and its
    /// readiness check.
    pub(crate) fn add_broker<B: Broker>(
        &mut self,
        live: Live<B>,
        close: BoxFuture<'static, ()>,
        ready: BrokerCheck,
    ) {
        self.live.push(Arc::new(live));
        self.closers.push(close);
        self.health.add_broker(ready);
    }

    /// The name of a new subscription of `key`: the key, or `key#2`, `key#3`, ... (the first
    /// not running) when a subscription of that name runs.
    pub(crate) fn free_name(&self, key: &str) -> String {
        let taken = |name: &str| self.running.iter().any(|r| r.name == name);
        if !taken(key) {
            return key.to_owned();
        }
        (2..)
            .map(|n| format!("{key}#{n}"))
            .find(|name| !taken(name))
            .unwrap_or_else(|| key.to_owned())
    }

    /// A token for a new subscription: cancelled by the app's stop or its own.
    pub(crate) fn child_token(&self) -> CancellationToken {
        self.stop.child_token()
    }

    /// Registers an opened subscription; it runs once [`run_added`](Self::run_added) is called.
    /// At startup every subscription is registered before any runs, so none reads while the
    /// app is still starting.
    pub(crate) fn add(&mut self, opened: Opened) {
        let (tx, ended) = oneshot::channel();
        let run = opened.run;
        self.added.push(Box::pin(async move {
            run.await;
            let _ = tx.send(());
        }));
        self.running.push(Running {
            name: opened.watch.name.clone(),
            token: opened.token,
            tally: opened.tally,
            doc: opened.doc,
            ended,
        });
        self.health.add(opened.watch);
    }

    /// Registers a task that runs beside the subscriptions (a periodic job's loop) until the
    /// app stops; like a subscription, it starts with [`run_added`](Self::run_added).
    pub(crate) fn add_task(&mut self, task: BoxFuture<'static, ()>) {
        self.added.push(task);
    }

    /// Runs the subscriptions registered since the last call.
    pub(crate) fn run_added(&mut self) {
        for run in self.added.drain(..) {
            self.tasks.spawn(run);
        }
    }

    /// Starts `subscriber` on the app's broker of its type, with its own concurrency, as a
    /// subscription mounted before the start would run: validated with the same rules (its
    /// configuration, the cluster's slot rule), its server side prepared (a consumer group),
    /// named by its key (`key#2`, ... when that name runs). On an error nothing was started
    /// and the app runs on.
    ///
    /// # Errors
    /// When the app has no broker of the subscriber's type or several (then use
    /// [`include_on`](Self::include_on)), the app is stopping, or the subscriber is refused or
    /// cannot be prepared or opened.
    pub async fn include<S: IntoSubscriber>(&mut self, subscriber: S) -> Result<()> {
        self.include_on(None, subscriber).await
    }

    /// [`include`](Self::include) on the `n`-th (0-based, in mount order) broker of the
    /// subscriber's type, for an app that mounts several.
    ///
    /// # Errors
    /// As [`include`](Self::include); also when there is no `n`-th broker of that type.
    pub async fn include_on<S: IntoSubscriber>(
        &mut self,
        n: impl Into<Option<usize>>,
        subscriber: S,
    ) -> Result<()> {
        let live = self.live::<S::Broker>(n.into())?;
        if self.stop.is_cancelled() {
            return Err(Error::broker(
                ErrorKind::NotConnected,
                "the app is stopping: no subscription can be added",
            ));
        }
        let s = subscriber.into_subscriber();
        s.validate()?;
        live.broker.validate(&[&s.source])?;
        live.broker.prepare(&[&s.source]).await?;
        let name = self.free_name(s.source.key());
        let token = self.child_token();
        match live.open(s, name, token.clone()).await {
            Ok(opened) => {
                tracing::info!(subscription = %opened.watch.name, "subscription added");
                self.add(opened);
                self.run_added();
                Ok(())
            }
            Err(e) => {
                // Whatever the receiver started before failing stops with its token.
                token.cancel();
                Err(e)
            }
        }
    }

    /// The started broker of type `B`: the `n`-th, or the only one.
    fn live<B: Broker>(&self, n: Option<usize>) -> Result<Arc<Live<B>>> {
        let of_type: Vec<Arc<Live<B>>> = self
            .live
            .iter()
            .filter_map(|l| l.clone().downcast::<Live<B>>().ok())
            .collect();
        let broker = type_name::<B>();
        match (n, of_type.len()) {
            (_, 0) => Err(ConfigError::new(
                "include",
                format!("this app mounts no {broker}"),
                "mount it with `with_broker` before starting the app",
            )
            .into()),
            (None, 1) => Ok(of_type[0].clone()),
            (None, k) => Err(ConfigError::new(
                "include",
                format!("this app mounts {k} brokers of type {broker}"),
                "say which with `include_on(n, ..)` (0-based, in mount order)",
            )
            .into()),
            (Some(i), k) => of_type.get(i).cloned().ok_or_else(|| {
                ConfigError::new(
                    format!("include_on({i})"),
                    format!("this app mounts {k} brokers of type {broker}"),
                    format!("give n from 0 to {}", k - 1),
                )
                .into()
            }),
        }
    }

    /// A cheap, clonable handle that says whether every broker is connected and every
    /// subscription is reading (see [`crate::health`]); it follows subscriptions added and
    /// stopped later, and stays valid after the app stops (and then says every subscription
    /// stopped).
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Each running subscription's name with its running totals of settled deliveries, in start
    /// order; the totals stay live after the app is waited on, e.g. for a dashboard's rates.
    pub fn tallies(&self) -> Vec<(String, Arc<Tally>)> {
        self.running
            .iter()
            .map(|r| (r.name.clone(), r.tally.clone()))
            .collect()
    }

    /// The names of the running subscriptions (their source keys, `key#2` for a second one), in
    /// start order.
    pub fn subscriptions(&self) -> impl Iterator<Item = &str> {
        self.running.iter().map(|r| r.name.as_str())
    }

    /// The AsyncAPI 3.0 document of what runs now: the subscriptions mounted at start and added
    /// since, without those stopped.
    pub fn asyncapi(&self) -> serde_json::Value {
        let ops: Vec<OperationDoc> = self.running.iter().map(|r| r.doc.clone()).collect();
        crate::asyncapi::build(&self.info, &ops)
    }

    /// Stops one subscription gracefully (its in-flight handlers finish and are settled) while
    /// the others go on. It leaves the subscriptions, the health handle (stopping one on purpose
    /// does not make the app unready), the tallies and the AsyncAPI document at once; its task
    /// ends in the background (see [`remove_subscription`](Self::remove_subscription) to wait
    /// for it).
    ///
    /// # Errors
    /// When no running subscription has that name; the message lists those that run.
    pub fn stop_subscription(&mut self, name: &str) -> Result<()> {
        self.take(name).map(drop)
    }

    /// [`stop_subscription`](Self::stop_subscription), then waits until the subscription's task
    /// has ended: its in-flight handlers finished (or the shutdown timeout abandoned them to
    /// recovery) and were settled, so it claims nothing any more.
    ///
    /// # Errors
    /// When no running subscription has that name.
    pub async fn remove_subscription(&mut self, name: &str) -> Result<()> {
        let stopped = self.take(name)?;
        // An error only says the task was aborted (the app is being dropped): it ended too.
        let _ = stopped.ended.await;
        Ok(())
    }

    /// Stops the subscription `name` and takes it out of every list.
    fn take(&mut self, name: &str) -> Result<Running> {
        let Some(i) = self.running.iter().position(|r| r.name == name) else {
            return Err(Error::broker(
                ErrorKind::Other,
                format!(
                    "no running subscription named `{name}`; running: {}",
                    self.subscriptions().collect::<Vec<_>>().join(", ")
                ),
            ));
        };
        let r = self.running.remove(i);
        r.token.cancel();
        self.health.remove(name);
        Ok(r)
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
