//! The server's version, read at connect (app start, `check`, the CLI): a server older than
//! [`MINIMUM`] is refused with an error that names it, its version, the minimum and why.
//!
//! Why Redis 7.0: every script declares its flags on its first line (`#!lua flags=allow-oom`),
//! which Redis 7.0 introduced. `allow-oom` lets a settle or a recovery run while Redis is at
//! `maxmemory`, so a full Redis never strands a claimed message. Redis 6.2 cannot load those
//! scripts at all. Valkey reports the Redis version it is compatible with (`redis_version:7.2.4`)
//! beside its own (`valkey_version`), so Valkey 7.2 and later pass.
//!
//! Commands: `INFO server`, once a connect (on a cluster, on one node: the nodes of a cluster
//! run one version).

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use ruststream_core::{Error as CoreError, ErrorKind, Result};

/// The oldest Redis this library runs on, as `major.minor`.
pub(crate) const MINIMUM: &str = "7.0";

/// [`MINIMUM`] as numbers.
const LEAST: (u32, u32) = (7, 0);

/// A server as its `INFO server` reply describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Server {
    /// `Redis`, or the fork's own name (`Valkey`).
    pub(crate) name: String,
    /// The server's own version (Valkey's `valkey_version`, else `redis_version`).
    pub(crate) version: String,
    /// The Redis version it is compatible with (`redis_version`), as `(major, minor)`.
    pub(crate) redis: Option<(u32, u32)>,
}

impl Server {
    /// Reads an `INFO server` reply; `None` when it names no `redis_version`.
    pub(crate) fn parse(info: &str) -> Option<Self> {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let redis_version = field("redis_version")?;
        let (name, version) = match (field("server_name"), field("valkey_version")) {
            (_, Some(v)) => ("Valkey".to_owned(), v),
            (Some(n), None) if !n.eq_ignore_ascii_case("redis") && !n.is_empty() => {
                (n.to_owned(), redis_version)
            }
            _ => ("Redis".to_owned(), redis_version),
        };
        Some(Self {
            name,
            version: version.to_owned(),
            redis: major_minor(redis_version),
        })
    }

    /// Whether it is compatible with Redis `least` (`(major, minor)`) or later.
    pub(crate) fn at_least(&self, least: (u32, u32)) -> bool {
        self.redis.is_some_and(|v| v >= least)
    }
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.name, self.version)
    }
}

/// `(major, minor)` of a version such as `7.0.15`.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

/// Whether the `redis_version:` of an `INFO server` reply is at least `least` (`(major, minor)`).
pub(crate) fn at_least(info: &str, least: (u32, u32)) -> bool {
    Server::parse(info).is_some_and(|s| s.at_least(least))
}

/// Reads the version of `client`'s server (`target` names it) and refuses one older than
/// [`MINIMUM`]. A server that does not answer `INFO`, or whose reply names no version, is let
/// through with a warning: the first script it refuses is then reported by name.
///
/// # Errors
/// [`ErrorKind::Unsupported`] for a server older than [`MINIMUM`].
pub(crate) async fn check(client: &Client, target: &str) -> Result<()> {
    let info: Result<String, _> = client
        .custom(
            CustomCommand::new_static("INFO", ClusterHash::Random, false),
            vec!["server"],
        )
        .await;
    let server = match info.as_deref().map(Server::parse) {
        Ok(Some(server)) => server,
        Ok(None) | Err(_) => {
            tracing::warn!(redis = %target,
                "could not read the server's version (INFO server); RustStream needs Redis {MINIMUM} or newer, or Valkey 7.2 or newer");
            return Ok(());
        }
    };
    refuse_older(&server, target)
}

/// `Err` naming `server`, its version and the minimum when it is older than [`MINIMUM`].
fn refuse_older(server: &Server, target: &str) -> Result<()> {
    if server.at_least(LEAST) {
        return Ok(());
    }
    Err(CoreError::broker(
        ErrorKind::Unsupported,
        format!(
            "the server at {target} runs {server}; RustStream needs Redis {MINIMUM} or newer (or Valkey 7.2 or newer): \
             its scripts declare flags on their first line (`#!lua flags=allow-oom`), which Redis {MINIMUM} introduced, \
             so that a settle runs even when Redis is at maxmemory; upgrade the server"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_read_from_info() {
        let redis = Server::parse("# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n");
        assert_eq!(
            redis,
            Some(Server {
                name: "Redis".into(),
                version: "7.0.15".into(),
                redis: Some((7, 0)),
            })
        );
        let valkey = Server::parse(
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n",
        )
        .expect("valkey");
        assert_eq!(valkey.to_string(), "Valkey 9.1.2");
        assert!(valkey.at_least((7, 2)));
        assert_eq!(Server::parse("no version here"), None);
        assert!(at_least("redis_version:8.0.0", (7, 2)));
        assert!(!at_least("redis_version:7.0.15\r\n", (7, 2)));
        assert!(!at_least("no version here", (7, 2)));
    }

    #[test]
    fn a_server_older_than_the_minimum_is_refused_in_words() {
        let old = Server::parse("redis_version:6.2.14\r\n").expect("6.2");
        let e = refuse_older(&old, "redis://127.0.0.1:6379").expect_err("6.2 is refused");
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        let text = e.to_string();
        for part in ["Redis 6.2.14", "Redis 7.0 or newer", "allow-oom", "upgrade"] {
            assert!(text.contains(part), "{part} missing from: {text}");
        }
        let seven = Server::parse("redis_version:7.0.0\r\n").expect("7.0");
        assert!(refuse_older(&seven, "x").is_ok());
    }
}
