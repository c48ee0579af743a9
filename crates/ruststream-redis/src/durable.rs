//! Durable publishes on Redis ([`Durability`]): after a group's writes, on the client that sent
//! them, `WAIT replicas timeout` (and, on a server that has it — Redis 7.2 and later — running
//! with `appendonly yes`, `WAITAOF 1 replicas timeout`), in one pipeline; fewer acknowledgements
//! than asked is [`Error::NotDurable`]. A group of plain `LPUSH`es or `XADD`s is sent in that
//! same pipeline (one round trip); a group with scripts (ttl, unique, delayed, a priority
//! level's wake-up) sends them first, and the `WAIT` after their replies.
//!
//! `WAIT` counts the writes of the connection it is sent on, so it goes on the client that
//! wrote (fred's pool hands one client to a group, and a standalone or sentinel client is one
//! connection; on a cluster it goes to the node of the key's slot). A connection fred re-made
//! between the write and the `WAIT` would acknowledge nothing of the write: the connection ids
//! are compared around it, and a change is `NotDurable` with no replica counted.
//!
//! A group whose messages were all duplicates (a retry whose first publish landed) wrote
//! nothing: `SET <key>.durable 1 PX 1000` before the `WAIT` moves its connection past the write
//! that did land (replication is in order), so the retry confirms the first publish's copies.
//!
//! Commands: `WAIT`, `WAITAOF`, that `SET`; once per broker `INFO server` and
//! `CONFIG GET appendonly` to know whether to send `WAITAOF` (a `CONFIG` the server refuses
//! means no `WAITAOF`).

use std::collections::HashMap;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use ruststream_core::{Durability, Error, Result};

use crate::conn::Connections;
use crate::error::core;

/// Whether to send `WAITAOF` to the server of `conns`, found out on the first durable publish
/// (and kept in `conns`); the first call also warns of a server without persistence, unless a
/// durable route had it checked at connect (`crate::setup`).
async fn waitaof(client: &Client, conns: &Connections) -> bool {
    *conns
        .waitaof
        .get_or_init(|| async {
            // The in-memory model has no AOF, nor `CONFIG`.
            if conns.memory.is_attached() {
                return false;
            }
            if !conns.routes.any_durable() {
                crate::setup::warn_persistence(client, &conns.target()).await;
            }
            takes_waitaof(client).await
        })
        .await
}

/// Redis 7.2 or later with `appendonly yes`: `WAITAOF 1 ..` fails on a server without AOF.
async fn takes_waitaof(client: &Client) -> bool {
    let info: Result<String, _> = client
        .custom(
            CustomCommand::new_static("INFO", ClusterHash::Random, false),
            vec!["server"],
        )
        .await;
    let Ok(info) = info else { return false };
    if !crate::version::at_least(&info, (7, 2)) {
        return false;
    }
    crate::setup::config_get(client, "appendonly")
        .await
        .is_some_and(|v| v == "yes")
}

/// The connection ids of `client` (fred's cache of `CLIENT ID`): taken before a durable
/// group's writes and compared after its `WAIT`.
pub(crate) fn connections(client: &Client) -> HashMap<fred::types::config::Server, i64> {
    client.connection_ids()
}

/// A write sent in the same pipeline as the `WAIT`: the command and its arguments.
pub(crate) type Write = (&'static str, Vec<Value>);

/// Sends `writes` (commands on the full key `key`) and then waits, in the same pipeline, for
/// `d`'s replicas to acknowledge them and whatever `client` wrote before (something, unless
/// `wrote` is false); `before` is [`connections`] before the first write.
pub(crate) async fn confirm(
    client: &Client,
    conns: &Connections,
    key: &str,
    d: Durability,
    (wrote, writes): (bool, Vec<Write>),
    before: &HashMap<fred::types::config::Server, i64>,
) -> Result<()> {
    let waitaof = waitaof(client, conns).await;
    let slot = crate::keys::slot_of(key);
    let timeout = d.timeout_ms().to_string();
    let replicas = d.replicas().to_string();
    let pipeline = client.pipeline();
    let mut lead = writes.len();
    for (cmd, args) in writes {
        let () = pipeline
            .custom(CustomCommand::new_static(cmd, slot.clone(), false), args)
            .await
            .map_err(core)?;
    }
    if !wrote && lead == 0 {
        lead = 1;
        let () = pipeline
            .custom(
                CustomCommand::new_static("SET", slot.clone(), false),
                vec![
                    conns.keys.derived(key, ".durable"),
                    "1".into(),
                    "PX".into(),
                    "1000".into(),
                ],
            )
            .await
            .map_err(core)?;
    }
    // Not a blocking command for fred: it goes out in the pipeline, and the server holds the
    // connection until the replicas answer or the timeout.
    let () = pipeline
        .custom(
            CustomCommand::new_static("WAIT", slot.clone(), false),
            vec![replicas.clone(), timeout.clone()],
        )
        .await
        .map_err(core)?;
    if waitaof {
        let () = pipeline
            .custom(
                CustomCommand::new_static("WAITAOF", slot, false),
                vec!["1".to_owned(), replicas, timeout],
            )
            .await
            .map_err(core)?;
    }
    let mut replies: Vec<Value> = pipeline.all().await.map_err(core)?;
    replies.drain(..lead.min(replies.len()));
    let mut acked = count(replies.first());
    if let Some(Value::Array(aof)) = replies.get(1) {
        // `[local, replicas]`: the primary's own fsync, then the replicas that fsynced.
        acked = if count(aof.first()) < 1 {
            0
        } else {
            acked.min(count(aof.get(1)))
        };
    }
    if connections(client) != *before {
        acked = 0;
    }
    if acked < d.replicas() {
        return Err(Error::NotDurable {
            asked: d.replicas(),
            acked,
        });
    }
    Ok(())
}

fn count(v: Option<&Value>) -> u32 {
    match v {
        Some(Value::Integer(n)) => u32::try_from(*n).unwrap_or(0),
        _ => 0,
    }
}
