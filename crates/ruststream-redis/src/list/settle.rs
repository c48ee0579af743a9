//! Settling a reliable list: one `settle.lua` call per batch (ack `LREM`, retry `LPUSH` onto the
//! entry's priority level, retry later `ZADD`+`HSET` into the delayed set, dead `LPUSH K.dead`;
//! with recovery, each only while the claim's member is still in the recovery set, which it
//! leaves with `ZREM`).
//!
//! Acks as pipelined `LREM`s would cost the client (fred, per command) twice what the script
//! costs Redis, so they stay in the script.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::{Result, Settlement};

use super::lease::Leases;
use super::source::ListKeys;
use crate::dead::{discarded, logged};
use crate::delayed::{DueClock, SCHEDULE_RETRY, retry_arg};
use crate::error::core;
use crate::lua;
use crate::transport::{Settle, Token};

static SETTLE: LazyLock<Script> = LazyLock::new(|| {
    lua::script(
        include_str!("settle.lua"),
        &[lua::GUARD, SCHEDULE_RETRY, crate::frame::LUA, lua::LEVELS],
    )
});

/// Settles the entries of one reliable list.
pub(super) struct ReliableSettle {
    pool: Pool,
    /// `settle.lua`'s KEYS.
    keys: Vec<String>,
    /// Without recovery, the reader's id: a settle's token is `<reader id>:<its first claim>`,
    /// the same when the settle is sent again, and no other settle's.
    token_prefix: Option<String>,
    has_dead: bool,
    /// The reader's due clock, so a delayed retry is not slept through.
    clock: Option<Arc<DueClock>>,
    /// The claims the reader holds: a settled claim is let go.
    leases: Arc<Leases>,
}

impl ReliableSettle {
    pub(super) fn new(
        pool: Pool,
        keys: &ListKeys,
        reader_id: &str,
        clock: Option<Arc<DueClock>>,
        leases: Arc<Leases>,
    ) -> Self {
        let processing = keys.processing.clone().unwrap_or_default();
        let mut script_keys = vec![
            keys.queue.clone(),
            processing,
            // Without a dead-letter list the script never writes this key: the queue stands in.
            keys.dead.clone().unwrap_or_else(|| keys.queue.clone()),
            keys.delayed.set.clone(),
            keys.delayed.payloads.clone(),
        ];
        script_keys.extend(keys.recovery.clone().or_else(|| keys.settle_tokens.clone()));
        script_keys.extend(keys.levels.iter().cloned());
        Self {
            pool,
            keys: script_keys,
            token_prefix: keys.recovery.is_none().then(|| reader_id.to_owned()),
            has_dead: keys.dead.is_some(),
            clock,
            leases,
        }
    }

    async fn settle(&self, batch: &[(Token, Settlement)]) -> Result<()> {
        let mut args = Vec::with_capacity(batch.len() * 5 + 1);
        let token = match (
            &self.token_prefix,
            batch.iter().filter_map(|(t, _)| t.claim).min(),
        ) {
            (Some(prefix), Some(first)) => Value::from(format!("{prefix}:{first}")),
            _ => Value::from_static_str(""),
        };
        args.push(token);
        let mut earliest: Option<Duration> = None;
        for (t, s) in batch {
            let (op, new, arg) = match s {
                Settlement::Ack => ("a", Bytes::new(), Value::from_static_str("")),
                Settlement::Dead { reason } if !self.has_dead => {
                    discarded(t, reason);
                    ("a", Bytes::new(), Value::from_static_str(""))
                }
                Settlement::Dead { reason } => {
                    ("x", t.dead_frame(reason), Value::from_static_str(""))
                }
                Settlement::Retry { delay: None } => {
                    ("r", t.retry_frame(), Value::from_static_str(""))
                }
                Settlement::Retry { delay: Some(d) } => {
                    earliest = Some(earliest.map_or(*d, |e| e.min(*d)));
                    ("d", t.retry_frame(), retry_arg(*d, &t.frame.id))
                }
            };
            args.extend([
                Value::from_static_str(op),
                Value::Bytes(t.raw.clone()),
                Value::Bytes(new),
                arg,
                t.member
                    .clone()
                    .map_or_else(|| Value::from_static_str(""), Value::Bytes),
            ]);
        }
        let settled: Result<i64, _> = SETTLE
            .evalsha_with_reload(self.pool.next(), self.keys.clone(), args)
            .await;
        // Sent: the claims are no longer this worker's to keep alive, whatever came of it (a
        // settle that keeps failing leaves them to the sweep).
        self.leases
            .release(batch.iter().filter_map(|(t, _)| t.claim));
        settled.map_err(core)?;
        if self.has_dead {
            logged(batch, &self.keys[2]);
        }
        if let (Some(clock), Some(d)) = (&self.clock, earliest) {
            clock.retry_in(d);
        }
        Ok(())
    }
}

impl Settle for ReliableSettle {
    fn settle<'a>(&'a self, batch: &'a [(Token, Settlement)]) -> BoxFuture<'a, Result<()>> {
        Box::pin(ReliableSettle::settle(self, batch))
    }

    fn unsettled(&self) -> String {
        let processing = &self.keys[1];
        if self.token_prefix.is_none() {
            format!("in `{processing}` and come back after min_idle")
        } else {
            format!(
                "in `{processing}`: this list has no recovery (no_recovery); move them back by hand (LMOVE) once no worker holds them"
            )
        }
    }
}
