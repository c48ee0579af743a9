//! Every job of a list queue or a stream, by state, a page at a time, and found by id or by a
//! header: queued (a list's levels and fair groups, `LLEN` in one pipeline, then `LRANGE`; a stream's entries its group has not read,
//! `stream_jobs.rs`), running (a reliable list's processing list; with recovery, the recovery
//! set's claims, `ZRANGE .. WITHSCORES`, and their batch lists, `LRANGE`, for the worker and how
//! long; a stream group's pending entries with their consumer and idle time, `stream_jobs.rs`),
//! delayed and retrying (the delayed set, `delayed.rs`), dead (`dead.rs`), completed (the
//! records where results are kept, `completed.rs`). Every read is bounded by its page, or by
//! [`JOBS_SCANNED`] for a search.

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::{Headers, Result};
use serde::Serialize;

use super::Operator;
use super::dead::{oldest_page, payload_view};
use crate::error::core;
use crate::frame::{Frame, REASON_HEADER};
use crate::keys::SourceKeys;
use crate::timeline::{Event, HISTORY_HEADER, events, published_ms};

/// Most entries a search reads in each state of each subscription.
pub const JOBS_SCANNED: usize = 1000;

/// Most fair groups of a list whose waiting entries are listed (the first of its ring).
pub const GROUPS_LISTED: usize = 1000;

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting in the queue.
    Queued,
    /// Claimed by a worker, not settled yet.
    Running,
    /// Published with a delay, waiting for its time.
    Delayed,
    /// Failed, waiting for its next attempt (a delayed entry past its first attempt).
    Retrying,
    /// In the dead-letter list.
    Dead,
    /// Finished, its record kept where results are kept (done with a result, or failed).
    Completed,
}

impl JobState {
    /// Every state, in a job's order.
    pub const ALL: [JobState; 6] = [
        JobState::Queued,
        JobState::Running,
        JobState::Delayed,
        JobState::Retrying,
        JobState::Dead,
        JobState::Completed,
    ];

    /// Its name: `queued`, `running`, `delayed`, `retrying`, `dead`, `completed`.
    pub fn name(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Delayed => "delayed",
            JobState::Retrying => "retrying",
            JobState::Dead => "dead",
            JobState::Completed => "completed",
        }
    }

    /// The state named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// One job as an operator sees it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Job {
    /// The subscription whose queue holds it (empty for a completed job: its record does not
    /// say).
    pub subscription: String,
    /// Where it is.
    pub state: JobState,
    /// The message id (`#N` for a dead letter without one: the N-th oldest).
    pub id: String,
    /// The delivery it is on (or will be).
    pub attempt: u32,
    /// Its headers (a dead letter's without its reason).
    pub headers: Headers,
    /// The payload: JSON when it parses as JSON, else its text, else a note of its size.
    pub payload: serde_json::Value,
    /// The stored payload's size in bytes.
    pub size: usize,
    /// Why it was dead-lettered.
    pub reason: Option<String>,
    /// Delayed or retrying: in how many ms it is due (negative: overdue).
    pub due_in_ms: Option<i64>,
    /// Running, with recovery: the reader that claimed it (a stream: the consumer holding it).
    pub worker: Option<String>,
    /// Running, with recovery: how long ago it was claimed, in ms (a stream: since it was last
    /// delivered, its idle time).
    pub running_ms: Option<u64>,
    /// A stream's entry id.
    pub entry: Option<String>,
    /// A stream's pending entry: how many times its group delivered it.
    pub deliveries: Option<u64>,
    /// Completed: its result (JSON when it parses as JSON, else text).
    pub result: Option<serde_json::Value>,
    /// Completed: how long ago it finished, in ms.
    pub finished_ms_ago: Option<u64>,
    /// Running: when it was claimed, in ms since the epoch on the server's clock (a stream:
    /// when it was last delivered).
    pub claimed_at_ms: Option<i64>,
    /// The events its `rs.history` header recorded (`crate::timeline`), oldest first.
    pub history: Vec<Event>,
}

impl Job {
    /// The job stored as `raw` (a frame: `crate::frame`) in `state` of `subscription`.
    pub fn of_frame(subscription: &str, state: JobState, raw: &Bytes) -> Self {
        Self::of_decoded(subscription, state, Frame::decode(raw.clone()))
    }

    /// A job of `subscription` with nothing known yet, to be filled in.
    fn blank(subscription: &str) -> Self {
        Self::of_decoded(subscription, JobState::Queued, Frame::decode(Bytes::new()))
    }

    /// The job of the decoded `frame` in `state` of `subscription`.
    pub fn of_decoded(subscription: &str, state: JobState, frame: Frame) -> Self {
        let mut headers = frame.headers;
        let reason = headers.remove(REASON_HEADER);
        let history = headers
            .remove(HISTORY_HEADER)
            .map(|h| events(&h))
            .unwrap_or_default();
        Job {
            subscription: subscription.to_owned(),
            state,
            id: frame.id,
            attempt: frame.attempt,
            headers,
            payload: payload_view(&frame.payload),
            size: frame.payload.len(),
            reason: reason.filter(|_| state == JobState::Dead),
            due_in_ms: None,
            worker: None,
            running_ms: None,
            entry: None,
            deliveries: None,
            result: None,
            finished_ms_ago: None,
            claimed_at_ms: None,
            history,
        }
    }

    /// The job with its `rs.history` header moved from its headers to its history.
    fn with_history(mut self) -> Self {
        if let Some(h) = self.headers.remove(HISTORY_HEADER) {
            self.history = events(&h);
        }
        self
    }

    /// Its history as a short timeline, oldest first: published (its time when its id is a
    /// UUIDv7), the reasons of earlier dead letters that were requeued (their `dead-history`,
    /// without a time, those its history does not hold), the events of its history, then
    /// claimed (running) or dead (a dead letter whose history does not end with it: its
    /// `dead-at`).
    pub fn timeline(&self) -> Vec<Event> {
        let at = published_ms(&self.id);
        let said = if at.is_some() {
            ""
        } else {
            "its id is not a UUIDv7, so when is not known"
        };
        let mut out = vec![Event::new(at, "published", None, said)];
        let dead = self.state == JobState::Dead;
        let last_is_dead = self.history.last().is_some_and(|e| e.kind == "dead");
        let recorded = self.history.iter().filter(|e| e.kind == "dead").count()
            - usize::from(dead && last_is_dead);
        let earlier: Vec<&str> = self
            .headers
            .get("dead-history")
            .map(|h| h.split("; ").collect())
            .unwrap_or_default();
        let untimed = earlier.len().saturating_sub(recorded);
        out.extend(
            earlier[..untimed]
                .iter()
                .map(|r| Event::new(None, "dead", None, r)),
        );
        out.extend(self.history.iter().cloned());
        if let (Some(w), true) = (&self.worker, self.state == JobState::Running) {
            out.push(Event::new(
                self.claimed_at_ms,
                "claimed",
                Some(self.attempt),
                w,
            ));
        }
        if dead && !last_is_dead {
            let at = self.headers.get("dead-at").and_then(|t| t.parse().ok());
            let reason = self.reason.as_deref().unwrap_or("");
            out.push(Event::new(at, "dead", Some(self.attempt), reason));
        }
        out
    }
}

/// A page of jobs and how many there are in that state.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct JobPage {
    /// The page's jobs, oldest (or earliest due) first.
    pub jobs: Vec<Job>,
    /// How many jobs are in that state (delayed and retrying: both together).
    pub total: u64,
}

impl JobPage {
    /// No jobs.
    pub fn empty() -> Self {
        JobPage {
            jobs: Vec::new(),
            total: 0,
        }
    }
}

impl Operator {
    /// The `limit` jobs in `state` of the list queue or stream `name` after the `offset`
    /// first; completed jobs are the app's (see [`completed`](Self::completed)).
    pub async fn jobs(
        &self,
        name: &str,
        state: JobState,
        offset: usize,
        limit: usize,
    ) -> Result<JobPage> {
        let q = self.queue(name)?.clone();
        let client = self.conns.pool()?.next().clone();
        let stream = q.transport == "stream";
        match state {
            JobState::Completed => self.completed(offset, limit).await,
            JobState::Queued if stream => {
                super::stream_jobs::waiting(&client, &q, offset, limit).await
            }
            JobState::Running if stream => {
                super::stream_jobs::pending(&client, &q, offset, limit).await
            }
            JobState::Queued => queued(&client, &q, offset, limit).await,
            JobState::Running => running(&client, &q, offset, limit).await,
            JobState::Delayed | JobState::Retrying => {
                let Some(set) = &q.delayed else {
                    return Ok(JobPage::empty());
                };
                let total: u64 = client.zcard(set).await.map_err(core)?;
                let entries = self.delayed_from(name, offset, limit).await?;
                let jobs = entries
                    .into_iter()
                    .map(|e| Job {
                        state: if e.attempt > 1 {
                            JobState::Retrying
                        } else {
                            JobState::Delayed
                        },
                        size: e.payload.to_string().len(),
                        id: e.id,
                        attempt: e.attempt,
                        headers: e.headers,
                        payload: e.payload,
                        due_in_ms: Some(e.due_in_ms),
                        ..Job::blank(&q.name)
                    })
                    .map(Job::with_history)
                    .filter(|j| j.state == state)
                    .collect();
                Ok(JobPage { jobs, total })
            }
            JobState::Dead => {
                let Some(dead) = &q.dead else {
                    return Ok(JobPage::empty());
                };
                let total: u64 = client.llen(dead).await.map_err(core)?;
                let jobs = self
                    .dead_letters_from(name, offset, limit)
                    .await?
                    .into_iter()
                    .map(|d| Job {
                        state: JobState::Dead,
                        id: d.id,
                        attempt: d.attempt,
                        headers: d.headers,
                        payload: d.payload,
                        size: d.payload_size,
                        reason: d.reason,
                        ..Job::blank(&q.name)
                    })
                    .map(Job::with_history)
                    .collect();
                Ok(JobPage { jobs, total })
            }
        }
    }

    /// The progress, result or error the job `id`'s handler recorded (`Context::progress`,
    /// `Context::set_result`), while its record lives (`RedisBroker::result_ttl`): one `HMGET`.
    pub async fn job_record(&self, id: &str) -> Result<Option<ruststream_core::JobRecord>> {
        use ruststream_core::JobStore;
        let jobs = crate::publisher::RedisPublisher {
            conns: self.conns.clone(),
            routes: self.conns.routes.clone(),
        };
        jobs.read_job(id).await
    }

    /// Every job with message id `id` in the app's list queues and streams (each state's
    /// first [`JOBS_SCANNED`] entries; a delayed entry by its id at once).
    pub async fn find_job(&self, id: &str) -> Result<Vec<Job>> {
        self.search(|j| j.id == id).await
    }

    /// Every job whose header `name` is `value` among each state's first [`JOBS_SCANNED`]
    /// entries of the app's list queues and streams.
    pub async fn find_by_header(&self, name: &str, value: &str) -> Result<Vec<Job>> {
        self.search(|j| j.headers.get(name).is_some_and(|v| v == value))
            .await
    }

    async fn search(&self, matches: impl Fn(&Job) -> bool) -> Result<Vec<Job>> {
        let mut found = Vec::new();
        for q in self
            .subscriptions()
            .iter()
            .filter(|q| q.transport == "list" || q.transport == "stream")
        {
            for state in [
                JobState::Running,
                JobState::Queued,
                JobState::Delayed,
                JobState::Dead,
            ] {
                let mut page = self.jobs(&q.name, state, 0, JOBS_SCANNED).await?;
                if state == JobState::Delayed {
                    let retrying = self
                        .jobs(&q.name, JobState::Retrying, 0, JOBS_SCANNED)
                        .await?;
                    page.jobs.extend(retrying.jobs);
                }
                found.extend(page.jobs.into_iter().filter(|j| matches(j)));
            }
        }
        Ok(found)
    }
}

/// A page of the entries waiting on the queue's levels (highest level first, oldest first),
/// then, on a list with fair groups, in the first [`GROUPS_LISTED`] groups of its ring (each
/// group's sub-queue, oldest first). The lengths are read in one pipeline.
async fn queued(client: &Client, q: &SourceKeys, offset: usize, limit: usize) -> Result<JobPage> {
    let mut lists: Vec<String> = q.levels.iter().rev().cloned().collect();
    lists.push(q.queue.clone());
    if let Some(ring) = &q.groups {
        let most = i64::try_from(GROUPS_LISTED).unwrap_or(i64::MAX) - 1;
        let names: Vec<String> = client.lrange(ring, 0, most).await.map_err(core)?;
        lists.extend(names.iter().map(|g| format!("{ring}:{g}")));
    }
    let pipeline = client.pipeline();
    for list in &lists {
        let () = pipeline.llen(list).await.map_err(core)?;
    }
    let lens: Vec<u64> = pipeline.all().await.map_err(core)?;
    let total = lens.iter().sum();
    let mut jobs = Vec::new();
    let mut skip = offset;
    for (list, len) in lists.iter().zip(lens) {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if skip >= len {
            skip -= len;
            continue;
        }
        let want = limit.saturating_sub(jobs.len());
        if want == 0 {
            break;
        }
        let (start, stop) = oldest_page(skip, want);
        skip = 0;
        let values: Vec<Bytes> = client.lrange(list, start, stop).await.map_err(core)?;
        jobs.extend(
            values
                .iter()
                .rev()
                .map(|v| Job::of_frame(&q.name, JobState::Queued, v)),
        );
    }
    Ok(JobPage { jobs, total })
}

/// A page of the claimed entries (the processing list, oldest first); with recovery, each is
/// matched to its claim's batch (a batch list keeps its values until its claim is swept, settled
/// ones too, so only what the processing list holds counts) for its worker and age.
async fn running(client: &Client, q: &SourceKeys, offset: usize, limit: usize) -> Result<JobPage> {
    let Some(processing) = &q.processing else {
        return Ok(JobPage::empty());
    };
    let total: u64 = client.llen(processing).await.map_err(core)?;
    let (start, stop) = oldest_page(offset, limit);
    let values: Vec<Bytes> = client.lrange(processing, start, stop).await.map_err(core)?;
    let mut jobs: Vec<(Bytes, Job)> = values
        .iter()
        .rev()
        .map(|v| (v.clone(), Job::of_frame(&q.name, JobState::Running, v)))
        .collect();
    let Some(recovery) = &q.recovery else {
        return Ok(JobPage {
            jobs: jobs.into_iter().map(|(_, j)| j).collect(),
            total,
        });
    };
    let now = super::inspect::server_ms(client).await?;
    let most = i64::try_from(super::CLAIMS_READ).unwrap_or(i64::MAX) - 1;
    let claims: Vec<(String, f64)> = client
        .zrange(recovery, 0, most, None, false, None, true)
        .await
        .map_err(core)?;
    for (member, _renewed) in claims {
        if jobs.iter().all(|(_, j)| j.worker.is_some()) {
            break;
        }
        let batch = format!("{recovery}:{member}");
        let held: Vec<Bytes> = client
            .lrange(&batch, 0, i64::try_from(JOBS_SCANNED).unwrap_or(i64::MAX))
            .await
            .map_err(core)?;
        let (worker, claimed_at) = claim_of(&member);
        for (raw, job) in jobs.iter_mut().filter(|(_, j)| j.worker.is_none()) {
            if held.contains(raw) {
                job.worker = Some(worker.clone());
                job.running_ms = claimed_at.map(|at| now.saturating_sub(at).max(0).unsigned_abs());
                job.claimed_at_ms = claimed_at;
            }
        }
    }
    Ok(JobPage {
        jobs: jobs.into_iter().map(|(_, j)| j).collect(),
        total,
    })
}

/// The reader and the claim time (ms since the epoch) of a recovery-set member
/// `<reader id>:<seq>.<seconds>.<microseconds>` (see `oldest_claim.lua`).
fn claim_of(member: &str) -> (String, Option<i64>) {
    let Some((reader, rest)) = member.split_once(':') else {
        return (member.to_owned(), None);
    };
    let mut parts = rest.split(':').next().unwrap_or("").split('.');
    let (_, s, us) = (parts.next(), parts.next(), parts.next());
    let at = match (
        s.and_then(|s| s.parse::<i64>().ok()),
        us.and_then(|u| u.parse::<i64>().ok()),
    ) {
        (Some(s), Some(us)) => Some(s * 1000 + us / 1000),
        _ => None,
    };
    (reader.to_owned(), at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_names_its_reader_and_time() {
        assert_eq!(
            claim_of("host-1-abc:17.1796639820.250000"),
            ("host-1-abc".to_owned(), Some(1_796_639_820_250))
        );
        assert_eq!(claim_of("odd"), ("odd".to_owned(), None));
        assert_eq!(JobState::parse("retrying"), Some(JobState::Retrying));
        assert_eq!(JobState::parse("nope"), None);
        assert_eq!(oldest_page(0, 10), (-10, -1));
        assert_eq!(oldest_page(10, 10), (-20, -11));
    }

    #[test]
    fn a_requeued_dead_letter_folds_its_earlier_reasons_into_the_timeline() {
        let mut h = Headers::new();
        // Died twice: once before histories were kept (no event), once with one.
        h.insert("dead-history".into(), "timeout; dropped".into());
        h.insert(
            HISTORY_HEADER.into(),
            "1700000000100 retry 1 boom\n1700000000200 dead 2 dropped".into(),
        );
        let raw = crate::frame::encode_parts("order-7", 1, &h, b"{}");
        let job = Job::of_frame("orders", JobState::Queued, &raw);
        let seen: Vec<_> = job
            .timeline()
            .into_iter()
            .map(|e| (e.kind, e.at_ms, e.detail))
            .collect();
        let event = |k: &str, at: Option<i64>, d: &str| (k.to_owned(), at, d.to_owned());
        assert_eq!(
            seen,
            [
                event(
                    "published",
                    None,
                    "its id is not a UUIDv7, so when is not known"
                ),
                event("dead", None, "timeout"),
                event("retry", Some(1_700_000_000_100), "boom"),
                event("dead", Some(1_700_000_000_200), "dropped"),
            ]
        );
        // Dead now, without a history: its `dead-at` and reason.
        let mut h = Headers::new();
        h.insert("dead-at".into(), "1700000000300".into());
        h.insert(REASON_HEADER.into(), "max-attempts".into());
        let raw = crate::frame::encode_parts("order-8", 3, &h, b"{}");
        let dead = Job::of_frame("orders", JobState::Dead, &raw).timeline();
        assert_eq!(dead[1].at_ms, Some(1_700_000_000_300));
        assert_eq!(
            (dead[1].attempt, dead[1].detail.as_str()),
            (Some(3), "max-attempts")
        );
    }
}
