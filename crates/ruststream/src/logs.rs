//! The log output of [`run_main`](crate::run_main): a `tracing` subscriber writing to stderr,
//! as text (colours only when stderr is a terminal) or as one JSON object a line
//! (`--log-format json`, for log shippers). `RUST_LOG` sets the filter, `info` by default.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines; ANSI colours only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object a line: timestamp, level, target, fields, message.
    Json,
}

/// Installs the subscriber, unless the application installed one: then that one stays and this
/// returns `false`.
pub(crate) fn init(format: LogFormat) -> bool {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init()
            .is_ok(),
        LogFormat::Json => builder.json().try_init().is_ok(),
    }
}
