//! Settling a stream subscription, one round trip per batch: plain acks are one
//! `XACK key group id..` (cheaper than the script on both sides); retries and dead letters go
//! through `settle.lua` (`XACK`, then `XADD` and an `XTRIM` when the stream's route bounds it,
//! the delayed set, or `LPUSH` to the dead letters), sent at the same time.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::{Result, Settlement};

use super::recover::Held;
use super::source::StreamKeys;
use crate::dead::{discarded, logged};
use crate::delayed::{DueClock, SCHEDULE_RETRY, retry_arg};
use crate::error::core;
use crate::lua;
use crate::transport::{Settle, Token};

/// Most field/value items a retried entry may have: `settle.lua` hands them to one `XADD` with
/// `unpack`, which Lua bounds (see `guard.lua`'s `MAX_UNPACK`).
const MAX_XADD_FIELDS: usize = 7800;

static SETTLE: LazyLock<Script> = LazyLock::new(|| {
    lua::script(
        include_str!("settle.lua"),
        &[lua::GUARD, SCHEDULE_RETRY, lua::BOUND],
    )
});

/// Settles the entries of one stream subscription.
pub(super) struct StreamSettle {
    pool: Pool,
    /// `settle.lua`'s KEYS.
    keys: Vec<String>,
    group: String,
    /// The stream's bound (`bound.lua`), applied after retries are re-added.
    bound: String,
    has_dead: bool,
    /// The reader's due clock, so a delayed retry is not slept through.
    clock: Option<Arc<DueClock>>,
    /// The entries the reader holds: a settled entry is let go.
    held: Option<Arc<Held>>,
}

impl StreamSettle {
    pub(super) fn new(
        pool: Pool,
        keys: &StreamKeys,
        group: String,
        bound: String,
        clock: Option<Arc<DueClock>>,
        held: Option<Arc<Held>>,
    ) -> Self {
        Self {
            pool,
            keys: vec![
                keys.stream.clone(),
                // Without a dead-letter list the script never writes this key: the stream
                // stands in.
                keys.dead.clone().unwrap_or_else(|| keys.stream.clone()),
                keys.delayed.set.clone(),
                keys.delayed.payloads.clone(),
            ],
            group,
            bound,
            has_dead: keys.dead.is_some(),
            clock,
            held,
        }
    }

    async fn settle(&self, batch: &[(Token, Settlement)]) -> Result<()> {
        let client = self.pool.next();
        let mut args: Vec<Value> = vec![self.group.as_str().into(), self.bound.as_str().into()];
        let mut acks: Vec<Value> = vec![self.keys[0].as_str().into(), self.group.as_str().into()];
        let mut earliest: Option<Duration> = None;
        for (t, s) in batch {
            let id = Value::Bytes(t.raw.clone());
            let retry = match s {
                Settlement::Retry { delay: None } => Some(retry_fields(t)),
                _ => None,
            };
            let dead = match (s, &retry) {
                (_, Some(Err(reason))) => Some(reason.as_str()),
                (Settlement::Dead { reason }, _) => Some(reason.as_str()),
                _ => None,
            };
            if let Some(reason) = dead {
                if self.has_dead {
                    let frame = Value::Bytes(t.dead_frame(reason));
                    args.extend([Value::from_static_str("x"), id, Value::Integer(1), frame]);
                } else {
                    discarded(t, reason);
                    acks.push(id);
                }
                continue;
            }
            match (s, retry) {
                (Settlement::Retry { delay: Some(d) }, _) => {
                    earliest = Some(earliest.map_or(*d, |e| e.min(*d)));
                    args.extend([
                        Value::from_static_str("d"),
                        id,
                        Value::Integer(2),
                        retry_arg(*d, &t.frame.id),
                        Value::Bytes(t.retry_frame()),
                    ]);
                }
                (_, Some(Ok(fields))) => {
                    let n = Value::Integer(i64::try_from(fields.len()).unwrap_or(0));
                    args.extend([Value::from_static_str("r"), id, n]);
                    args.extend(fields);
                }
                _ => acks.push(id),
            }
        }
        let script = async {
            if args.len() == 2 {
                return Ok(());
            }
            let _: i64 = SETTLE
                .evalsha_with_reload(client, self.keys.clone(), args)
                .await?;
            Ok(())
        };
        let xack = async {
            if acks.len() == 2 {
                return Ok(());
            }
            let _: i64 = client.custom(fred::cmd!("XACK"), acks).await?;
            Ok::<(), fred::error::Error>(())
        };
        let (script, xack) = tokio::join!(script, xack);
        // Sent: the entries are no longer this consumer's to keep alive, whatever came of it.
        if let Some(held) = &self.held {
            held.release(batch.iter().map(|(t, _)| &t.raw));
        }
        script.and(xack).map_err(core)?;
        if self.has_dead {
            logged(batch, &self.keys[1]);
        }
        if let (Some(clock), Some(d)) = (&self.clock, earliest) {
            clock.retry_in(d);
        }
        Ok(())
    }
}

/// The fields of the entry a retry re-adds, or why it cannot be re-added.
fn retry_fields(t: &Token) -> std::result::Result<Vec<Value>, String> {
    let f = &t.frame;
    let fields = super::fields(
        &f.id,
        f.attempt.saturating_add(1),
        &f.headers,
        f.payload.clone(),
    );
    if fields.len() > MAX_XADD_FIELDS {
        // A script cannot pass that many values to one XADD.
        let reason = format!(
            "too-many-headers: {} stream fields, more than one XADD can take ({MAX_XADD_FIELDS})",
            fields.len()
        );
        tracing::warn!(message_id = %f.id, %reason, "retry not possible: to the dead-letter list");
        return Err(reason);
    }
    Ok(fields)
}

impl Settle for StreamSettle {
    fn settle<'a>(&'a self, batch: &'a [(Token, Settlement)]) -> BoxFuture<'a, Result<()>> {
        Box::pin(StreamSettle::settle(self, batch))
    }

    fn unsettled(&self) -> String {
        let (stream, group) = (&self.keys[0], &self.group);
        if self.held.is_some() {
            format!("pending in group `{group}` of `{stream}` and come back after min_idle")
        } else {
            format!(
                "pending in group `{group}` of `{stream}`: this stream has no recovery (no_recovery); claim them by hand (XCLAIM)"
            )
        }
    }
}
