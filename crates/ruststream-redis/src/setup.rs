//! Server settings that lose the library's keys, said at connect (app start and the CLI's
//! `check`): a `maxmemory-policy` other than `noeviction` lets Redis evict queues, claims and
//! windows under memory pressure; a server with neither AOF (`appendonly no`) nor RDB save
//! points (`save ""`) forgets everything on restart, which matters when the app asked for
//! durable publishes. Each is a warning naming the setting and the fix, never an error: a
//! server that refuses `CONFIG` (managed Redis often does) gets a warning that it could not be
//! checked.
//!
//! Commands: `CONFIG GET maxmemory-policy`, and with durability `CONFIG GET appendonly` and
//! `CONFIG GET save` (on a cluster, on one node: the nodes of a cluster are set up alike).

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};

use crate::conn::Connections;

/// Warns of what is wrong with the server `conns` connected to (persistence only when a route
/// asks for durability); nothing on the in-memory model.
pub(crate) async fn at_connect(conns: &Connections) {
    if conns.memory.is_attached() {
        return;
    }
    let Ok(pool) = conns.pool() else { return };
    let durable = conns.routes.any_durable();
    warn(pool.next(), &conns.target(), durable).await;
}

/// One setting's value (`CONFIG GET name`), or `None` when the server refused or has no such
/// setting.
pub(crate) async fn config_get(client: &Client, name: &str) -> Option<String> {
    let reply: Result<Value, _> = client
        .custom(
            CustomCommand::new_static("CONFIG", ClusterHash::Random, false),
            vec!["GET", name],
        )
        .await;
    // RESP2: `[name, value]`; RESP3: `{name: value}`.
    match reply.ok()? {
        Value::Array(mut a) if a.len() == 2 => a.pop()?.into_string(),
        Value::Map(m) => m.inner().into_values().next()?.into_string(),
        _ => None,
    }
}

/// What is wrong with a server's settings for this library, in words with the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Finding {
    /// `maxmemory-policy` is not `noeviction`.
    Evicts(String),
    /// Neither AOF nor RDB save points, and the app asked for durability.
    NoPersistence,
    /// `CONFIG GET` was refused: `what` could not be checked.
    Unchecked(&'static str),
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Evicts(policy) => write!(
                f,
                "redis maxmemory-policy is `{policy}`: under memory pressure Redis may evict queues, in-flight claims and unique windows, losing messages; set `CONFIG SET maxmemory-policy noeviction` (and `maxmemory-policy noeviction` in redis.conf)"
            ),
            Self::NoPersistence => f.write_str(
                "redis has no persistence (appendonly no, no save points): a restart forgets every queue, and durable publishes only survive on replicas; turn on AOF with `CONFIG SET appendonly yes` (and `appendonly yes` in redis.conf)",
            ),
            Self::Unchecked(what) => write!(
                f,
                "could not check redis {what}: the server refused CONFIG GET (managed Redis?); make sure it is set as the README's *Redis settings* says"
            ),
        }
    }
}

/// What [`Finding`]s `client`'s server has; persistence only when `durable`.
pub(crate) async fn findings(client: &Client, durable: bool) -> Vec<Finding> {
    let mut out: Vec<Finding> = eviction(client).await.into_iter().collect();
    if durable {
        out.extend(persistence(client).await);
    }
    out
}

/// Whether the server may evict keys (or cannot be told).
async fn eviction(client: &Client) -> Option<Finding> {
    match config_get(client, "maxmemory-policy").await {
        Some(p) if p == "noeviction" => None,
        Some(p) => Some(Finding::Evicts(p)),
        None => Some(Finding::Unchecked("maxmemory-policy")),
    }
}

/// Whether the server has neither AOF nor save points (or cannot be told).
async fn persistence(client: &Client) -> Option<Finding> {
    let aof = config_get(client, "appendonly").await;
    let save = config_get(client, "save").await;
    match (aof, save) {
        (Some(aof), Some(save)) if aof != "yes" && save.trim().is_empty() => {
            Some(Finding::NoPersistence)
        }
        (Some(_), Some(_)) => None,
        _ => Some(Finding::Unchecked("persistence (appendonly, save)")),
    }
}

/// Warns when `client`'s server has no persistence (or it cannot be told).
pub(crate) async fn warn_persistence(client: &Client, target: &str) {
    if let Some(finding) = persistence(client).await {
        tracing::warn!(redis = %target, "{finding}");
    }
}

/// Logs each of [`findings`] as a warning naming `target`.
pub(crate) async fn warn(client: &Client, target: &str, durable: bool) {
    for finding in findings(client, durable).await {
        tracing::warn!(redis = %target, "{finding}");
    }
}
