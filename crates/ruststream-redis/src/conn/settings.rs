//! What a broker is configured with before it connects: where the servers are (standalone,
//! cluster, sentinel), credentials, TLS, the key prefix and the timeouts. No I/O.

use std::time::Duration;

use ruststream_core::{ConfigError, Result};

use crate::error::redact;

/// Where the servers are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One server (or a primary with replicas the client does not use).
    Standalone,
    /// A Redis Cluster, reached through any of these nodes.
    Cluster(Vec<String>),
    /// A primary found through these sentinels under `service`.
    Sentinel {
        service: String,
        sentinels: Vec<String>,
    },
}

/// What a broker is configured with before it connects.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The standalone URL, or the first node's (credentials, TLS and database come from it).
    pub(crate) url: String,
    pub(crate) topology: Topology,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// PEM file of the CAs to trust for TLS (see `crate::tls`); setting it turns TLS on.
    pub(crate) tls_ca: Option<std::path::PathBuf>,
    pub(crate) prefix: String,
    pub(crate) pool_size: usize,
    pub(crate) scheduling: bool,
    /// The subscriptions' mover schedule, unless a source sets its own.
    pub(crate) schedule: crate::defaults::Schedule,
    /// How long a job's progress and result live after their last write (`crate::results`).
    pub(crate) result_ttl: std::time::Duration,
    /// How long a flow may be publishing before a reader repairs it (`crate::flow`).
    pub(crate) flow_grace: std::time::Duration,
    /// How long a command may go without a reply (`RedisBroker::command_timeout`).
    pub(crate) command_timeout: Duration,
    /// How often each subscription writes its history (`crate::history`); `None`: it keeps none.
    pub(crate) history: Option<Duration>,
}

/// The URL schemes a broker connects with, for errors.
const SCHEMES: &str = "use redis://[user:password@]host:port[/db], or rediss:// for TLS (cluster nodes and sentinels may also be host:port)";

impl Settings {
    /// Checks the scheme of every URL: `redis://` or `rediss://` (cluster nodes and sentinels
    /// may also be bare `host:port`).
    pub(crate) fn check_urls(&self) -> Result<()> {
        let others: &[String] = match &self.topology {
            Topology::Standalone => &[],
            Topology::Cluster(nodes) => nodes,
            Topology::Sentinel { sentinels, .. } => sentinels,
        };
        check_scheme(&self.url, false)?;
        others.iter().try_for_each(|url| check_scheme(url, true))
    }

    pub(crate) fn standalone(url: String) -> Self {
        Self {
            url,
            topology: Topology::Standalone,
            username: None,
            password: None,
            tls_ca: None,
            prefix: String::new(),
            pool_size: 2,
            scheduling: true,
            result_ttl: crate::defaults::DEFAULT_RESULT_TTL,
            flow_grace: crate::defaults::DEFAULT_FLOW_REPAIR_GRACE,
            schedule: crate::defaults::Schedule::default(),
            command_timeout: crate::defaults::DEFAULT_COMMAND_TIMEOUT,
            history: Some(crate::defaults::DEFAULT_HISTORY_EVERY),
        }
    }
}

/// Refuses a URL whose scheme fred would not read as Redis (`http://` would be taken for a
/// plain TCP server); `bare` allows `host:port`.
fn check_scheme(url: &str, bare: bool) -> Result<()> {
    match url.split_once("://") {
        Some(("redis" | "rediss", _)) => Ok(()),
        None if bare => Ok(()),
        Some((scheme, _)) => Err(ConfigError::new(
            "redis url",
            format!("cannot connect: unsupported URL scheme `{scheme}://`"),
            SCHEMES,
        )
        .on(redact(url))
        .into()),
        None => Err(ConfigError::new(
            "redis url",
            "cannot connect: the URL has no scheme",
            SCHEMES,
        )
        .on(redact(url))
        .into()),
    }
}
