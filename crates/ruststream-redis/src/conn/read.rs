//! One subscription's own reading connection ([`ReadConn`]): its blocking reads, their bounds,
//! and the replacement of a client that stopped answering.
//!
//! Commands sent here: `PING` to interrupt a blocking read (fred then sends `CLIENT UNBLOCK`
//! on a side connection), `QUIT` when a client is dropped or replaced.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::Server;
use ruststream_core::{Error as CoreError, ErrorKind, Result};
use tokio::sync::broadcast;

use super::watch;
use crate::error::core;
use crate::memory::MemoryWait;

/// The longest a connection of its own ([`ReadConn::dial`]) may take to connect and log in.
const CONNECT: Duration = Duration::from_secs(5);

/// One subscription's own connection, for blocking reads.
///
/// Every command on it is bounded: a blocking read by its wait plus the command timeout
/// ([`ReadConn::blocking`]), anything else by fred's command timeout (the longest wait plus
/// twice the command timeout). A blocking read past its bound fails, logs one line and marks
/// the connection stale, as does any failed read ([`ReadConn::check`]); the next read first
/// replaces it with a new client ([`ReadConn::heal`]), so a connection that stopped answering
/// (or a client wedged on it) never silences the subscription for good.
pub(crate) struct ReadConn {
    client: Client,
    /// The client in use now, for the health probe (which outlives replacements).
    current: Arc<Mutex<Client>>,
    /// How to build a replacement.
    builder: fred::types::Builder,
    target: String,
    command_timeout: Duration,
    /// Set when a read went past its bound: replace the client before the next read.
    stale: std::sync::atomic::AtomicBool,
    /// Called whenever the connection comes back: fred reconnected, or the client was replaced.
    reconnected: Vec<Reconnected>,
    /// fred's reconnect events of the client in use, read without waiting ([`came_back`]).
    ///
    /// [`came_back`]: Self::came_back
    reconnects: Mutex<broadcast::Receiver<Server>>,
    /// On the in-memory server, what to await before a blocking read.
    memory: Option<MemoryWait>,
}

impl ReadConn {
    /// A reading connection built from `builder` (and rebuilt from it when replaced), to
    /// `target` (for logs), its commands bounded by `command_timeout`.
    pub(super) async fn open(
        builder: fred::types::Builder,
        target: String,
        command_timeout: Duration,
        memory: Option<MemoryWait>,
    ) -> Result<Self, fred::error::Error> {
        let client = Self::connect(&builder, &target, command_timeout).await?;
        Ok(Self {
            reconnects: Mutex::new(client.reconnect_rx()),
            current: Arc::new(Mutex::new(client.clone())),
            client,
            builder,
            target,
            command_timeout,
            stale: std::sync::atomic::AtomicBool::new(false),
            reconnected: Vec::new(),
            memory,
        })
    }

    /// Builds and connects a reader client from `builder`, within `limit`.
    async fn connect(
        builder: &fred::types::Builder,
        target: &str,
        limit: Duration,
    ) -> Result<Client, fred::error::Error> {
        let client = builder.build()?;
        let init = tokio::time::timeout(limit, client.init()).await;
        match init {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                quit_in_background(client);
                return Err(fred::error::Error::new(
                    fred::error::ErrorKind::Timeout,
                    format!("no connection within {limit:?}"),
                ));
            }
        }
        watch(&client, "reader", target.to_owned());
        Ok(client)
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Calls `f` whenever the connection comes back (fred reconnected it) or is replaced
    /// ([`heal`](Self::heal)), for as long as this connection lives.
    pub(crate) fn on_reconnect(&mut self, f: impl Fn() + Send + Sync + 'static) {
        let f: Reconnected = Arc::new(f);
        listen(&self.client, f.clone());
        self.reconnected.push(f);
    }

    /// Whether fred reconnected this connection since the last call. Exact, unlike a listener
    /// of [`on_reconnect`](Self::on_reconnect), which may run late: fred announces a reconnect
    /// before it sends again what it held and before it sends anything new, so a reply that
    /// came on the reconnected connection is seen after the reconnect is.
    pub(crate) fn came_back(&self) -> bool {
        let Ok(mut events) = self.reconnects.lock() else {
            return true;
        };
        let mut back = false;
        loop {
            match events.try_recv() {
                Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => back = true,
                Err(_) => return back,
            }
        }
    }

    /// Whether a sweep on this connection is sent to run when sent or not at all
    /// (`lua::once`): on Redis, not on the in-memory model (`crate::memory`), whose clients fred
    /// never marks connected, so that `fail_fast` would fail every command.
    pub(crate) fn sweeps_once(&self) -> bool {
        self.memory.is_none()
    }

    /// How to open a connection of its own to this one's server (`super::wire`): its
    /// credentials and TLS, a connect bounded by the command timeout and 5 s.
    pub(crate) fn dial(&self) -> super::wire::Dial {
        let timeout = self.command_timeout.min(CONNECT);
        match self.builder.get_config() {
            Some(config) => super::wire::Dial::new(config, timeout),
            None => super::wire::Dial::new(&Config::default(), timeout),
        }
    }

    /// The longest any command on this connection waits for its reply, besides a blocking
    /// read's wait.
    pub(crate) fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// Whether this is a client of the in-memory model (`crate::memory`), not of Redis.
    pub(crate) fn is_memory(&self) -> bool {
        self.memory.is_some()
    }

    /// Whether the connection is up (fred's own state: no I/O).
    pub(crate) fn probe(&self) -> ruststream_core::Probe {
        let current = self.current.clone();
        std::sync::Arc::new(move || current.lock().is_ok_and(|c| c.is_connected()))
    }

    /// Replaces the client when a read went past its bound; a no-op otherwise. Each reader
    /// calls it before it reads.
    pub(crate) async fn heal(&mut self) -> Result<()> {
        if !self.stale.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let fresh = Self::connect(&self.builder, &self.target, self.command_timeout)
            .await
            .map_err(|e| {
                let message = format!(
                    "cannot replace the reading connection to {}: {}",
                    self.target,
                    crate::error::in_words(&e)
                );
                crate::error::core_as(e, message)
            })?;
        for f in &self.reconnected {
            listen(&fresh, f.clone());
            f();
        }
        if let Ok(mut events) = self.reconnects.lock() {
            *events = fresh.reconnect_rx();
        }
        let old = std::mem::replace(&mut self.client, fresh.clone());
        if let Ok(mut current) = self.current.lock() {
            *current = fresh;
        }
        quit_in_background(old);
        self.stale
            .store(false, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(connection = "reader", target = %self.target, "reading connection replaced");
        Ok(())
    }

    /// Passes on the result of a read; after a failed one the connection is replaced before
    /// the next read. fred's state of a connection whose reply never came (a read it still
    /// thinks is blocking, a dead side channel for `CLIENT UNBLOCK`) is not to be trusted, and
    /// a reconnect per failed read is cheap: the subscription backs off between failed reads.
    pub(crate) fn check<T>(&self, read: Result<T>) -> Result<T> {
        if read.is_err() {
            self.stale.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        read
    }

    /// The error of a read that got no reply within `limit`, logged once; marks the connection
    /// stale so the next read replaces it.
    fn no_reply(&self, what: &str, limit: Duration) -> CoreError {
        self.stale.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(connection = "reader", target = %self.target, command = what, limit = ?limit,
            "redis gave no reply in time; replacing the connection and reading again");
        CoreError::broker(
            ErrorKind::Timeout,
            format!("{what}: no reply from {} within {limit:?}", self.target),
        )
    }

    /// Runs the blocking read `read`, which waits up to `wait`. When `interrupt` resolves first,
    /// interrupts the read and still returns what it got. A read that timed out is `Null`; one
    /// that got no reply within `wait` plus the command timeout fails (see [`ReadConn`]).
    pub(crate) async fn blocking(
        &self,
        wait: Duration,
        read: impl Future<Output = Result<Value, fred::error::Error>>,
        interrupt: impl Future<Output = ()>,
    ) -> Result<Value> {
        let limit = wait + self.command_timeout;
        match tokio::time::timeout(limit, self.blocking_unbounded(wait, read, interrupt)).await {
            Ok(r) => r,
            Err(_) => Err(self.no_reply("a blocking read", limit)),
        }
    }

    async fn blocking_unbounded(
        &self,
        wait: Duration,
        read: impl Future<Output = Result<Value, fred::error::Error>>,
        interrupt: impl Future<Output = ()>,
    ) -> Result<Value> {
        // The in-memory server answers a blocking read at once: wait for what would wake it.
        if let Some(memory) = &self.memory {
            tokio::select! {
                () = memory.ready(wait) => {}
                () = interrupt => {}
            }
            return empty_on_timeout(read.await);
        }
        tokio::pin!(read);
        tokio::select! {
            r = &mut read => return empty_on_timeout(r),
            () = interrupt => {}
            // Redis times out a blocked client only when its event loop wakes (every 100 ms at
            // the default `hz 10`), so a short wait would end up to 100 ms late: keep time here.
            () = tokio::time::sleep(wait) => {}
        }
        let client = self.client.clone();
        let ping = async move {
            let _: Result<(), _> = client.ping(None).await;
        };
        let (r, ()) = tokio::join!(read, ping);
        empty_on_timeout(r)
    }
}

impl Drop for ReadConn {
    /// Closes the connection: fred keeps a client connected until it quits, so without this
    /// every stopped subscription would leave a connection (and its task) behind.
    fn drop(&mut self) {
        quit_in_background(self.client.clone());
    }
}

/// What a reader does when its connection comes back.
type Reconnected = Arc<dyn Fn() + Send + Sync>;

/// Calls `f` on every reconnect of `client`.
fn listen(client: &Client, f: Reconnected) {
    let _task = client.on_reconnect(move |_| {
        f();
        async { Ok(()) }
    });
}

/// Sends `QUIT` on `client` from a task of its own, bounded: a client that stopped answering
/// must not keep its task for ever.
fn quit_in_background(client: Client) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), client.quit()).await;
        });
    }
}

/// fred reports a blocking read that timed out (a nil reply) as a `Timeout` error, and one we
/// interrupted as `UNBLOCKED`: both are an empty read, not a failure to back off from.
fn empty_on_timeout(r: Result<Value, fred::error::Error>) -> Result<Value> {
    match r {
        Err(e) if *e.kind() == fred::error::ErrorKind::Timeout => Ok(Value::Null),
        Err(e) if crate::error::kind_of(&e) == ErrorKind::Interrupted => Ok(Value::Null),
        r => r.map_err(core),
    }
}
