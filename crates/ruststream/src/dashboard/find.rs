//! The handlers of the job pages: `/jobs` (a subscription's jobs in one state, paged), `/search`
//! (by message id, or `name=value` for a header; one hit opens its page), `/job` (one job).

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::html;
use ruststream_redis::operate::{Job, JobState};

use super::jobs::{self, JobList, JobView, PAGE};
use super::page::{self, layout};
use super::{Shared, field, fields, find};

/// `/jobs?b=B&name=NAME&state=STATE&page=P`; without a subscription, every list queue's counts.
pub(super) async fn list(State(s): State<Shared>, uri: Uri) -> Response {
    let query = fields(uri.query().unwrap_or("").as_bytes());
    let Some((b, op, name)) = find(&s, field(&query, "b"), field(&query, "name")) else {
        return every_queue(&s).await;
    };
    let state = field(&query, "state")
        .and_then(JobState::parse)
        .unwrap_or(JobState::Queued);
    let page: usize = field(&query, "page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
        .min(1_000_000 / PAGE);
    let listed = match op.jobs(&name, state, page * PAGE, PAGE).await {
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

/// Every list queue of every broker, with a link to each state's jobs.
async fn every_queue(s: &Shared) -> Response {
    let ctx = s.ctx(None);
    let body = html! {
        p.muted { "Jobs are listed for list queues (a stream's pending entries show on its page)." }
        div.scroll { table #queues {
            tr { th { "subscription" } @for st in JobState::ALL { th { (st.name()) } } }
            @for (b, op) in s.ops.iter().enumerate() {
                @for q in op.subscriptions().iter().filter(|q| q.transport == "list") {
                    tr {
                        td { a href=(page::subscription_href(b, &q.name)) { (q.name) } }
                        @for st in JobState::ALL { td { a href=(jobs::jobs_href(b, &q.name, st, 0)) { (st.name()) } } }
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
    let ctx = s.ctx(None);
    let status = if found.is_empty() {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::OK
    };
    (status, Html(jobs::found(&ctx, &q, &found).into_string())).into_response()
}

/// `/job?b=B&name=NAME&id=ID`: the job, its record and its flow.
pub(super) async fn one(State(s): State<Shared>, uri: Uri) -> Response {
    let query = fields(uri.query().unwrap_or("").as_bytes());
    let Some((b, op, name)) = find(&s, field(&query, "b"), field(&query, "name")) else {
        return s.failure(StatusCode::NOT_FOUND, "no such subscription");
    };
    let id = field(&query, "id").unwrap_or("");
    let ctx = s.ctx(field(&query, "done"));
    let loaded = async {
        let job = op
            .find_job(id)
            .await?
            .into_iter()
            .find(|j| j.subscription == name);
        let record = op.job_record(id).await?;
        let flow = match op.find(&name).map(|k| k.transport) {
            Some("list" | "stream") => op.flow(&name, id).await?,
            _ => None,
        };
        crate::Result::Ok((job, record, flow))
    };
    match loaded.await {
        Ok((Some(job), record, flow)) => {
            let view = JobView {
                b,
                job: &job,
                record: record.as_ref(),
                flow: flow.as_ref(),
            };
            Html(jobs::job_page(&ctx, &view).into_string()).into_response()
        }
        Ok((None, record, _)) => {
            let body = html! {
                p.err #error { "No job " code { (id) } " waits, runs, is delayed or dead in " (name) "." }
                @if let Some(r) = record {
                    p { "Its handler's record: " @if let Some(e) = &r.error { "failed: " (e) } @else if r.result.is_some() { "done, with a result." } @else { "running." } }
                }
            };
            (
                StatusCode::NOT_FOUND,
                Html(layout("Job not found", None, &ctx, body).into_string()),
            )
                .into_response()
        }
        Err(e) => s.failure(StatusCode::BAD_GATEWAY, &crate::Error::to_string(&e)),
    }
}
