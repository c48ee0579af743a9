//! The handler's side of steps: [`Context::step`], [`Context::step_key`], [`Context::sleep`]
//! and [`Context::sleep_until`].

use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{
    MAX_STEP_BYTES, Replay, StepError, StepRecord, StepStore, StepWrite, WaitTimedOut, Waited,
};
use crate::{ConfigError, Context, Error, Result};

/// The longest error text a failed step records: 4 KiB.
const MAX_FAILURE_BYTES: usize = 4096;

impl Context<'_> {
    /// Runs `run` as the step `name` of this message, once: when the message has a recorded
    /// result for `name` (from an earlier delivery: a retry, a crash recovery, a requeue), that
    /// result is returned and `run` is not called; otherwise `run`'s result is recorded before
    /// this returns. A result is any serde value, recorded as JSON (at most 1 MiB).
    ///
    /// A step whose result was recorded never runs again for this message. A step runs again
    /// only when the process died, or the record's write failed, between its effect and its
    /// record: give an external call [`step_key`](Self::step_key) as its idempotency key.
    ///
    /// # Errors
    /// [`StepError::Failed`] with `run`'s error (no result recorded; the error's text is, as
    /// the field `failed:<name>`, for the operator); [`StepError::Record`] when
    /// the record cannot be read or written, when `name` was used before in this run, or when
    /// the source cannot redeliver (a simple list, Pub/Sub). Either converts with `?` into a
    /// retry of the message.
    ///
    /// ```no_run
    /// use ruststream_core::{Context, HandlerOutcome};
    ///
    /// async fn checkout(ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
    ///     let key = ctx.step_key("charge");
    ///     let receipt: String = ctx
    ///         .step("charge", || async move { Ok::<_, std::io::Error>(format!("paid:{key}")) })
    ///         .await?;
    ///     ctx.step("email", || async { Ok::<_, std::io::Error>(receipt.len()) }).await?;
    ///     Ok(())
    /// }
    /// ```
    pub async fn step<T, E, F, Fut>(&self, name: &str, run: F) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let done = self.run_step(name, run).await;
        let outcome = match &done {
            Ok((_, true)) => "replayed",
            Ok((_, false)) => "run",
            Err(_) => "failed",
        };
        super::meters::step(self.source(), outcome);
        done.map(|(value, _)| value)
    }

    /// [`step`](Self::step)'s work: its value, and whether it was replayed from its record.
    async fn run_step<T, E, F, Fut>(&self, name: &str, run: F) -> Result<(T, bool), StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        if super::reserved(name) {
            return Err(StepError::Record(
                ConfigError::new(
                    "step name",
                    format!(
                        "`{name}` is the record's own: so are `cursor` and the names starting `sleep:`, `wait:`, `signal:`, `failed:` or `t:`"
                    ),
                    "give the step another name",
                )
                .on(self.source())
                .into(),
            ));
        }
        if let Some(json) = self.begin_step(name).await.map_err(StepError::Record)? {
            return crate::job::decode_as(&json, "step record")
                .map(|value| (value, true))
                .map_err(StepError::Record);
        }
        let began = std::time::Instant::now();
        let value = match run().await {
            Ok(value) => value,
            Err(e) => {
                self.record_failure(name, e.to_string(), began.elapsed())
                    .await;
                return Err(StepError::Failed(e));
            }
        };
        let took = began.elapsed();
        let json = crate::job::encode(&value).map_err(StepError::Record)?;
        if json.len() > MAX_STEP_BYTES {
            return Err(StepError::Record(Error::Encode(format!(
                "step `{name}`: its result is {} bytes of JSON, more than a step records ({MAX_STEP_BYTES}); record a reference to it instead",
                json.len()
            ))));
        }
        let write = StepWrite::Timed {
            value: json,
            step: name.to_owned(),
            took,
        };
        self.write_step(name, write)
            .await
            .map_err(StepError::Record)?;
        Ok((value, false))
    }

    /// Records step `name`'s error for the operator (`failed:<name>`, the last one), best
    /// effort: a write that fails is logged, and the step's own error is what the handler gets.
    async fn record_failure(&self, name: &str, mut text: String, took: Duration) {
        if text.len() > MAX_FAILURE_BYTES {
            let mut end = MAX_FAILURE_BYTES;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        let written = match crate::job::encode(&text) {
            Ok(value) => {
                let write = StepWrite::Timed {
                    value,
                    step: name.to_owned(),
                    took,
                };
                self.write_step(&super::failed_field(name), write).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::warn!(message_id = %self.message_id(), step = name, error = %e,
                "the step's failure could not be recorded");
        }
    }

    /// A key stable across every delivery of this message for its step `name`
    /// (`<message id>:<name>`): the idempotency key to give the external call a step makes.
    pub fn step_key(&self, name: &str) -> String {
        format!("{}:{name}", self.message_id())
    }

    /// A durable sleep of `duration`. The first time, the wake-up time is recorded as a step and
    /// this returns [`StepError::Sleeping`]: the handler ends with `?`, the message goes back
    /// delayed (no attempt spent, and not counted against `max_snoozes`), and its worker is
    /// free. Whatever error the handler ends with after a sleep began, the message sleeps. When the message comes back, the handler runs again from the top: the steps before
    /// the sleep replay from their records and the sleep returns `Ok(())` at once.
    ///
    /// # Errors
    /// [`StepError::Sleeping`] the first time; [`StepError::Record`] when the record cannot be
    /// written, or the source cannot redeliver (a simple list, Pub/Sub).
    pub async fn sleep(&self, duration: Duration) -> Result<(), StepError> {
        let name = self.next_sleep();
        let Some(json) = self.begin_step(&name).await.map_err(StepError::Record)? else {
            self.write_step(&name, StepWrite::Sleep(duration))
                .await
                .map_err(StepError::Record)?;
            self.info.steps.sleep(duration);
            super::meters::sleep(self.source());
            return Err(StepError::Sleeping(duration));
        };
        let until: u64 = crate::job::decode_as(&json, "sleep record").map_err(StepError::Record)?;
        // Back early (an operator's requeue): sleep the rest, without a new record.
        match self.server_now_ms() {
            Some(now) if now < until => {
                let left = Duration::from_millis(until - now);
                self.info.steps.sleep(left);
                Err(StepError::Sleeping(left))
            }
            _ => Ok(()),
        }
    }

    /// A durable sleep until `until` (the wall clock of this process); see [`sleep`](Self::sleep).
    ///
    /// # Errors
    /// As [`sleep`](Self::sleep).
    pub async fn sleep_until(&self, until: SystemTime) -> Result<(), StepError> {
        let left = until
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        self.sleep(left).await
    }

    /// Waits for the signal `name` of this message, sent by
    /// [`Publisher::signal`](crate::Publisher::signal) from any process, for at most `timeout`.
    ///
    /// When the signal was sent (before the wait began, or while the message was parked), this
    /// returns `Ok(Ok(payload))`, on every run of the message from then on. Otherwise the wait is
    /// recorded and this returns [`StepError::Waiting`]: the handler ends with `?`, the message
    /// is parked (no attempt spent, and its worker free) until the signal comes or `timeout`
    /// passes. Then the handler runs again from the top: the steps before the wait replay, and
    /// this returns the payload, or `Ok(Err(WaitTimedOut))` when the timeout passed first.
    ///
    /// # Errors
    /// [`StepError::Waiting`] when the message parks; [`StepError::Record`] when the record
    /// cannot be read or written, the payload is not a `T`, the name was used before in this
    /// run, or the source cannot redeliver (a simple list, Pub/Sub).
    pub async fn wait_for<T: DeserializeOwned>(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<Result<T, WaitTimedOut>, StepError> {
        let field = super::wait_field(name);
        let deadline = self.begin_step(&field).await.map_err(StepError::Record)?;
        if let Some(json) = self.recorded(&super::signal_field(name)) {
            return decode_signal(&json, name).map(Ok);
        }
        let until = match deadline {
            Some(json) => {
                crate::job::decode_as::<u64>(&json, "wait record").map_err(StepError::Record)?
            }
            None => {
                let store = self.store().map_err(StepError::Record)?;
                // Marked before the write: a write whose reply is lost may still have landed.
                self.info.steps.mark();
                let waited = store
                    .begin_wait(self.source(), self.message_id(), name, timeout)
                    .await
                    .map_err(StepError::Record)?;
                match waited {
                    Waited::Signalled(json) => return decode_signal(&json, name).map(Ok),
                    Waited::Parked(_) => {
                        self.info.steps.park(name, timeout);
                        return Err(StepError::Waiting(timeout));
                    }
                }
            }
        };
        match self.server_now_ms() {
            // Back before its deadline and without the signal (an operator's requeue): park
            // again for the rest.
            Some(now) if now < until => {
                let left = Duration::from_millis(until - now);
                self.info.steps.park(name, left);
                Err(StepError::Waiting(left))
            }
            _ => Ok(Err(WaitTimedOut)),
        }
    }

    /// Records `cursor` as this message's checkpoint, replacing the last one, before this
    /// returns: a later delivery of the message (a retry, a put-back at a stop, a recovery after
    /// a crash) reads it with [`resume_from`](Self::resume_from) and goes on from there. Record one after each unit of work is done (a page imported): what ran
    /// after the last checkpoint runs again.
    ///
    /// # Errors
    /// [`StepError::Record`] when the cursor does not serialize, is larger than a step records
    /// (1 MiB of JSON), or cannot be written, or the source cannot redeliver.
    pub async fn checkpoint<C: Serialize>(&self, cursor: &C) -> Result<(), StepError> {
        self.load_steps().await.map_err(StepError::Record)?;
        let json = crate::job::encode(cursor).map_err(StepError::Record)?;
        if json.len() > MAX_STEP_BYTES {
            return Err(StepError::Record(Error::Encode(format!(
                "checkpoint: the cursor is {} bytes of JSON, more than a step records ({MAX_STEP_BYTES}); checkpoint a smaller cursor, such as a reference to the data",
                json.len()
            ))));
        }
        self.write_step(super::CURSOR, StepWrite::Result(json))
            .await
            .map_err(StepError::Record)?;
        Ok(())
    }

    /// The last cursor recorded by [`checkpoint`](Self::checkpoint) for this message, on this
    /// delivery or an earlier one; `None` before the first.
    ///
    /// # Errors
    /// [`StepError::Record`] when the record cannot be read, the cursor is not a `C`, or the
    /// source cannot redeliver.
    pub async fn resume_from<C: DeserializeOwned>(&self) -> Result<Option<C>, StepError> {
        self.load_steps().await.map_err(StepError::Record)?;
        self.recorded(super::CURSOR)
            .map(|json| crate::job::decode_as(&json, "checkpoint"))
            .transpose()
            .map_err(StepError::Record)
    }

    /// The name of this run's next sleep: `sleep:<n>`, counted from 1.
    fn next_sleep(&self) -> String {
        let mut replay = self.replay();
        replay.sleeps += 1;
        format!("sleep:{}", replay.sleeps)
    }

    fn replay(&self) -> std::sync::MutexGuard<'_, Replay> {
        self.steps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn store(&self) -> Result<&dyn StepStore> {
        if !self.info.steps.redelivers {
            return Err(ConfigError::new(
                "steps",
                "steps and durable sleeps need a source that redelivers, and this one cannot, so its records would never be replayed",
                "read it as a reliable list (`.reliable()`) or a stream group (`RedisStream::new(..).group(..)`)",
            )
            .on(self.source())
            .into());
        }
        self.publisher().step_store()
    }

    /// Takes `name` for this run and answers its recorded value, reading the record at the
    /// run's first step.
    async fn begin_step(&self, name: &str) -> Result<Option<Bytes>> {
        let store = self.store()?;
        let loaded = {
            let mut replay = self.replay();
            if !replay.seen.insert(name.to_owned()) {
                return Err(ConfigError::new(
                    "step name",
                    format!(
                        "`{name}` is used twice in one run of message {}",
                        self.message_id()
                    ),
                    "give each step its own name",
                )
                .on(self.source())
                .into());
            }
            replay.record.is_some()
        };
        if !loaded {
            self.read_record(store).await.inspect_err(|_| {
                // Not known to be read: the name may be taken again in this run.
                self.replay().seen.remove(name);
            })?;
        }
        Ok(self.recorded(name))
    }

    /// Reads the message's record, unless this run did already.
    async fn load_steps(&self) -> Result<()> {
        let store = self.store()?;
        if self.replay().record.is_none() {
            self.read_record(store).await?;
        }
        Ok(())
    }

    async fn read_record(&self, store: &dyn StepStore) -> Result<()> {
        let record = store.read_steps(self.source(), self.message_id()).await?;
        if !record.steps.is_empty() {
            self.info.steps.mark();
        }
        self.replay().record = Some((record, tokio::time::Instant::now()));
        Ok(())
    }

    fn recorded(&self, name: &str) -> Option<Bytes> {
        let replay = self.replay();
        let (record, _) = replay.record.as_ref()?;
        record.steps.get(name).cloned()
    }

    /// The server's time now, as the record's read told it and this process's clock since.
    fn server_now_ms(&self) -> Option<u64> {
        let replay = self.replay();
        let (StepRecord { now_ms, .. }, at) = replay.record.as_ref()?;
        let since = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
        Some(now_ms.saturating_add(since))
    }

    async fn write_step(&self, name: &str, write: StepWrite) -> Result<Bytes> {
        let store = self.store()?;
        // Marked before the write: a write whose reply is lost may still have landed.
        self.info.steps.mark();
        let written = super::patience::write_patiently(name, || {
            store.write_step(self.source(), self.message_id(), name, write.clone())
        })
        .await?;
        if let Some((record, _)) = self.replay().record.as_mut() {
            record.steps.insert(name.to_owned(), written.clone());
        }
        Ok(written)
    }
}

/// A signal's payload, read as `T`.
fn decode_signal<T: DeserializeOwned>(json: &[u8], name: &str) -> Result<T, StepError> {
    crate::job::decode_as(json, &format!("signal `{name}`")).map_err(StepError::Record)
}
