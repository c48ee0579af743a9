//! The command line every RustStream service gets from [`run_main`]: `run` (the default),
//! `check`, and `asyncapi [-o FILE] [--yaml]`; `--help` and `-V` name the app (its
//! [`AppInfo`](crate::AppInfo)), `--log-format text|json` sets the log output (see `logs`).

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
    },
    /// Validate every subscription and connect, then exit: 0 when all is well.
    Check,
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
        });
        match command {
            Command::Run {
                #[cfg(feature = "prometheus")]
                metrics_addr,
            } => {
                #[cfg(feature = "prometheus")]
                if let Some(addr) = metrics_addr {
                    return run_serving_metrics(app, addr).await;
                }
                run(app).await
            }
            Command::Check => {
                app.check().await?;
                println!("ok: every subscription is valid and the brokers answer");
                Ok(())
            }
            Command::Asyncapi { output, yaml } => {
                let doc = crate::asyncapi::document(&app.into_rust_stream());
                let format = if yaml { Format::Yaml } else { Format::Json };
                let text = render(&doc, format)?;
                match output {
                    Some(path) => std::fs::write(&path, text).map_err(|e| {
                        crate::Error::config(format!("cannot write {}: {e}", path.display()))
                    }),
                    None => {
                        print!("{text}");
                        Ok(())
                    }
                }
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
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

/// `run --metrics-addr`: installs the recorder and binds the metrics server before the app
/// starts (so a busy port fails at once and `/healthz` answers during startup), then runs the
/// app with `/readyz` watching it; the server stops after the app.
#[cfg(feature = "prometheus")]
async fn run_serving_metrics<A: App>(app: A, addr: std::net::SocketAddr) -> crate::Result<()> {
    use crate::http::metrics::{MetricsServer, install_recorder};
    let server = MetricsServer::start(addr, install_recorder()?).await?;
    let result = run_watched(app, |health| server.watch(health)).await;
    server.stop().await;
    result
}

async fn run<A: App>(app: A) -> crate::Result<()> {
    run_watched(app, |_| {}).await
}

/// Starts `app`, hands its health to `watch`, and runs it until a signal.
async fn run_watched<A: App>(app: A, watch: impl FnOnce(crate::Health)) -> crate::Result<()> {
    let running = app.start().await?;
    watch(running.health());
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
