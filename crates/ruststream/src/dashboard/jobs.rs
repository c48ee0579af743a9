//! The job lists: a subscription's jobs in one state, a page at a time (completed: the app's),
//! and what a search found. One job's page is `job_page.rs`.

use maud::{Markup, html};
use ruststream_redis::operate::{COMPLETED_SCANNED, Job, JobState};

use super::page::{Ctx, layout, ms};
use super::view::{headers, urlencode};

/// Jobs a list page shows.
pub(super) const PAGE: usize = 50;

/// The link to the jobs of subscription `name` of broker `b` in `state`, page `page` (from 0).
pub(super) fn jobs_href(b: usize, name: &str, state: JobState, page: usize) -> String {
    format!(
        "/jobs?b={b}&name={}&state={}&page={page}",
        urlencode(name),
        state.name()
    )
}

/// The link to the page of job `id` of subscription `name` of broker `b`.
pub(super) fn job_href(b: usize, name: &str, id: &str) -> String {
    format!("/job?b={b}&name={}&id={}", urlencode(name), urlencode(id))
}

/// A state's badge.
pub(super) fn badge(state: JobState) -> Markup {
    html! { span class=(format!("badge st-{}", state.name())) { (state.name()) } }
}

/// One subscription's jobs in `state`: tabs of the states, the page, links to the others.
pub(super) struct JobList<'a> {
    pub(super) b: usize,
    pub(super) name: &'a str,
    pub(super) state: JobState,
    pub(super) page: usize,
    pub(super) jobs: &'a [Job],
    pub(super) total: u64,
}

pub(super) fn job_list(ctx: &Ctx<'_>, l: &JobList<'_>) -> Markup {
    let pages = usize::try_from(l.total)
        .unwrap_or(usize::MAX)
        .div_ceil(PAGE)
        .max(1);
    let body = html! {
        nav.tabs #states {
            @for s in JobState::ALL {
                a.on[s == l.state] href=(jobs_href(l.b, l.name, s, 0)) { (s.name()) }
            }
        }
        @if l.state == JobState::Completed {
            p.muted { "Completed jobs are the app's, from the records kept where results are kept (newest first, among the first " (COMPLETED_SCANNED) " records found); a record does not say which subscription ran it." }
        }
        p.muted {
            (l.total) " " @if matches!(l.state, JobState::Delayed | JobState::Retrying) { "delayed or retrying" } @else { (l.state.name()) }
            " · page " (l.page + 1) " of " (pages)
        }
        (job_table(l.b, l.jobs))
        div.pager {
            @if l.page > 0 { a #prev href=(jobs_href(l.b, l.name, l.state, l.page - 1)) { "← newer page" } }
            @if (l.page + 1) * PAGE < usize::try_from(l.total).unwrap_or(usize::MAX) {
                a #next href=(jobs_href(l.b, l.name, l.state, l.page + 1)) { "next page →" }
            }
        }
    };
    layout(&format!("{} · {}", l.name, l.state.name()), None, ctx, body)
}

/// A table of jobs, each linking to its page.
pub(super) fn job_table(b: usize, jobs: &[Job]) -> Markup {
    html! {
        div.scroll { table #jobs {
            tr { th { "id" } th { "subscription" } th { "state" } th { "attempt" } th { "detail" } th { "headers" } th { "size" } }
            @for j in jobs {
                tr data-id=(j.id) {
                    td { a href=(job_href(b, &j.subscription, &j.id)) { code { (j.id) } } }
                    td { @if j.subscription.is_empty() { span.muted { "–" } } @else { (j.subscription) } }
                    td { (badge(j.state)) }
                    td.n { (j.attempt) }
                    td { (detail(j)) }
                    td { (headers(&j.headers)) }
                    td.n { (j.size) }
                }
            }
        } }
        @if jobs.is_empty() { p.muted #no-jobs { "No jobs here." } }
    }
}

/// The line that says where a job stands: due in, running for (a stream's entry: idle for),
/// the dead letter's reason, when a completed job finished.
fn detail(j: &Job) -> Markup {
    let idle = if j.entry.is_some() {
        ", idle "
    } else {
        ", for "
    };
    html! {
        @if let Some(due) = j.due_in_ms { "due in " (ms(due)) }
        @if let Some(w) = &j.worker { "worker " code { (w) } }
        @if let Some(r) = j.running_ms { (idle) (ms(i64::try_from(r).unwrap_or(i64::MAX))) }
        @if let Some(n) = j.deliveries { ", delivered " (n) "×" }
        @if let Some(ago) = j.finished_ms_ago { "finished " (ms(i64::try_from(ago).unwrap_or(i64::MAX))) " ago" @if j.result.is_some() { ", with a result" } " " }
        @if let Some(reason) = &j.reason { (reason) }
    }
}

/// What a search found, across every broker.
pub(super) fn found(ctx: &Ctx<'_>, query: &str, found: &[(usize, Job)]) -> Markup {
    let body = html! {
        p.muted { (found.len()) " job(s) match " code { (query) } ". A header search is written " code { "name=value" } "." }
        @if found.is_empty() { p.muted #no-jobs { "No jobs match: none waits, runs, is delayed or dead with that id or header." } }
        @for (b, jobs) in by_broker(found) { (job_table(b, &jobs)) }
    };
    layout("Search", None, ctx, body)
}

fn by_broker(found: &[(usize, Job)]) -> Vec<(usize, Vec<Job>)> {
    let mut out: Vec<(usize, Vec<Job>)> = Vec::new();
    for (b, job) in found {
        match out.iter_mut().find(|(ob, _)| ob == b) {
            Some((_, jobs)) => jobs.push(job.clone()),
            None => out.push((*b, vec![job.clone()])),
        }
    }
    out
}
