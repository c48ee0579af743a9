//! The operator's web dashboard: what `inspect` shows, for every subscription of the app, with
//! charts of each subscription's history (throughput, failures, handler time, depth over the last
//! hour, day or 30 days, as every worker wrote it: `ruststream_redis::history`), every job of a
//! list queue or stream by state (completed too, where results are kept) and a page per job
//! with its story (found by id or by a header), dead letters to
//! requeue and purge, delayed entries to promote and cancel, pause and resume buttons, a form
//! that cancels one message by id, the periodic jobs and fair groups, and, when served beside
//! the running app (`run --dashboard ADDR`), live handled and failed rates. `dashboard [--addr
//! ADDR]` serves it alone, for an operator.
//!
//! | file | what |
//! |---|---|
//! | `page.rs`, `style.css` | the layout, the overview, the forms every change is made by |
//! | `chart.rs` | the history's charts, as inline SVG |
//! | `subscription.rs` | one subscription's page |
//! | `find.rs`, `jobs.rs`, `job_page.rs` | the job lists, the search, one job's page |
//! | `features.rs`, `limits.rs` | periodic jobs, fair groups, rate limits and caps, open flows |
//! | `view.rs` | how payloads and headers show (escaped, cut to a size) |
//! | `guard.rs`, `rates.rs` | who may use it; the live rates |
//!
//! Pages are rendered on the server (`page.rs`); every action is done through the app's own
//! [`Operator`]s (the keys, prefix and hash tags the service uses).
//!
//! **Security** (`guard.rs`): it binds 127.0.0.1:8080 by default; on a loopback address without
//! a token it answers only requests whose `Host` is a loopback name (a guard against DNS
//! rebinding). On any other address it refuses to start without a token (`--token` or
//! `RUSTSTREAM_DASHBOARD_TOKEN`); the operator then logs in once, which sets an `HttpOnly;
//! SameSite=Strict` session cookie (scripts may send `Authorization: Bearer TOKEN`). GET never
//! changes anything; a change is a POST whose form carries a per-process random CSRF token,
//! checked in constant time, and whose `Origin` (or `Referer`), when sent, must be the
//! dashboard's own; pages are sent with `X-Frame-Options: DENY` and a CSP without scripts.
//!
//! ```no_run
//! # async fn demo(app: ruststream::RustStream) -> ruststream::Result<()> {
//! use ruststream::App;
//! let dashboard = ruststream::dashboard::Dashboard::bind(&app, "127.0.0.1:8080".parse().unwrap(), None).await?;
//! let running = app.start().await?;
//! dashboard.spawn_beside(&running);
//! running.wait().await
//! # }
//! ```

mod chart;
mod features;
mod find;
mod guard;
mod job_page;
mod jobs;
mod limits;
mod page;
mod rates;
mod subscription;
mod view;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use ruststream_redis::history::Point;
use ruststream_redis::operate::{Operator, Select};

use self::guard::Guard;
use self::page::{AppLabel, BrokerView, Ctx, Row};
use self::rates::Rates;
use self::subscription::Detail;
use crate::{RunningApp, RustStream};

/// Most dead letters or delayed entries a subscription's page lists.
const LIMIT: usize = 100;

/// A dashboard bound to its address, ready to serve.
pub struct Dashboard {
    listener: tokio::net::TcpListener,
    ops: Vec<Operator>,
    guard: Guard,
    app: AppLabel,
}

/// What every handler shares.
type Shared = Arc<Inner>;

struct Inner {
    ops: Vec<Operator>,
    guard: Guard,
    rates: Option<Rates>,
    app: AppLabel,
}

impl Inner {
    /// What every page of this request shares.
    fn ctx<'a>(&'a self, done: Option<&'a str>) -> Ctx<'a> {
        Ctx {
            csrf: &self.guard.csrf,
            done,
            live: self.rates.is_some(),
            app: &self.app,
        }
    }

    /// A failed request's page.
    fn failure(&self, status: StatusCode, message: &str) -> Response {
        (status, Html(page::error(&self.app, message).into_string())).into_response()
    }
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("addr", &self.listener.local_addr().ok())
            .field("ops", &self.ops)
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// The dashboard of `app`'s Redis subscriptions, bound to `addr`. Fails on an address other
    /// machines can reach when `token` is `None` (or empty), and when `addr` cannot be bound.
    pub async fn bind(
        app: &RustStream,
        addr: SocketAddr,
        token: Option<String>,
    ) -> crate::Result<Self> {
        let guard = Guard::new(addr, token)?;
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            crate::ConfigError::new(
                "dashboard address",
                format!("cannot serve the dashboard on it: {e}"),
                "choose a free address",
            )
            .on(addr.to_string())
        })?;
        let info = crate::App::info(app);
        Ok(Self {
            listener,
            ops: crate::operate::operators(app),
            guard,
            app: AppLabel {
                title: info.title.clone(),
                version: info.version.clone(),
            },
        })
    }

    /// The address it listens on (the port the OS chose when bound to port 0).
    pub fn local_addr(&self) -> crate::Result<SocketAddr> {
        self.listener.local_addr().map_err(|e| {
            crate::Error::broker_from(
                crate::ErrorKind::Other,
                format!("the dashboard's address: {e}"),
                e,
            )
        })
    }

    /// Connects to Redis and serves until `shutdown` completes: the `dashboard` subcommand,
    /// with no app running in this process (so no live rates).
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> crate::Result<()> {
        for op in &self.ops {
            op.connect().await?;
        }
        tracing::info!(addr = ?self.listener.local_addr().ok(), "serving the dashboard");
        self.run(None, shutdown).await
    }

    /// Serves beside `running` (whose connections it shares) on a task of its own, with live
    /// rates from its tallies, until the app is told to stop.
    pub fn spawn_beside(self, running: &RunningApp) -> tokio::task::JoinHandle<()> {
        let stop = running.stop_token();
        let rates = Rates::new(running.tallies());
        tracing::info!(addr = ?self.listener.local_addr().ok(), "serving the dashboard");
        tokio::spawn(async move {
            if let Err(e) = self.run(Some(rates), stop.cancelled_owned()).await {
                tracing::error!(error = %e, "the dashboard stopped");
            }
        })
    }

    async fn run(
        self,
        rates: Option<Rates>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> crate::Result<()> {
        let shared = Arc::new(Inner {
            ops: self.ops,
            guard: self.guard,
            rates,
            app: self.app,
        });
        let router = Router::new()
            .route("/", get(overview))
            .route("/subscription", get(subscription))
            .route("/action", post(act))
            .route("/jobs", get(find::list))
            .route("/job", get(find::one))
            .route("/search", get(find::search))
            .route("/features", get(features::features))
            .route("/login", get(login_page).post(login))
            .route("/favicon.svg", get(favicon))
            .route("/favicon.ico", get(favicon))
            .layer(axum::middleware::from_fn_with_state(
                shared.clone(),
                guard::check,
            ))
            .with_state(shared.clone());
        let server = axum::serve(self.listener, router).with_graceful_shutdown(shutdown);
        let sampler = async {
            match &shared.rates {
                Some(r) => r.run().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = server => r.map_err(|e| {
                crate::Error::broker_from(
                    crate::ErrorKind::Connection,
                    format!("the dashboard's server failed: {e}"),
                    e,
                )
            }),
            () = sampler => Ok(()),
        }
    }
}

/// A query string's or form body's fields.
fn fields(text: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(text).into_owned().collect()
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The dashboard's icon.
async fn favicon() -> Response {
    ([(header::CONTENT_TYPE, "image/svg+xml")], page::FAVICON).into_response()
}

/// Milliseconds since the epoch on this machine's clock (the one the workers write history by).
fn now_ms() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The history of the subscription `name` of `op` (a partition's is its queue's) over `span`.
async fn history_of(
    op: &Operator,
    name: &str,
    span: ruststream_redis::history::Span,
) -> crate::Result<Vec<Point>> {
    let name = op
        .find(name)
        .and_then(|k| k.partition_of.clone())
        .unwrap_or_else(|| name.to_owned());
    op.history(&name, span, now_ms()).await
}

async fn overview(State(s): State<Shared>, uri: Uri) -> Response {
    let query = fields(uri.query().unwrap_or("").as_bytes());
    let span = chart::span_of(field(&query, "span"));
    let mut brokers = Vec::with_capacity(s.ops.len());
    for op in &s.ops {
        let inspections = match op.inspect(None).await {
            Ok(i) => i,
            Err(e) => return s.failure(StatusCode::BAD_GATEWAY, &e.to_string()),
        };
        let mut rows = Vec::with_capacity(inspections.len());
        let mut seen: Vec<String> = Vec::new();
        for i in inspections {
            let rate = s.rates.as_ref().and_then(|r| r.of(&i.keys.name));
            let whose = i.keys.partition_of.clone().unwrap_or(i.keys.name.clone());
            let history = if seen.contains(&whose) {
                Vec::new()
            } else {
                seen.push(whose);
                match history_of(op, &i.keys.name, span).await {
                    Ok(h) => h,
                    Err(e) => return s.failure(StatusCode::BAD_GATEWAY, &e.to_string()),
                }
            };
            rows.push(Row {
                inspection: i,
                rate,
                history,
            });
        }
        brokers.push(BrokerView {
            target: op.target(),
            rows,
        });
    }
    let ctx = s.ctx(field(&query, "done"));
    Html(page::overview(&ctx, span, &brokers).into_string()).into_response()
}

/// The operator of broker `b` (an index in the page) if it has the subscription `name`.
fn find<'a>(
    s: &'a Inner,
    b: Option<&str>,
    name: Option<&str>,
) -> Option<(usize, &'a Operator, String)> {
    let b: usize = b?.parse().ok()?;
    let op = s.ops.get(b)?;
    let name = name?;
    op.find(name)?;
    Some((b, op, name.to_owned()))
}

async fn subscription(State(s): State<Shared>, uri: Uri) -> Response {
    let query = fields(uri.query().unwrap_or("").as_bytes());
    let Some((b, op, name)) = find(&s, field(&query, "b"), field(&query, "name")) else {
        return s.failure(StatusCode::NOT_FOUND, "no such subscription");
    };
    let span = chart::span_of(field(&query, "span"));
    let loaded = async {
        let inspection = op.inspect(Some(&name)).await?.into_iter().next();
        let keys = op.find(&name);
        let dead = match keys.and_then(|k| k.dead.as_ref()) {
            Some(_) => op.dead_letters(&name, LIMIT).await?,
            None => Vec::new(),
        };
        let delayed = match keys.and_then(|k| k.delayed.as_ref()) {
            Some(_) => op.delayed(&name, LIMIT).await?,
            None => Vec::new(),
        };
        let history = history_of(op, &name, span).await?;
        let extra = match &inspection {
            Some(i) => (
                limits::limits_of(op, b, i).await?,
                limits::flows_of(op, b, &name, i.keys.transport).await?,
            ),
            None => (None, None),
        };
        crate::Result::Ok((inspection, dead, delayed, history, extra))
    };
    let (inspection, dead, delayed, history, (limits, flows)) = match loaded.await {
        Ok((Some(i), dead, delayed, history, extra)) => (i, dead, delayed, history, extra),
        Ok((None, ..)) => return s.failure(StatusCode::NOT_FOUND, "no such subscription"),
        Err(e) => return s.failure(StatusCode::BAD_GATEWAY, &crate::Error::to_string(&e)),
    };
    let ctx = s.ctx(field(&query, "done"));
    let detail = Detail {
        b,
        inspection: &inspection,
        dead: &dead,
        delayed: &delayed,
        limit: LIMIT,
        history: &history,
        span,
        live: field(&query, "live") == Some("1"),
        limits: limits.as_ref(),
        flows: flows.as_ref(),
    };
    Html(subscription::subscription(&ctx, &detail).into_string()).into_response()
}

/// A change: `op` (requeue, purge, promote, cancel, pause, resume, cancel-message: one message
/// by id wherever it is) on subscription `name` of
/// broker `b`, entry `id` or every entry; then back to the subscription's page.
async fn act(State(s): State<Shared>, body: Bytes) -> Response {
    let form = fields(&body);
    if !field(&form, "csrf").is_some_and(|t| s.guard.csrf_matches(t)) {
        return guard::refuse(
            StatusCode::FORBIDDEN,
            "missing or wrong CSRF token: changes are made from the dashboard's own forms",
        );
    }
    let Some((b, op, name)) = find(&s, field(&form, "b"), field(&form, "name")) else {
        return s.failure(StatusCode::NOT_FOUND, "no such subscription");
    };
    let select = match field(&form, "id") {
        Some(id) => Select::Id(id.to_owned()),
        None => Select::All { limit: None },
    };
    let verb = field(&form, "op").unwrap_or("");
    let done = match verb {
        "requeue" => op
            .requeue(&name, &select)
            .await
            .map(|n| format!("requeued {n} dead letter(s)")),
        "purge" => op
            .purge(&name, &select)
            .await
            .map(|n| format!("purged {n} dead letter(s)")),
        "promote" => op
            .promote(&name, &select)
            .await
            .map(|n| format!("promoted {n} delayed entr(y/ies)")),
        "cancel" => op
            .cancel(&name, &select)
            .await
            .map(|n| format!("cancelled {n} delayed entr(y/ies)")),
        "pause" => op
            .pause(&name, "paused from the dashboard")
            .await
            .map(|()| "paused".to_owned()),
        "resume" => op.resume(&name).await.map(|()| "resumed".to_owned()),
        "cancel-message" => match field(&form, "id").filter(|id| !id.is_empty()) {
            Some(id) => op
                .cancel_message(&name, id)
                .await
                .map(|outcome| format!("cancel `{id}`: {outcome}")),
            None => return s.failure(StatusCode::BAD_REQUEST, "cancel-message needs an id"),
        },
        _ => return s.failure(StatusCode::BAD_REQUEST, "unknown action"),
    };
    match done {
        Ok(done) => {
            tracing::info!(subscription = %name, action = verb, %done, "dashboard");
            // Back to the job's page the change came from, or to the subscription's; never
            // anywhere else (a form's `back` is only ever a job page of this dashboard).
            let back = field(&form, "back")
                .filter(|b| b.starts_with("/job?"))
                .map_or_else(|| page::subscription_href(b, &name), str::to_owned);
            let done = form_urlencoded::Serializer::new(String::new())
                .append_pair("done", &format!("{name}: {done}"))
                .finish();
            Redirect::to(&format!("{back}&{done}")).into_response()
        }
        Err(e) => s.failure(StatusCode::BAD_GATEWAY, &e.to_string()),
    }
}

async fn login_page(State(s): State<Shared>) -> Response {
    if !s.guard.has_token() {
        return Redirect::to("/").into_response();
    }
    Html(page::login(&s.app, false).into_string()).into_response()
}

async fn login(State(s): State<Shared>, body: Bytes) -> Response {
    let form = fields(&body);
    if !field(&form, "token").is_some_and(|t| s.guard.token_matches(t)) {
        return (
            StatusCode::UNAUTHORIZED,
            Html(page::login(&s.app, true).into_string()),
        )
            .into_response();
    }
    let mut r = Redirect::to("/").into_response();
    if let Ok(v) = s.guard.session_cookie().parse() {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}
