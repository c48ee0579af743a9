//! The settle of transports that have nothing to acknowledge (a simple list popped its entries
//! already; Pub/Sub stores nothing): only dead letters are written, one `LPUSH` of the batch's
//! dead letters onto the dead-letter list. Without a dead-letter list they are discarded with an
//! error log.

use fred::prelude::*;
use futures::future::BoxFuture;
use ruststream_core::{Result, Settlement};

use crate::error::core;
use crate::transport::{Settle, Token};

/// Pushes a batch's dead letters; acknowledges nothing.
pub(crate) struct PushDeadLetters {
    pub(crate) pool: Pool,
    /// The full dead-letter list; `None` when the subscription has none.
    pub(crate) dead: Option<String>,
}

impl Settle for PushDeadLetters {
    fn settle<'a>(&'a self, batch: &'a [(Token, Settlement)]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let dead_letters: Vec<Value> = batch
                .iter()
                .filter_map(|(t, s)| match s {
                    Settlement::Dead { reason } => Some(Value::Bytes(t.dead_frame(reason))),
                    _ => None,
                })
                .collect();
            match &self.dead {
                _ if dead_letters.is_empty() => {}
                Some(dead) => {
                    let _: i64 = self
                        .pool
                        .next()
                        .lpush(dead, dead_letters)
                        .await
                        .map_err(core)?;
                    logged(batch, dead);
                }
                None => {
                    for (t, s) in batch {
                        if let Settlement::Dead { reason } = s {
                            discarded(t, reason);
                        }
                    }
                }
            }
            Ok(())
        })
    }

    fn unsettled(&self) -> String {
        // The entries were popped when claimed: only their dead letters were left to write.
        match &self.dead {
            Some(dead) => format!("nowhere: their dead letters for `{dead}` are not written"),
            None => "nowhere: they were popped when claimed".to_owned(),
        }
    }
}

/// Logs each dead letter of `batch`, once its settle pushed it onto `dead` (the full key).
pub(crate) fn logged(batch: &[(Token, Settlement)], dead: &str) {
    for (t, s) in batch {
        if let Settlement::Dead { reason } = s {
            tracing::warn!(message_id = %t.frame.id, attempt = t.frame.attempt, reason = %reason,
                dead_letter = %dead, "message dead-lettered");
        }
    }
}

/// Logs a dead letter that a subscription without a dead-letter list discards.
pub(crate) fn discarded(t: &Token, reason: &str) {
    tracing::warn!(message_id = %t.frame.id, attempt = t.frame.attempt, reason,
        "no dead-letter list (no_dead_letter): the message is discarded");
}
