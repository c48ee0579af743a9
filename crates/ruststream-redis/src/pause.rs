//! Pausing a subscription from outside: while the key `K.paused` exists, no reader of `K`
//! claims anything (handlers already running finish and settle). The pause lives in Redis, so it
//! holds for every instance of the service and across restarts.
//!
//! Commands: the operator's [`pause`] sends `SET K.paused <note>` then `PUBLISH K.paused 1`,
//! [`resume`] `DEL K.paused` then `PUBLISH K.paused 0`. Each reader's [`Gate`] asks
//! `EXISTS K.paused` when it opens, on every such `PUBLISH` (through the broker's shared
//! wake-up subscription), and every [`POLL`] in case a `PUBLISH` was missed. A reader blocked in
//! a read when the pause comes finishes that read first: the pause takes hold within one read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::prelude::*;
use ruststream_core::Result;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::error::core;

/// How often a reader looks at its pause key when no `PUBLISH` told it to.
pub const POLL: Duration = Duration::from_secs(2);

/// Pause key → the watch of whether it is set: one watcher per key per broker, however many
/// readers of that key the process has (a `PUBLISH` wakes one waiter of a channel).
#[derive(Default)]
pub(crate) struct Pauses(Mutex<HashMap<String, watch::Sender<bool>>>);

/// Whether one subscription may read, kept current by its key's watcher.
pub(crate) struct Gate {
    paused: watch::Receiver<bool>,
    stop: CancellationToken,
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
            .map(watch::Sender::subscribe);
        if let Some(paused) = joined {
            return Ok(Self { paused, stop });
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
        tokio::spawn(watch_key(pool, key, wake, tx));
        Ok(Self { paused, stop })
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
