//! The command line every RustStream service gets from [`run_main`]: `run` (the default),
//! `check`, `asyncapi [-o FILE] [--yaml]`, `dashboard [--addr ADDR] [--token TOKEN]`, and the
//! operator's `inspect`, `dead`, `delayed`, `pause`, `resume` and `cancel` (see [`operate`](crate::operate));
//! `--help` and `-V` name the app (its [`AppInfo`](crate::AppInfo)), `--log-format text|json` sets
//! the log output (see `logs`).

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::App;
use crate::logs::LogFormat;

#[derive(Parser)]
#[command(about = "A RustStream service", version)]
struct Cli {
    /// How log lines are written to stderr: `text`, or one JSON object a line for log shippers.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

impl Cli {
    /// Parses `args` with the app's name, version and description in `--help` and `-V`; on a
    /// parse error, `--help` or `-V`, prints what clap says and exits.
    fn parse_for(info: &crate::AppInfo, args: impl IntoIterator<Item = OsString>) -> Self {
        let about = info
            .description
            .clone()
            .unwrap_or_else(|| format!("{}: a RustStream service", info.title));
        let command = Cli::command()
            .name(info.title.clone())
            .version(info.version.clone())
            .about(about);
        let matches = command.get_matches_from(args);
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

#[derive(Subcommand)]
enum Command {
    /// Connect and handle messages until SIGINT or SIGTERM (the default).
    Run {
        /// Serve /metrics (Prometheus), /healthz and /readyz on this address (e.g. 0.0.0.0:9000).
        #[cfg(feature = "prometheus")]
        #[arg(long, value_name = "ADDR")]
        metrics_addr: Option<std::net::SocketAddr>,
        /// Serve the web dashboard, with live rates, on this address (e.g. 127.0.0.1:8080).
        #[cfg(feature = "dashboard")]
        #[arg(long, value_name = "ADDR")]
        dashboard: Option<std::net::SocketAddr>,
        /// The dashboard's token, required on a non-loopback address.
        #[cfg(feature = "dashboard")]
        #[arg(
            long,
            value_name = "TOKEN",
            env = "RUSTSTREAM_DASHBOARD_TOKEN",
            hide_env_values = true
        )]
        dashboard_token: Option<String>,
    },
    /// Serve the web dashboard of the service's queues, without running its handlers.
    #[cfg(feature = "dashboard")]
    Dashboard {
        /// The address to serve on.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
        addr: std::net::SocketAddr,
        /// The token operators log in with, required on a non-loopback address.
        #[arg(
            long,
            value_name = "TOKEN",
            env = "RUSTSTREAM_DASHBOARD_TOKEN",
            hide_env_values = true
        )]
        token: Option<String>,
    },
    /// Validate every subscription and connect, then exit: 0 when all is well.
    Check,
    /// Operator commands on the app's subscriptions (see `ruststream::operate`).
    #[command(flatten)]
    Operate(crate::operate::Operate),
    /// Print the AsyncAPI 3.0 document of the service (JSON, or YAML with --yaml).
    Asyncapi {
        /// Write to this file instead of standard output.
        #[arg(short, long)]
        output: Option<std::path::PathBuf>,
        /// Write YAML instead of JSON.
        #[arg(long)]
        yaml: bool,
    },
}

/// Runs a service: builds the app, parses the command line, installs a `tracing` subscriber
/// (stderr, text or `--log-format json`, `RUST_LOG` honoured, `info` by default) unless one is
/// installed, and runs the command. A failure is printed once, as an error log line (or on
/// stderr when the application installed its own subscriber), and the exit code is 1.
///
/// ```no_run
/// use ruststream::prelude::*;
/// fn app() -> impl App {
///     RustStream::new(AppInfo::new("images", "0.1.0"))
///         .with_broker(RedisBroker::from_env(), |_b| {})
/// }
/// fn main() -> std::process::ExitCode {
///     run_main(app)
/// }
/// ```
pub fn run_main<A: App>(app: impl FnOnce() -> A) -> ExitCode {
    run_main_from(std::env::args_os(), app)
}

/// [`run_main`] with the command line given as `args` (the first one is the program's name),
/// for services that build their arguments themselves, and for tests.
pub fn run_main_from<A: App>(
    args: impl IntoIterator<Item = impl Into<OsString>>,
    app: impl FnOnce() -> A,
) -> ExitCode {
    let app = app();
    let cli = Cli::parse_for(app.info(), args.into_iter().map(Into::into));
    let logging = crate::logs::init(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let command = cli.command.unwrap_or(Command::Run {
            #[cfg(feature = "prometheus")]
            metrics_addr: None,
            #[cfg(feature = "dashboard")]
            dashboard: None,
            #[cfg(feature = "dashboard")]
            dashboard_token: None,
        });
        match command {
            Command::Run {
                #[cfg(feature = "prometheus")]
                metrics_addr,
                #[cfg(feature = "dashboard")]
                dashboard,
                #[cfg(feature = "dashboard")]
                dashboard_token,
            } => {
                let serve = Serve {
                    #[cfg(feature = "prometheus")]
                    metrics: metrics_addr,
                    #[cfg(feature = "dashboard")]
                    dashboard: dashboard.map(|addr| (addr, dashboard_token)),
                };
                run(app.into_rust_stream(), serve)
                    .await
                    .map(|()| ExitCode::SUCCESS)
            }
            #[cfg(feature = "dashboard")]
            Command::Dashboard { addr, token } => {
                let app = app.into_rust_stream();
                crate::dashboard::Dashboard::bind(&app, addr, token)
                    .await?
                    .serve(wait_for_signal())
                    .await
                    .map(|()| ExitCode::SUCCESS)
            }
            Command::Check => {
                app.check().await?;
                println!("ok: every subscription is valid and the brokers answer");
                Ok(ExitCode::SUCCESS)
            }
            Command::Operate(command) => crate::operate::run(app.into_rust_stream(), command).await,
            Command::Asyncapi { output, yaml } => {
                let doc = crate::asyncapi::document(&app.into_rust_stream());
                let format = if yaml { Format::Yaml } else { Format::Json };
                let text = render(&doc, format)?;
                match output {
                    Some(path) => std::fs::write(&path, text).map_err(|e| {
                        crate::ConfigError::new(
                            "--output",
                            format!("cannot write it: {e}"),
                            "give a path in a folder this process may write to",
                        )
                        .on(path.display().to_string())
                        .into()
                    }),
                    None => {
                        print!("{text}");
                        Ok(())
                    }
                }
                .map(|()| ExitCode::SUCCESS)
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            if logging {
                tracing::error!("{e}");
            } else {
                eprintln!("error: {e}");
            }
            ExitCode::FAILURE
        }
    }
}

/// How `asyncapi` writes the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Pretty-printed JSON.
    Json,
    /// YAML (strings that a YAML 1.1 reader would take for booleans or numbers are quoted).
    Yaml,
}

/// Renders a document (e.g. [`asyncapi::document`](crate::asyncapi::document)) as text ending in
/// a newline.
pub fn render(doc: &serde_json::Value, format: Format) -> crate::Result<String> {
    let mut text = match format {
        Format::Json => {
            serde_json::to_string_pretty(doc).map_err(|e| crate::Error::Encode(e.to_string()))?
        }
        Format::Yaml => {
            serde_saphyr::to_string(doc).map_err(|e| crate::Error::Encode(e.to_string()))?
        }
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

/// What `run` serves beside the app.
struct Serve {
    /// `--metrics-addr`.
    #[cfg(feature = "prometheus")]
    metrics: Option<std::net::SocketAddr>,
    /// `--dashboard` and its token.
    #[cfg(feature = "dashboard")]
    dashboard: Option<(std::net::SocketAddr, Option<String>)>,
}

/// `run`: binds the metrics server (installing the recorder) and the dashboard before the app
/// starts, so a busy port or a bad address fails at once and `/healthz` answers during startup;
/// then runs the app until a signal, `/readyz` watching it; the metrics server stops after it.
#[cfg_attr(
    not(any(feature = "prometheus", feature = "dashboard")),
    allow(unused_variables)
)]
async fn run(app: crate::RustStream, serve: Serve) -> crate::Result<()> {
    #[cfg(feature = "prometheus")]
    let metrics = match serve.metrics {
        Some(addr) => {
            use crate::http::metrics::{MetricsServer, install_recorder};
            Some(MetricsServer::start(addr, install_recorder()?).await?)
        }
        None => None,
    };
    #[cfg(feature = "dashboard")]
    let dashboard = match serve.dashboard {
        Some((addr, token)) => Some(crate::dashboard::Dashboard::bind(&app, addr, token).await?),
        None => None,
    };
    let running = app.start().await?;
    #[cfg(feature = "prometheus")]
    if let Some(m) = &metrics {
        m.watch(running.health());
    }
    #[cfg(feature = "dashboard")]
    if let Some(d) = dashboard {
        d.spawn_beside(&running);
    }
    let result = serve_until_signal(running).await;
    #[cfg(feature = "prometheus")]
    if let Some(m) = metrics {
        m.stop().await;
    }
    result
}

async fn serve_until_signal(running: crate::RunningApp) -> crate::Result<()> {
    let stop = running.stop_token();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received: shutting down");
        stop.cancel();
    });
    running.wait().await
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
