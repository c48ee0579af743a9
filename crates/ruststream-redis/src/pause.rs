//! Pausing a subscription from outside: while the key `K.paused` exists, no reader of `K`
//! claims anything (handlers already running finish and settle). The pause lives in Redis, so it
//! holds for every instance of the service and across restarts.
//!
//! The claim itself reads the key: it is a gate of the claim script (`claim/paused.lua`, see
//! `crate::claim`), or, for a reader that reads natively, a watched key whose write makes the
//! read's `EXEC` take nothing (`crate::claim::native`), so once [`pause`] has returned no claim
//! takes an entry, whatever a reader was doing when it came. Each reader's [`Gate`] is what keeps an idle paused reader from
//! claiming again and again: it asks `EXISTS K.paused` when it opens, on every `PUBLISH` on the
//! key (through the broker's shared wake-up subscription), and every [`POLL`] in case a
//! `PUBLISH` was missed; a claim the script held back closes it at once ([`Hold::closed`]).
//!
//! Commands: the operator's [`pause`] sends `SET K.paused <note>` then `PUBLISH K.paused 1`,
//! [`resume`] `DEL K.paused` then `PUBLISH K.paused 0`; the watcher `EXISTS K.paused`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::prelude::*;
use ruststream_core::Result;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::error::core;

/// How often a reader looks at its pause key when no `PUBLISH` told it to: the longest a pause
/// or resume takes to reach a reader that missed its wake-up. Public (as
/// `operate::PAUSE_POLL`) for the integration tests outside this crate, whose negative
/// observations (nothing claimed while paused) wait this long.
pub const POLL: Duration = Duration::from_secs(2);

/// Pause key → the watch of whether it is set: one watcher per key per broker, however many
/// readers of that key the process has (a `PUBLISH` wakes one waiter of a channel).
#[derive(Default)]
pub(crate) struct Pauses(Mutex<HashMap<String, watch::Sender<bool>>>);

/// Whether one subscription may read, kept current by its key's watcher.
pub(crate) struct Gate {
    paused: watch::Receiver<bool>,
    hold: Hold,
    stop: CancellationToken,
}

/// What a reader's claim tells its gate: the claim script found the subscription paused.
#[derive(Clone)]
pub(crate) struct Hold {
    key: String,
    tx: watch::Sender<bool>,
}

impl Hold {
    /// The pause key (full name), the claim's pause gate's key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The claim found the key set: the gate closes until the watcher sees it gone.
    pub(crate) fn closed(&self) {
        if self.tx.send_if_modified(|p| !std::mem::replace(p, true)) {
            tracing::info!(pause_key = %self.key, "subscription paused by an operator");
        }
    }
}

impl Gate {
    /// The gate of a reader of the pause key `key` (full name): it joins the key's watcher, or
    /// reads the key once and starts one (which runs until its last gate is gone). `wake` is
    /// the notifier of `PUBLISH`es on `key`.
    pub(crate) async fn open(
        pauses: &Pauses,
        pool: Pool,
        wake: Arc<Notify>,
        key: String,
        stop: CancellationToken,
    ) -> Result<Self> {
        let joined = pauses
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .filter(|tx| !tx.is_closed())
            .cloned();
        if let Some(tx) = joined {
            return Ok(Self {
                paused: tx.subscribe(),
                hold: Hold { key, tx },
                stop,
            });
        }
        let now = is_paused(&pool, &key).await?;
        if now {
            tracing::warn!(pause_key = %key, "this subscription is paused: it reads nothing until `resume`");
        }
        let (tx, paused) = watch::channel(now);
        pauses
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone(), tx.clone());
        tokio::spawn(watch_key(pool, key.clone(), wake, tx.clone()));
        Ok(Self {
            paused,
            hold: Hold { key, tx },
            stop,
        })
    }

    /// What the reader's claims tell this gate.
    pub(crate) fn hold(&self) -> Hold {
        self.hold.clone()
    }

    /// Whether the subscription may read now.
    pub(crate) fn is_open(&self) -> bool {
        !*self.paused.borrow()
    }

    /// `true` at once when the subscription may read; otherwise waits until it is resumed or
    /// stopped and returns `false` (the caller returns an empty read and is asked again).
    pub(crate) async fn wait_open(&mut self) -> bool {
        if !*self.paused.borrow() {
            return true;
        }
        tokio::select! {
            () = self.stop.cancelled() => {}
            _ = self.paused.wait_for(|p| !*p) => {}
        }
        false
    }
}

/// Keeps `tx` equal to whether `key` exists, until every gate is gone.
async fn watch_key(pool: Pool, key: String, wake: Arc<Notify>, tx: watch::Sender<bool>) {
    loop {
        tokio::select! {
            () = tx.closed() => return,
            () = wake.notified() => {}
            () = tokio::time::sleep(POLL) => {}
        }
        match is_paused(&pool, &key).await {
            Ok(now) => {
                let changed = tx.send_if_modified(|p| std::mem::replace(p, now) != now);
                if changed {
                    let state = if now { "paused" } else { "resumed" };
                    tracing::info!(pause_key = %key, "subscription {state} by an operator");
                }
            }
            Err(e) => tracing::debug!(pause_key = %key, error = %e, "pause key not read"),
        }
    }
}

async fn is_paused(pool: &Pool, key: &str) -> Result<bool> {
    let n: i64 = pool.next().exists(key).await.map_err(core)?;
    Ok(n > 0)
}

/// Pauses every reader of the subscription whose pause key is `key`; `note` (who, when) is
/// what the key holds.
pub(crate) async fn pause(pool: &Pool, key: &str, note: &str) -> Result<()> {
    let client = pool.next();
    let () = client
        .set(key, note, None, None, false)
        .await
        .map_err(core)?;
    let _: i64 = client.publish(key, "1").await.map_err(core)?;
    Ok(())
}

/// Lets the readers of the subscription whose pause key is `key` read again.
pub(crate) async fn resume(pool: &Pool, key: &str) -> Result<()> {
    let client = pool.next();
    let _: i64 = client.del(key).await.map_err(core)?;
    let _: i64 = client.publish(key, "0").await.map_err(core)?;
    Ok(())
}
