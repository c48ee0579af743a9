//! Trimming what every consumer group has acknowledged
//! ([`RedisStream::trim_acked`](super::RedisStream::trim_acked)): every period, `trim.lua`
//! (`XINFO GROUPS`, `XPENDING key group` per group with pending entries, `XTRIM key MINID ~ id`)
//! drops the entries below the oldest one any group still needs.
//!
//! Every subscriber instance runs it on its own timer rather than one holding a lock: the script
//! is atomic and idempotent (a second run at once finds nothing below the threshold to drop), it
//! costs one round trip and a few commands per group per period, and a lock would add a key, a
//! lease and a failover story for no gain.

use std::sync::LazyLock;
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use tokio_util::sync::CancellationToken;

use crate::lua::{self, Call};

static TRIM_ACKED: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("trim.lua")));

/// One call of `stream/trim.lua`: trims a stream to what its consumer groups still need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrimAcked<'a> {
    /// The stream (full name).
    pub stream: &'a str,
}

impl Call for TrimAcked<'_> {
    /// The entries trimmed, and the threshold (the lowest id any group needs; empty when the
    /// stream or its groups are absent).
    type Reply = (u64, String);

    fn script(&self) -> &'static Script {
        &TRIM_ACKED
    }

    /// KEYS and ARGV: see `stream/trim.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        (vec![self.stream.to_owned()], Vec::new())
    }

    fn parse(&self, reply: Value) -> (u64, String) {
        let Value::Array(items) = reply else {
            return (0, String::new());
        };
        let threshold = items
            .get(1)
            .and_then(Value::as_str)
            .map(|t| t.into_owned())
            .unwrap_or_default();
        (items.first().map_or(0, lua::reply_u64), threshold)
    }
}

/// Runs `trim.lua` on the full key `stream` every `every` until `stop`, counting what it drops
/// in `ruststream_trimmed_total{queue}`. A failure is logged and tried again next period; one
/// the server refuses for good ends the trims, logged once.
pub(super) fn spawn(pool: Pool, stream: String, every: Duration, stop: CancellationToken) {
    let trimmed = metrics::counter!("ruststream_trimmed_total", "queue" => stream.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(every) => {}
            }
            match (TrimAcked { stream: &stream }).call(pool.next()).await {
                Ok((n, threshold)) => {
                    trimmed.increment(n);
                    if n > 0 {
                        tracing::debug!(%stream, n, %threshold, "acknowledged entries trimmed");
                    }
                }
                Err(e) if e.kind() == ruststream_core::ErrorKind::Unsupported => {
                    tracing::error!(%stream, error = %e,
                        "the server refused the trim of acknowledged entries; they are no longer trimmed");
                    break;
                }
                Err(e) => tracing::warn!(%stream, error = %e,
                    "acknowledged entries not trimmed; trying again next period"),
            }
        }
    });
}
