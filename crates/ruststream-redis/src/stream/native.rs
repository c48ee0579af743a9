//! A consumer group's native read (see `crate::claim::native`): `XREADGROUP GROUP g consumer
//! COUNT n STREAMS key >` and `XREVRANGE key + - COUNT 1` (the id to wait from when the group
//! got nothing) in one watched `MULTI`, read into what `read.lua` answers.
//!
//! Commands: those of `crate::claim::native`, with the two reads above.

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::Result;

use super::recover::Group;
use crate::claim::StreamClaimed;
use crate::claim::limit::Held;
use crate::claim::native::{Native, Read, Watched};
use crate::conn::ReadConn;
use crate::reply::{Reply, value_bytes, value_frame};

/// Up to `max` new entries of `g`'s group natively, and whether the read is unsure (it ran
/// while a pause or a cancel was pending); `None` when the script must read.
pub(super) async fn read(
    w: &Watched,
    conn: &ReadConn,
    g: &Group,
    max: usize,
) -> Result<Option<(StreamClaimed, bool)>> {
    let read = Read::Group {
        key: &g.key,
        group: &g.group,
        consumer: &g.consumer,
        count: max,
    };
    let (mut replies, unsure) = match w.read(conn.client(), read).await? {
        Native::Read(r) => (r, false),
        Native::Unsure(r) => (r, true),
        Native::Script => return Ok(None),
    };
    let top = replies.pop();
    let reply = value_frame(replies.pop().unwrap_or(Value::Null));
    let last = matches!(reply, Reply::Null).then(|| last_id(top));
    let read = StreamClaimed {
        held: Held::default(),
        closed: None,
        last,
        reply,
    };
    Ok(Some((read, unsure)))
}

/// The id of the entry in an `XREVRANGE key + - COUNT 1` reply (`0-0` for none).
fn last_id(reply: Option<Value>) -> Bytes {
    let entry = match reply {
        Some(Value::Array(mut entries)) if !entries.is_empty() => entries.swap_remove(0),
        _ => Value::Null,
    };
    let id = match entry {
        Value::Array(mut parts) if !parts.is_empty() => value_bytes(parts.swap_remove(0)),
        _ => None,
    };
    id.unwrap_or_else(|| Bytes::from_static(b"0-0"))
}
