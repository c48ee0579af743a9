//! Job progress and results (the core's [`JobStore`], see `ruststream_core::job`): one hash per
//! job, `<prefix>ruststream:job:{<id>}` (the id is the hash tag, so on a cluster each job's key
//! lives in a slot of its own and every command touches one key), with the fields `progress`,
//! `result` or `error`, and `state` (`running`, `done`, `failed`).
//!
//! Commands: writes are `job.lua` (`HGET` of the state, `HSET`, `PEXPIRE` with the broker's
//! [`result_ttl`](crate::RedisBroker::result_ttl), atomically; a final record is never
//! changed); reads are one `HMGET key progress result error`.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::{Error, JobRecord, JobStore, JobWrite, Result};

use crate::error::core;
use crate::lua::{self, Call};
use crate::publisher::RedisPublisher;

static JOB: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("job.lua")));

/// Which field of a job's record a write sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// The handler's latest progress (`progress`; the state becomes `running`).
    Progress,
    /// The handler's result (`result`; the state becomes `done`, final).
    Result,
    /// Why the job failed (`error`; the state becomes `failed`, final).
    Failed,
}

/// One call of `job.lua`: one write to a job's record, and its expiry.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteJob<'a> {
    /// The job's hash (full name).
    pub key: &'a str,
    /// Which field it writes.
    pub kind: JobKind,
    /// The value (JSON, or the failure's reason).
    pub value: &'a Bytes,
    /// The record's ttl (whole milliseconds, at least one).
    pub ttl: Duration,
}

impl Call for WriteJob<'_> {
    /// Whether it wrote (`false`: the record was final already).
    type Reply = bool;

    fn script(&self) -> &'static Script {
        &JOB
    }

    /// KEYS and ARGV: see `job.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let kind = match self.kind {
            JobKind::Progress => "progress",
            JobKind::Result => "result",
            JobKind::Failed => "failed",
        };
        (
            vec![self.key.to_owned()],
            vec![
                Value::from_static_str(kind),
                Value::Bytes(self.value.clone()),
                Value::Integer(crate::list::ttl_ms(self.ttl)),
            ],
        )
    }

    fn parse(&self, reply: Value) -> bool {
        lua::reply_u64(&reply) == 1
    }
}

/// Refuses a ttl that would drop a record at once.
pub(crate) fn validate_ttl(ttl: Duration) -> Result<()> {
    if ttl < Duration::from_millis(1) {
        return Err(ruststream_core::ConfigError::new(
            "RedisBroker::result_ttl",
            "zero would expire job results at once",
            "give it at least 1 ms (the default is 1 h)",
        )
        .into());
    }
    Ok(())
}

impl JobStore for RedisPublisher {
    fn write_job<'a>(&'a self, id: &'a str, write: JobWrite) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.conns.connect().await?;
            let (kind, value) = match write {
                JobWrite::Progress(json) => (JobKind::Progress, json),
                JobWrite::Result(json) => (JobKind::Result, json),
                JobWrite::Failed(reason) => (JobKind::Failed, Bytes::from(reason)),
                other => {
                    return Err(Error::broker(
                        ruststream_core::ErrorKind::Other,
                        format!("this broker cannot store the job write {other:?}"),
                    ));
                }
            };
            let pool = self.conns.pool()?;
            let write = WriteJob {
                key: &crate::keys::job_key(self.conns.keys.prefix(), id),
                kind,
                value: &value,
                ttl: self.conns.settings.result_ttl,
            };
            write.call(pool.next()).await?;
            Ok(())
        })
    }

    fn read_job<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<JobRecord>>> {
        Box::pin(async move {
            self.conns.connect().await?;
            let pool = self.conns.pool()?;
            let fields: Vec<Option<Bytes>> = pool
                .next()
                .hmget(
                    crate::keys::job_key(self.conns.keys.prefix(), id),
                    vec!["progress", "result", "error"],
                )
                .await
                .map_err(core)?;
            let mut fields = fields.into_iter();
            let (progress, result, error) = (
                fields.next().flatten(),
                fields.next().flatten(),
                fields.next().flatten(),
            );
            if progress.is_none() && result.is_none() && error.is_none() {
                return Ok(None);
            }
            let error = error.map(|e| String::from_utf8_lossy(&e).into_owned());
            Ok(Some(JobRecord::new(progress, result, error)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_the_hash_tag() {
        assert_eq!(
            crate::keys::job_key("app:", "0192-ab"),
            "app:ruststream:job:{0192-ab}"
        );
        assert!(validate_ttl(Duration::ZERO).is_err());
        assert!(validate_ttl(Duration::from_millis(1)).is_ok());
    }
}
