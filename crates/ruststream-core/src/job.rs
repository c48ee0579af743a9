//! Job progress and results: a handler reports progress and a result
//! ([`Context::progress`](crate::Context::progress), [`Context::set_result`](crate::Context::set_result)),
//! a producer in another process awaits the result
//! ([`Publishing::await_result`](crate::Publishing::await_result)) or reads it later
//! ([`Publisher::job_state`](crate::Publisher::job_state)).
//!
//! The core keeps nothing itself: a broker stores one record per job, keyed by the message id,
//! through a [`JobStore`] (its [`PublishBackend::jobs`](crate::PublishBackend::jobs)), so the
//! producer and the handlers may be any processes on the same broker. Progress and results travel
//! as JSON.
//!
//! A job's record is final once it holds a result or an error: the first of them stays, later
//! writes (a redelivery after a crash that computes the result again, a resent command) change
//! nothing. When a message published with `await_result` ends in the dead-letter list (dropped,
//! out of attempts, undecodable), the dispatch loop writes the dead letter's reason as the job's
//! error, so the awaiter fails at once with [`Error::JobFailed`];
//! messages nobody awaits (no [`RESULT_HEADER`]) cost nothing there. A retry to come is not a
//! failure.
//!
//! Awaiting polls the record, at intervals growing from [`FIRST_POLL`] to [`MAX_POLL`] (the
//! reasons are in `docs/decisions.md`, "Awaiting polls the record").

use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{ConfigError, Error, Result};

/// The header `await_result` sets on the message it publishes, so that a dead letter of it is
/// written to its job's record. Its value is `1`.
pub const RESULT_HEADER: &str = "rs.result";

/// The first wait between two reads of an awaited job's record.
pub const FIRST_POLL: Duration = Duration::from_millis(2);

/// The longest wait between two reads of an awaited job's record: what a result may be late by.
pub const MAX_POLL: Duration = Duration::from_millis(20);

/// One write to a job's record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobWrite {
    /// The handler's latest progress (JSON); replaces the one before, ignored once final.
    Progress(Bytes),
    /// The handler's result (JSON); makes the record final unless it already is.
    Result(Bytes),
    /// Why the job failed (the dead letter's reason); makes the record final unless it already is.
    Failed(String),
}

/// What a broker stores about one job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobRecord {
    /// The latest progress the handler reported (JSON), if any.
    pub progress: Option<Bytes>,
    /// The result the handler set (JSON), if any.
    pub result: Option<Bytes>,
    /// Why the job failed, if it did.
    pub error: Option<String>,
}

impl JobRecord {
    /// A record of these fields.
    pub fn new(progress: Option<Bytes>, result: Option<Bytes>, error: Option<String>) -> Self {
        Self {
            progress,
            result,
            error,
        }
    }

    /// Whether the job is over: it has a result or an error.
    pub fn is_final(&self) -> bool {
        self.result.is_some() || self.error.is_some()
    }

    /// The progress decoded as `P`, when there is one.
    pub fn progress<P: DeserializeOwned>(&self) -> Result<Option<P>> {
        self.progress.as_deref().map(decode).transpose()
    }

    /// The result decoded as `R`, when there is one.
    pub fn result<R: DeserializeOwned>(&self) -> Result<Option<R>> {
        self.result.as_deref().map(decode).transpose()
    }
}

/// Where a broker keeps job records. The Redis broker keeps each in a hash with a ttl.
pub trait JobStore: Send + Sync {
    /// Applies one write to the record of job `id` (creating it), atomically; a write to a
    /// final record changes nothing and succeeds.
    fn write_job<'a>(&'a self, id: &'a str, write: JobWrite) -> BoxFuture<'a, Result<()>>;

    /// The record of job `id`; `None` when there is none (never written, or expired).
    fn read_job<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<JobRecord>>>;
}

/// The error of a broker that keeps no job records.
pub(crate) fn unsupported() -> Error {
    ConfigError::new(
        "broker",
        "this broker keeps no job progress or results",
        "use a broker that does (RedisBroker)",
    )
    .into()
}

/// Applies `write` to job `id`'s record through `publisher`'s broker.
pub(crate) async fn write(publisher: &crate::Publisher, id: &str, write: JobWrite) -> Result<()> {
    publisher.job_store()?.write_job(id, write).await
}

/// `value` as the JSON a record stores.
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Bytes> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| Error::Encode(e.to_string()))
}

fn decode<T: DeserializeOwned>(json: &[u8]) -> Result<T> {
    decode_as(json, "job record")
}

/// `json` decoded as `T`; the error names `what` was read.
pub(crate) fn decode_as<T: DeserializeOwned>(json: &[u8], what: &str) -> Result<T> {
    serde_json::from_slice(json).map_err(|e| Error::Decode(format!("{what}: {e}")))
}

/// Waits for job `id`'s record to be final, reading it at growing intervals, for at most
/// `timeout`: its result decoded as `R`, [`Error::JobFailed`] with the reason, or
/// [`Error::ResultTimeout`].
pub(crate) async fn wait<R: DeserializeOwned>(
    store: &dyn JobStore,
    id: &str,
    timeout: Duration,
) -> Result<R> {
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    let mut pause = FIRST_POLL;
    loop {
        // A failed read (a connection being re-established) is read again until the deadline.
        let read = store.read_job(id).await;
        match read {
            Ok(Some(JobRecord {
                error: Some(reason),
                ..
            })) if reason == crate::cancel::CANCELLED => {
                return Err(Error::Cancelled { id: id.to_owned() });
            }
            Ok(Some(JobRecord {
                error: Some(reason),
                ..
            })) => {
                return Err(Error::JobFailed {
                    id: id.to_owned(),
                    reason,
                });
            }
            Ok(Some(JobRecord {
                result: Some(result),
                ..
            })) => return decode(&result),
            Ok(_) => {}
            Err(ref e) => tracing::debug!(job = id, error = %e, "reading the job's record failed"),
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(match read {
                Err(e) => e,
                Ok(_) => Error::ResultTimeout {
                    id: id.to_owned(),
                    waited: now - started,
                },
            });
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(MAX_POLL);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::{OutMessage, PublishBackend, Publisher};

    /// A store whose `n`th read (from 0) answers `read(n)`; publishing counts messages.
    struct Fake {
        reads: AtomicUsize,
        read: fn(usize) -> Result<Option<JobRecord>>,
        keeps_jobs: bool,
    }

    impl Fake {
        fn new(read: fn(usize) -> Result<Option<JobRecord>>) -> Self {
            Self {
                reads: AtomicUsize::new(0),
                read,
                keeps_jobs: true,
            }
        }
    }

    impl JobStore for Fake {
        fn write_job<'a>(&'a self, _: &'a str, _: JobWrite) -> BoxFuture<'a, Result<()>> {
            Box::pin(async { Ok(()) })
        }

        fn read_job<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<JobRecord>>> {
            let n = self.reads.fetch_add(1, Ordering::Relaxed);
            let read = (self.read)(n);
            Box::pin(async move { read })
        }
    }

    impl PublishBackend for Fake {
        fn publish(&self, messages: Vec<OutMessage>) -> BoxFuture<'_, Result<usize>> {
            Box::pin(async move { Ok(messages.len()) })
        }

        fn jobs(&self) -> Option<&dyn JobStore> {
            self.keeps_jobs.then_some(self as &dyn JobStore)
        }
    }

    fn done(n: u32) -> Result<Option<JobRecord>> {
        Ok(Some(JobRecord::new(None, Some(encode(&n)?), None)))
    }

    const SHORT: Duration = Duration::from_millis(40);

    #[test]
    fn a_record_decodes_its_fields() {
        let record = JobRecord::new(Some(encode(&3u32).unwrap()), None, None);
        assert_eq!(record.progress::<u32>().unwrap(), Some(3));
        assert_eq!(record.result::<u32>().unwrap(), None);
        assert!(!record.is_final());
        let bad = JobRecord::new(Some(Bytes::from_static(b"not json")), None, None);
        assert!(matches!(bad.progress::<u32>(), Err(Error::Decode(_))));
    }

    #[tokio::test]
    async fn failed_reads_are_read_again_until_the_result_comes() {
        let store = Fake::new(|n| match n {
            0 | 1 => Err(Error::broker(
                crate::ErrorKind::Connection,
                "connection reset",
            )),
            2 => Ok(None),
            _ => done(7),
        });
        assert_eq!(
            wait::<u32>(&store, "j", Duration::from_secs(5))
                .await
                .unwrap(),
            7
        );
        assert_eq!(store.reads.load(Ordering::Relaxed), 4);
    }

    #[tokio::test]
    async fn an_error_in_the_record_fails_the_wait_with_its_reason() {
        let store = Fake::new(|_| Ok(Some(JobRecord::new(None, None, Some("dropped".into())))));
        let e = wait::<u32>(&store, "j", SHORT).await.unwrap_err();
        assert!(
            matches!(e, Error::JobFailed { ref id, ref reason } if id == "j" && reason == "dropped"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn no_record_times_out_naming_the_job_and_a_read_failing_to_the_end_says_why() {
        let e = wait::<u32>(&Fake::new(|_| Ok(None)), "j", SHORT)
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::ResultTimeout { ref id, waited } if id == "j" && waited >= SHORT),
            "{e}"
        );
        let down = Fake::new(|_| Err(Error::broker(crate::ErrorKind::Connection, "down")));
        let e = wait::<u32>(&down, "j", SHORT).await.unwrap_err();
        assert!(
            matches!(e, Error::Broker { kind: crate::ErrorKind::Connection, ref message, .. } if message == "down"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn await_result_is_refused_without_a_store_and_for_many_messages() {
        let payload = Bytes::from_static(b"job");
        let mut fake = Fake::new(|_| done(1));
        fake.keeps_jobs = false;
        let publisher = Publisher::new(Arc::new(fake));
        let publish = publisher.message(&payload).to("k").publish();
        let e = publish.await_result::<u32>(SHORT).await.unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "broker");
        assert!(config.problem.contains("keeps no job"), "{e}");
        let publisher = Publisher::new(Arc::new(Fake::new(|_| done(1))));
        let two = [payload.clone(), payload.clone()];
        let e = publisher
            .messages(&two)
            .to("k")
            .publish()
            .await_result::<u32>(SHORT)
            .await
            .unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "await_result");
        let one = publisher.message(&payload).to("k").publish();
        assert_eq!(one.await_result::<u32>(SHORT).await.unwrap(), 1);
    }
}
