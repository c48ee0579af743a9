//! The metrics server of `run --metrics-addr` (feature `prometheus`): the Prometheus recorder
//! with RustStream's histogram buckets, and the routes an operator's tools scrape and probe.
//!
//! | path | answer |
//! |---|---|
//! | `GET /metrics` | 200, the Prometheus text format of every metric recorded |
//! | `GET /healthz` | 200 `ok` while the process runs (liveness) |
//! | `GET /readyz` | 200 `ready` when every broker is connected and every subscription is reading; 503 with one line for each thing that is not (readiness) |
//! | anything else | 404 |
//!
//! Handler durations and delivery lateness are Prometheus *histograms* (cumulative buckets,
//! which sum across replicas; a summary's quantiles do not): see [`HANDLER_DURATION_BUCKETS`]
//! and [`LATENESS_BUCKETS`].

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use ruststream_core::Health;

use super::HttpServer;

/// Upper bounds (seconds) of the buckets of `ruststream_handler_duration_seconds`: 0.5 ms to
/// one minute, about ×2.5 apart, so p50/p95/p99 are resolved from sub-millisecond handlers to
/// slow ones that call other services.
pub const HANDLER_DURATION_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Upper bounds (seconds) of the buckets of `ruststream_delivery_lateness_seconds` (how long
/// after its due time a delayed message was moved to its queue): 1 ms (the mover's usual
/// lateness is a few milliseconds) to five minutes (a mover that was down).
pub const LATENESS_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// How often the recorder's upkeep (draining histogram samples) runs.
const UPKEEP: Duration = Duration::from_secs(5);

/// A Prometheus builder with RustStream's histogram buckets, for an application that installs
/// the recorder itself (with its own settings added).
pub fn prometheus_builder() -> crate::Result<PrometheusBuilder> {
    let buckets = |b: PrometheusBuilder, name: &str, bounds: &[f64]| {
        b.set_buckets_for_metric(Matcher::Full(name.to_owned()), bounds)
            .map_err(|e| {
                crate::ConfigError::new(
                    "histogram buckets",
                    e.to_string(),
                    "give at least one bucket bound",
                )
                .on(name)
                .into()
            })
    };
    let b = buckets(
        PrometheusBuilder::new(),
        "ruststream_handler_duration_seconds",
        &HANDLER_DURATION_BUCKETS,
    )?;
    buckets(b, "ruststream_delivery_lateness_seconds", &LATENESS_BUCKETS)
}

/// Installs the Prometheus recorder (with [`prometheus_builder`]'s buckets) as the process's
/// `metrics` recorder. Install it before the app starts: metrics registered before it are not
/// recorded. Fails when a recorder is installed already.
pub fn install_recorder() -> crate::Result<PrometheusHandle> {
    prometheus_builder()?.install_recorder().map_err(|e| {
        crate::ConfigError::new(
            "metrics recorder",
            format!("cannot install the Prometheus recorder: {e}"),
            "install one recorder per process, before the app starts",
        )
        .into()
    })
}

/// The metrics server: `/metrics`, `/healthz`, `/readyz` (see the [module docs](self)).
#[derive(Debug)]
pub struct MetricsServer {
    server: HttpServer,
    health: Arc<OnceLock<Health>>,
    /// The upkeep task runs while this is alive.
    _upkeep: Arc<()>,
}

impl MetricsServer {
    /// Serves `prometheus`'s metrics on `addr` (port 0 picks a free port), on the current tokio
    /// runtime. `/readyz` answers 503 until [`watch`](Self::watch) gives it the running app's
    /// health; the recorder's upkeep runs while the server does.
    pub async fn start(addr: SocketAddr, prometheus: PrometheusHandle) -> crate::Result<Self> {
        let health = Arc::new(OnceLock::new());
        let server =
            HttpServer::start(addr, routes(prometheus.clone(), health.clone()), "metrics").await?;
        let upkeep = Arc::new(());
        let alive = Arc::downgrade(&upkeep);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(UPKEEP);
            loop {
                every.tick().await;
                if alive.strong_count() == 0 {
                    break;
                }
                prometheus.run_upkeep();
            }
        });
        Ok(Self {
            server,
            health,
            _upkeep: upkeep,
        })
    }

    /// From now on `/readyz` reports `health` (a running app's, from
    /// [`RunningApp::health`](crate::RunningApp::health)); a second call changes nothing.
    pub fn watch(&self, health: Health) {
        let _ = self.health.set(health);
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Stops the server after the requests in progress.
    pub async fn stop(self) {
        self.server.stop().await;
    }
}

/// The routes of the metrics server; every other path is 404.
fn routes(prometheus: PrometheusHandle, health: Arc<OnceLock<Health>>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let text = prometheus.render();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        text,
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let answer = readiness(health.get());
                async move { answer }
            }),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found: the paths are /metrics, /healthz and /readyz\n",
            )
        })
}

/// `/readyz`'s answer for `health` (`None`: the app has not started yet).
fn readiness(health: Option<&Health>) -> impl IntoResponse + use<> {
    let Some(health) = health else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: starting\n".to_owned(),
        );
    };
    match health.check() {
        Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
        Err(not_ready) => {
            let mut body = String::from("not ready:\n");
            for what in not_ready {
                body.push_str("- ");
                body.push_str(&what);
                body.push('\n');
            }
            (StatusCode::SERVICE_UNAVAILABLE, body)
        }
    }
}
