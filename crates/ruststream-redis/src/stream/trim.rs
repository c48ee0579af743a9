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

use crate::error::redact;
use crate::lua;

static TRIM_ACKED: LazyLock<Script> =
    LazyLock::new(|| lua::script(include_str!("trim.lua"), &[lua::GUARD]));

/// Runs `trim.lua` on the full key `stream` every `every` until `stop`, counting what it drops
/// in `ruststream_trimmed_total{queue}`. A failure is logged and tried again next period.
pub(super) fn spawn(pool: Pool, stream: String, every: Duration, stop: CancellationToken) {
    let trimmed = metrics::counter!("ruststream_trimmed_total", "queue" => stream.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(every) => {}
            }
            let r: Result<(u64, String), _> = TRIM_ACKED
                .evalsha_with_reload(pool.next(), vec![stream.clone()], Vec::<Value>::new())
                .await;
            match r {
                Ok((n, threshold)) => {
                    trimmed.increment(n);
                    if n > 0 {
                        tracing::debug!(%stream, n, %threshold, "acknowledged entries trimmed");
                    }
                }
                Err(e) => tracing::warn!(%stream, error = %redact(e.details()),
                    "acknowledged entries not trimmed; trying again next period"),
            }
        }
    });
}
