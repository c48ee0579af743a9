//! Completed jobs: the final records where results are kept (`crate::results`,
//! `<prefix>ruststream:job:{<id>}`, while they live: `RedisBroker::result_ttl`). No index of
//! them is written (that would be a write per message), so they are found by `SCAN MATCH` (on
//! every node of a cluster), at most [`COMPLETED_SCANNED`] keys in at most
//! [`SCAN_CALLS`](super::SCAN_CALLS) calls, then one `HMGET state result
//! error` and one `PTTL` each, sent concurrently. Newest first: a final record is written once,
//! so its remaining ttl says when it finished.

use fred::prelude::*;
use ruststream_core::Result;

use super::Operator;
use super::dead::payload_view;
use super::jobs::{Job, JobPage, JobState};
use super::scan::scan_keys;
use crate::error::core;
use crate::keys::escape_glob;

/// Most record keys a completed list scans.
pub const COMPLETED_SCANNED: usize = 1000;

/// The job id of a record's full key `<prefix>ruststream:job:{<id>}`.
fn id_of(key: &str, head: &str) -> Option<String> {
    let id = key
        .strip_prefix(head)?
        .strip_prefix('{')?
        .strip_suffix('}')?;
    Some(id.to_owned())
}

impl Operator {
    /// The `limit` completed (done or failed) jobs whose records still live, newest first,
    /// after the `offset` first, among the first [`COMPLETED_SCANNED`] records found. `total`
    /// counts the completed among those found.
    pub async fn completed(&self, offset: usize, limit: usize) -> Result<JobPage> {
        let pool = self.conns.pool()?;
        let client = pool.next().clone();
        let head = format!("{}ruststream:job:", self.conns.keys.prefix());
        let pattern = format!("{}{{*}}", escape_glob(&head));
        let keys = scan_keys(&client, pattern, COMPLETED_SCANNED).await?;
        let ttl = i64::try_from(self.conns.settings.result_ttl.as_millis()).unwrap_or(i64::MAX);
        let reads = keys.iter().map(|key| {
            let client = client.clone();
            async move {
                let fields: Vec<Option<bytes::Bytes>> = client
                    .hmget(key, vec!["state", "result", "error"])
                    .await
                    .map_err(core)?;
                let left: i64 = client.pttl(key).await.map_err(core)?;
                Ok::<_, ruststream_core::Error>((key, fields, left))
            }
        });
        let mut done: Vec<(i64, Job)> = Vec::new();
        for (key, fields, left) in futures::future::try_join_all(reads).await? {
            let mut fields = fields.into_iter();
            let (state, result, error) = (
                fields.next().flatten(),
                fields.next().flatten(),
                fields.next().flatten(),
            );
            if !matches!(state.as_deref(), Some(b"done" | b"failed")) {
                continue;
            }
            let Some(id) = key.as_str().and_then(|k| id_of(k, &head)) else {
                continue;
            };
            let ago = ttl.saturating_sub(left).max(0);
            let mut job = Job::of_decoded(
                "",
                JobState::Completed,
                crate::frame::Frame::decode(bytes::Bytes::new()),
            );
            job.id = id;
            job.attempt = 0;
            job.result = result.as_deref().map(payload_view);
            job.reason = error.map(|e| String::from_utf8_lossy(&e).into_owned());
            job.finished_ms_ago = Some(ago.unsigned_abs());
            done.push((ago, job));
        }
        done.sort_by_key(|(ago, _)| *ago);
        let total = done.len() as u64;
        let jobs = done
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(|(_, j)| j)
            .collect();
        Ok(JobPage { jobs, total })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_key_names_its_job_and_the_prefix_is_matched_literally() {
        assert_eq!(
            id_of("app:ruststream:job:{0192-ab}", "app:ruststream:job:"),
            Some("0192-ab".to_owned())
        );
        assert_eq!(id_of("other", "app:ruststream:job:"), None);
    }
}
