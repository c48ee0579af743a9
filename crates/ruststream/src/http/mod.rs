//! The HTTP server a service runs beside its subscriptions (feature `http`): one small axum
//! server on tokio, HTTP/1 only, stopped gracefully with the app.
//!
//! What it serves is built by the modules that need it: [`metrics`] (feature `prometheus`)
//! serves `/metrics`, `/healthz` and `/readyz` (`run --metrics-addr`). Every path a module does
//! not route answers 404.

#[cfg(feature = "prometheus")]
pub mod metrics;

use std::net::SocketAddr;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running HTTP server. [`stop`](Self::stop) ends it after the requests in progress; dropping
/// it stops it too.
#[derive(Debug)]
pub struct HttpServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// Binds `addr` (port 0 picks a free port) and serves `router` on the current tokio runtime.
    /// `what` names the server in the error and the log line (`metrics`).
    // Only the metrics endpoint starts one: with `http` alone (no `prometheus`) it is unused.
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) async fn start(
        addr: SocketAddr,
        router: axum::Router,
        what: &'static str,
    ) -> crate::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            crate::ConfigError::new(
                format!("{what} address"),
                format!("cannot serve {what} on it: {e}"),
                "choose a free address",
            )
            .on(addr.to_string())
        })?;
        let addr = listener.local_addr().map_err(|e| {
            crate::Error::broker_from(
                crate::ErrorKind::Other,
                format!("cannot serve {what} on {addr}: {e}"),
                e,
            )
        })?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            // A dropped sender stops the server as a sent stop does.
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!(server = what, error = %e, "the HTTP server stopped");
            }
        });
        tracing::info!(server = what, %addr, "serving HTTP");
        Ok(Self {
            addr,
            stop: Some(stop),
            task,
        })
    }

    /// The address it listens on (with the port it picked, when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets the requests in progress finish, and returns when it has stopped.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}
