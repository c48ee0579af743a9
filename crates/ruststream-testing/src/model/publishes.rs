//! What was published: the record behind [`MemoryRedis::pushes`](super::MemoryRedis::pushes)
//! and `TestBroker::published`.
//!
//! **The rule.** A publish is a client putting a new message into the keyspace. Commands note
//! what they add in the state's journal ([`Change`]); after each top-level command, and after
//! each script, the journal is turned into the record:
//!
//! - a top-level `LPUSH`/`RPUSH` (each value), `XADD` (the entry's fields) or `PUBLISH`/
//!   `SPUBLISH` (the message) is a publish;
//! - a script is a publish when it took nothing out of the keyspace: then each value it pushed
//!   onto a list and each stream entry it added is recorded, and a hash value it stored under a
//!   field that it also scored in a sorted set (a delayed entry: payload in a hash, due time in
//!   a sorted set) is recorded as [`Pushed::Scheduled`] under the sorted set. A script that
//!   took something (`LREM`, `LTRIM`, `ZREM`, `HDEL`, `XACK`, ...) moves messages that were
//!   published before: a claim, a settle (retry, dead letter), a move of due entries.
//!   A script's `PUBLISH` is a notice about what it wrote (a delayed set's wake-up), not a
//!   message, and is not recorded.
//!
//! **Why this rule.** The record must keep saying what publishers published, with no knowledge
//! of which scripts exist (the model runs whatever Lua it is sent): the publisher's scripts only
//! add, while every script that moves an existing message first takes it from where it was,
//! which is the difference between a new message and a moved one. Recording outside the model
//! instead (in `TestApp`) is not possible: handlers publish through the broker's own code,
//! whose only way out is the connection the model sits behind.

use bytes::Bytes;

use super::{Pushed, State};

/// One thing a command added, or that a script took something, noted for the record.
#[derive(Debug, Clone)]
pub(crate) enum Change {
    /// Values pushed onto a list, in argument order.
    List { key: Bytes, values: Vec<Bytes> },
    /// An entry added to a stream.
    Stream {
        key: Bytes,
        fields: Vec<(Bytes, Bytes)>,
    },
    /// A message published on a channel.
    Channel { channel: Bytes, message: Bytes },
    /// A hash field set to a value.
    HashField { field: Bytes, value: Bytes },
    /// A sorted-set member added or re-scored.
    Scored { key: Bytes, member: Bytes },
    /// A script ran a command that takes entries out of the keyspace.
    Took,
}

/// Commands that take entries out of the keyspace.
const TAKING: &[&str] = &[
    "DEL",
    "UNLINK",
    "GETDEL",
    "LREM",
    "LTRIM",
    "LPOP",
    "RPOP",
    "LMOVE",
    "RPOPLPUSH",
    "LMPOP",
    "HDEL",
    "ZREM",
    "ZREMRANGEBYSCORE",
    "ZREMRANGEBYRANK",
    "ZREMRANGEBYLEX",
    "ZPOPMIN",
    "ZPOPMAX",
    "ZMPOP",
    "SREM",
    "SPOP",
    "SMOVE",
    "XACK",
    "XDEL",
    "XTRIM",
    "XCLAIM",
    "XAUTOCLAIM",
    "XREADGROUP",
];

/// Notes a command a script is about to run (`name` upper case).
pub(crate) fn note_script_command(st: &mut State, name: &str) {
    if TAKING.contains(&name) {
        st.journal.push(Change::Took);
    }
}

/// Records what the top-level command that just ran published.
pub(crate) fn record_command(st: &mut State) {
    for change in std::mem::take(&mut st.journal) {
        match change {
            Change::List { key, values } => {
                for v in values {
                    st.pushes.push((key.clone(), Pushed::List(v)));
                }
            }
            Change::Stream { key, fields } => st.pushes.push((key, Pushed::Stream(fields))),
            Change::Channel { channel, message } => {
                st.pushes.push((channel, Pushed::Channel(message)));
            }
            Change::HashField { .. } | Change::Scored { .. } | Change::Took => {}
        }
    }
}

/// Records what the script that just ran published (see the module docs).
pub(crate) fn record_script(st: &mut State) {
    let changes = std::mem::take(&mut st.journal);
    if changes.iter().any(|c| matches!(c, Change::Took)) {
        return;
    }
    for change in &changes {
        match change {
            Change::List { key, values } => {
                for v in values {
                    st.pushes.push((key.clone(), Pushed::List(v.clone())));
                }
            }
            Change::Stream { key, fields } => {
                st.pushes
                    .push((key.clone(), Pushed::Stream(fields.clone())));
            }
            Change::Scored { key, member } => {
                let stored = changes.iter().rev().find_map(|c| match c {
                    Change::HashField { field, value } if field == member => Some(value),
                    _ => None,
                });
                if let Some(value) = stored {
                    st.pushes
                        .push((key.clone(), Pushed::Scheduled(value.clone())));
                }
            }
            Change::Channel { .. } | Change::HashField { .. } | Change::Took => {}
        }
    }
}
