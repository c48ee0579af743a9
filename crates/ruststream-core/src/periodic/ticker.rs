//! The tick loop of one periodic job: wait for the next tick on the tokio clock, publish it
//! with its tick as id, record it; retry a failed publish while the catch-up policy allows.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::{CatchUp, Periodic, PeriodicStore, Schedule, Shot};
use crate::{Publisher, Result};

/// The least uniqueness window of a tick: instances' clocks may differ by seconds.
const MIN_WINDOW: Duration = Duration::from_secs(60);
/// The first wait before a failed publish is tried again; it doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(500);
/// The longest wait between two tries of a failed publish.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// One job, ready to run.
pub(crate) struct Ticker {
    job: Periodic,
    schedule: Schedule,
    store: Arc<dyn PeriodicStore>,
    publisher: Publisher,
}

/// Registers `job` in `store` (an error stops the app's start) and returns its loop, which runs
/// until `stop` is cancelled.
pub(crate) async fn spawn(
    job: Periodic,
    schedule: Schedule,
    store: Arc<dyn PeriodicStore>,
    publisher: Publisher,
    stop: CancellationToken,
) -> Result<BoxFuture<'static, ()>> {
    let last = store.register(&job.info(&schedule)).await?;
    let publisher = job.publisher.clone().unwrap_or(publisher);
    tracing::info!(periodic = %job.name, cron = %job.expr, tz = %schedule.tz().name(),
        catch_up = ?job.catch_up, "periodic job ready");
    let ticker = Ticker {
        job,
        schedule,
        store,
        publisher,
    };
    Ok(Box::pin(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = ticker.run(last) => {}
        }
    }))
}

impl Ticker {
    /// Catches up from `last` (the last tick any instance fired), then fires every tick.
    async fn run(&self, last: Option<u64>) {
        let now = self.store.now_ms();
        if let (CatchUp::RunOnce, Some(last)) = (self.job.catch_up, last)
            && let Some(missed) = self.schedule.latest_between(last, now)
        {
            tracing::info!(periodic = %self.job.name, tick = missed, "catching up the latest missed tick");
            self.fire(missed).await;
        }
        // Ticks strictly after `cursor` are still to come.
        let mut cursor = now;
        loop {
            let Some(tick) = self.schedule.next_after(cursor) else {
                tracing::info!(periodic = %self.job.name, "the schedule has no more ticks");
                return;
            };
            self.sleep_until(tick).await;
            cursor = self.fire(self.due(tick)).await;
        }
    }

    /// `tick` once it is due; when the loop fell behind by more than a period (the tick after
    /// it is due too: a stall, a clock jump), the latest due tick instead, whatever the
    /// catch-up policy: the instance was running, and the older ticks are past.
    fn due(&self, tick: u64) -> u64 {
        let now = self.store.now_ms();
        match self.schedule.latest_between(tick, now) {
            Some(latest) => {
                tracing::warn!(periodic = %self.job.name, missed_from = tick, latest,
                    "periodic job fell behind its schedule: firing the latest due tick");
                latest
            }
            None => tick,
        }
    }

    /// Publishes `tick` and records it, trying again after a failure until it is published or
    /// a later tick is due (then the catch-up policy decides: [`CatchUp::Skip`] drops it,
    /// [`CatchUp::RunOnce`] publishes the latest due tick instead). Returns the last tick
    /// handled, from which the loop goes on.
    async fn fire(&self, mut tick: u64) -> u64 {
        let mut wait = FIRST_RETRY;
        loop {
            match self.publish(tick).await {
                Ok(enqueued) => {
                    if enqueued {
                        tracing::debug!(periodic = %self.job.name, tick, "tick published");
                    }
                    if let Err(e) = self.store.fired(&self.job.name, tick).await {
                        tracing::warn!(periodic = %self.job.name, tick, error = %e,
                            "tick published, its record not written (the next tick's will be)");
                    }
                    return tick;
                }
                Err(e) if e.kind() == crate::ErrorKind::Configuration => {
                    // A refusal (a destination that cannot take unique publishes, such as a
                    // Pub/Sub channel) will not heal by trying again: the tick is dropped.
                    tracing::error!(periodic = %self.job.name, tick, error = %e,
                        "periodic publish refused; this tick is dropped: fix the job's destination");
                    return tick;
                }
                Err(e) => {
                    tracing::warn!(periodic = %self.job.name, tick, error = %e,
                        retry_in = ?wait, "periodic publish failed; trying again");
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_RETRY);
            let now = self.store.now_ms();
            if let Some(latest) = self.schedule.latest_between(tick, now) {
                match self.job.catch_up {
                    CatchUp::Skip => {
                        tracing::warn!(periodic = %self.job.name, tick,
                            "a later tick is due: this one is skipped (catch-up: skip)");
                        return latest;
                    }
                    CatchUp::RunOnce => tick = latest,
                }
            }
        }
    }

    /// Publishes `tick`'s message; `true` when it was enqueued (not a duplicate).
    async fn publish(&self, tick: u64) -> Result<bool> {
        let fire = self
            .job
            .fire
            .as_ref()
            .ok_or_else(|| super::no_message(&self.job.name))?;
        let following = self.schedule.next_after(tick).unwrap_or(tick);
        let period = Duration::from_millis(following.saturating_sub(tick));
        let shot = Shot {
            id: format!("{}@{tick}", self.job.name),
            to: self.job.to.clone(),
            window: (period * 2).max(MIN_WINDOW),
            tick: UNIX_EPOCH + Duration::from_millis(tick),
        };
        Ok(fire(self.publisher.clone(), shot).await?.is_enqueued())
    }

    /// Sleeps on the tokio clock until the store's clock reaches `tick`.
    async fn sleep_until(&self, tick: u64) {
        loop {
            let now = self.store.now_ms();
            if now >= tick {
                return;
            }
            tokio::time::sleep(Duration::from_millis(tick - now)).await;
        }
    }
}
