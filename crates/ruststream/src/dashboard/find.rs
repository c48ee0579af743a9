//! The handlers of the job pages: `/jobs` (a subscription's jobs in one state, paged), `/search`
//! (by message id, or `name=value` for a header; one hit opens its page), `/job` (one job, with
//! its record, steps and flows; a completed one from its record alone).

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::html;
use ruststream_core::{FlowState, JobRecord};
use ruststream_redis::operate::{Job, JobState, Operator, Steps};

use super::job_page::{self, JobView};
use super::jobs::{self, JobList, PAGE};
use super::page::{self, layout};
use super::{Shared, field, fields, find};

/// `/jobs?b=B&name=NAME&state=STATE&page=P`; without a subscription, every list queue's counts.
pub(super) async fn list(State(s): State<Shared>, uri: Uri) -> Response {
    let query = fields(uri.query().unwrap_or("").as_bytes());
    let state = field(&query, "state")
        .and_then(JobState::parse)
        .unwrap_or(JobState::Queued);
    let found = match find(&s, field(&query, "b"), field(&query, "name")) {
        Some(found) => Some(found),
        None if state == JobState::Completed => whole_broker(&s, field(&query, "b")),
        None => None,
    };
    let Some((b, op, name)) = found else {
        return every_queue(&s).await;
    };
    let page: usize = field(&query, "page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
        .min(1_000_000 / PAGE);
    let listed = if state == JobState::Completed {
        op.completed(page * PAGE, PAGE).await
    } else {
        op.jobs(&name, state, page * PAGE, PAGE).await
    };
    let listed = match listed {
        Ok(l) => l,
        Err(e) => return s.failure(StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    let ctx = s.ctx(field(&query, "done"));
    let view = JobList {
        b,
        name: &name,
        state,
        page,
        jobs: &listed.jobs,
        total: listed.total,
    };
    Html(jobs::job_list(&ctx, &view).into_string()).into_response()
}

/// Broker `b` (an index in the page) as a whole, for what is not one subscription's: its
/// completed jobs, a job looked for in every queue.
fn whole_broker<'a>(s: &'a Shared, b: Option<&str>) -> Option<(usize, &'a Operator, String)> {
    let b: usize = b?.parse().ok()?;
    Some((b, s.ops.get(b)?, String::new()))
}

/// The states a subscription's row links to (completed jobs are the app's).
const LISTED: [JobState; 5] = [
    JobState::Queued,
    JobState::Running,
    JobState::Delayed,
    JobState::Retrying,
    JobState::Dead,
];

/// Every list queue and stream of every broker, with a link to each state's jobs.
async fn every_queue(s: &Shared) -> Response {
    let ctx = s.ctx(None);
    let body = html! {
        p.muted { "Jobs of list queues and streams, by state. Completed jobs are listed where results are kept: "
            @for (b, _) in s.ops.iter().enumerate() { a #completed href=(format!("/jobs?b={b}&state=completed")) { "completed" } " " } }
        div.scroll { table #queues {
            tr { th { "subscription" } @for st in LISTED { th { (st.name()) } } }
            @for (b, op) in s.ops.iter().enumerate() {
                @for q in op.subscriptions().iter().filter(|q| q.transport == "list" || q.transport == "stream") {
                    tr {
                        td { a href=(page::subscription_href(b, &q.name)) { (q.name) } }
                        @for st in LISTED { td { a href=(jobs::jobs_href(b, &q.name, st, 0)) { (st.name()) } } }
                    }
                }
            }
        } }
    };
    Html(layout("Jobs", None, &ctx, body).into_string()).into_response()
}

/// `/search?q=ID` or `/search?q=NAME=VALUE`.
pub(super) async fn search(State(s): State<Shared>, uri: Uri) -> Response {
    let query = fields(uri.query().unwrap_or("").as_bytes());
    let q = field(&query, "q").unwrap_or("").trim().to_owned();
    if q.is_empty() {
        return Redirect::to("/jobs").into_response();
    }
    let mut found: Vec<(usize, Job)> = Vec::new();
    for (b, op) in s.ops.iter().enumerate() {
        let hits = match q.split_once('=') {
            Some((name, value)) => op.find_by_header(name, value).await,
            None => op.find_job(&q).await,
        };
        match hits {
            Ok(hits) => found.extend(hits.into_iter().map(|j| (b, j))),
            Err(e) => return s.failure(StatusCode::BAD_GATEWAY, &e.to_string()),
        }
    }
    if let [(b, job)] = &found[..] {
        return Redirect::to(&jobs::job_href(*b, &job.subscription, &job.id)).into_response();
    }
    if found.is_empty() && !q.contains('=') {
        // A completed job is found by its record.
        for (b, op) in s.ops.iter().enumerate() {
            match op.job_record(&q).await {
                Ok(Some(r)) if completed(&q, &r).is_some() => {
                    return Redirect::to(&jobs::job_href(b, "", &q)).into_response();
                }
                Ok(_) => {}
                Err(e) => return s.failure(StatusCode::BAD_GATEWAY, &e.to_string()),
            }
        }
    }
    let ctx = s.ctx(None);
    let status = if found.is_empty() {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::OK
    };
    (status, Html(jobs::found(&ctx, &q, &found).into_string())).into_response()
}

/// `/job?b=B&name=NAME&id=ID`: the job, its record, steps and flows. Without a subscription
/// (a completed job's link), every queue of broker `b` is looked in.
pub(super) async fn one(State(s): State<Shared>, uri: Uri) -> Response {
    let query = fields(uri.query().unwrap_or("").as_bytes());
    let named = field(&query, "name").filter(|n| !n.is_empty());
    let found = match named {
        Some(_) => find(&s, field(&query, "b"), named),
        None => whole_broker(&s, field(&query, "b")),
    };
    let Some((b, op, name)) = found else {
        return s.failure(StatusCode::NOT_FOUND, "no such subscription");
    };
    let id = field(&query, "id").unwrap_or("");
    let ctx = s.ctx(field(&query, "done"));
    let loaded = async {
        let job = op
            .find_job(id)
            .await?
            .into_iter()
            .find(|j| name.is_empty() || j.subscription == name);
        let record = op.job_record(id).await?;
        let Some(job) = job.or_else(|| record.as_ref().and_then(|r| completed(id, r))) else {
            return crate::Result::Ok(None);
        };
        let queue = Some(job.subscription.as_str()).filter(|n| !n.is_empty());
        let flow = match queue.and_then(|n| op.find(n)).map(|k| k.transport) {
            Some("list" | "stream") => op.flow(&job.subscription, id).await?,
            _ => None,
        };
        let steps = match queue {
            Some(n) => op.steps(n, id).await?,
            None => None,
        };
        let parent = op.parent_flow(&job).await?;
        Ok(Some(Story {
            job,
            record,
            flow,
            parent,
            steps,
        }))
    };
    match loaded.await {
        Ok(Some(story)) => {
            let view = JobView {
                b,
                job: &story.job,
                record: story.record.as_ref(),
                flow: story.flow.as_ref(),
                parent: story.parent.as_ref(),
                steps: story.steps.as_ref(),
            };
            Html(job_page::job_page(&ctx, &view).into_string()).into_response()
        }
        Ok(None) => {
            let body = html! {
                p.err #error { "No job " code { (id) } " waits, runs, is delayed, dead or completed"
                    @if !name.is_empty() { " in " (name) } "." }
            };
            // Right after a change (a requeue handled at once), the job has moved on: the page
            // says what was done, and is no error.
            let status = if ctx.done.is_some() {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            };
            (
                status,
                Html(layout("Job not found", None, &ctx, body).into_string()),
            )
                .into_response()
        }
        Err(e) => s.failure(StatusCode::BAD_GATEWAY, &crate::Error::to_string(&e)),
    }
}

/// What one job's page is made of.
struct Story {
    job: Job,
    record: Option<JobRecord>,
    flow: Option<FlowState>,
    parent: Option<FlowState>,
    steps: Option<Steps>,
}

/// A job found only by its handler's record: completed when the record is final (a result or
/// an error); `None` while it only has progress.
fn completed(id: &str, r: &JobRecord) -> Option<Job> {
    if r.result.is_none() && r.error.is_none() {
        return None;
    }
    let mut job = Job::of_frame("", JobState::Completed, &axum::body::Bytes::new());
    job.id = id.to_owned();
    job.reason.clone_from(&r.error);
    Some(job)
}
