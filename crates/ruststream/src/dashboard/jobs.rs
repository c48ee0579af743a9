//! The job pages: a subscription's jobs in one state, a page at a time; what a search found;
//! one job with its whole story (state, attempt, headers, payload, reason, result, flow) and
//! the actions its state allows.

use maud::{Markup, html};
use ruststream_core::{ChildOutcome, FlowState, JobRecord};
use ruststream_redis::operate::{Job, JobState};

use super::page::{Ctx, action_back, layout, ms};
use super::view::{headers, payload, urlencode};

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
                    td { (j.subscription) }
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

/// The line that says where a job stands: due in, running for, the dead letter's reason.
fn detail(j: &Job) -> Markup {
    html! {
        @if let Some(due) = j.due_in_ms { "due in " (ms(due)) }
        @if let Some(w) = &j.worker { "worker " code { (w) } }
        @if let Some(r) = j.running_ms { ", for " (ms(i64::try_from(r).unwrap_or(i64::MAX))) }
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

/// One job's page: what it is, where it stands, its story, and what can be done to it.
pub(super) struct JobView<'a> {
    pub(super) b: usize,
    pub(super) job: &'a Job,
    pub(super) record: Option<&'a JobRecord>,
    pub(super) flow: Option<&'a FlowState>,
}

pub(super) fn job_page(ctx: &Ctx<'_>, v: &JobView<'_>) -> Markup {
    let j = v.job;
    let back = job_href(v.b, &j.subscription, &j.id);
    let act = |op: &str, label: &str| {
        action_back(ctx, v.b, &j.subscription, op, Some(&j.id), label, &back)
    };
    let body = html! {
        p { (badge(j.state)) " in " a href=(super::page::subscription_href(v.b, &j.subscription)) { (j.subscription) } }
        div #actions {
            @match j.state {
                JobState::Dead => { (act("requeue", "Requeue")) (act("purge", "Purge")) }
                JobState::Delayed | JobState::Retrying => { (act("promote", "Run now")) (act("cancel", "Cancel")) }
                JobState::Queued | JobState::Running => { (act("cancel-message", "Cancel")) }
            }
        }
        dl.facts #facts {
            dt { "id" } dd { code { (j.id) } }
            dt { "state" } dd { (j.state.name()) }
            dt { "attempt" } dd { (j.attempt) }
            @if let Some(reason) = &j.reason { dt { "dead-letter reason" } dd #reason { (reason) } }
            @if let Some(h) = j.headers.get("dead-history") { dt { "earlier reasons" } dd { (h) } }
            @if let Some(due) = j.due_in_ms { dt { "due in" } dd { (ms(due)) } }
            @if let Some(w) = &j.worker { dt { "worker" } dd { code { (w) } } }
            @if let Some(r) = j.running_ms { dt { "running for" } dd { (ms(i64::try_from(r).unwrap_or(i64::MAX))) } }
            @if let Some(g) = j.headers.get("group") { dt { "group" } dd { (g) } }
            dt { "payload size" } dd { (j.size) " bytes" }
        }
        @if let Some(r) = v.record {
            h2 { "Progress and result" }
            dl.facts #record {
                @if let Some(p) = &r.progress { dt { "progress" } dd { (bytes_text(p)) } }
                @if let Some(res) = &r.result { dt { "result" } dd { (bytes_text(res)) } }
                @if let Some(e) = &r.error { dt { "error" } dd { (e) } }
            }
        }
        @if let Some(f) = v.flow {
            h2 { "Flow " small { (f.state) } }
            div.scroll { table #flow {
                tr { th { "child" } th { "outcome" } th { "result" } }
                @for c in &f.children {
                    tr {
                        td { code { (c.id) } }
                        td { (outcome(&c.outcome)) }
                        td { @if let Some(r) = &c.result { (bytes_text(r)) } }
                    }
                }
            } }
        }
        h2 { "Headers" }
        p #headers { (headers(&j.headers)) }
        h2 { "Payload" }
        div #payload { (payload(&j.payload, Some(j.size))) }
    };
    layout(&format!("Job {}", j.id), None, ctx, body)
}

fn outcome(o: &ChildOutcome) -> String {
    match o {
        ChildOutcome::Pending => "pending".into(),
        ChildOutcome::Acked => "done".into(),
        ChildOutcome::Dead { reason } => format!("dead: {reason}"),
        ChildOutcome::Dropped => "dropped".into(),
        _ => "other".into(),
    }
}

/// Stored JSON bytes as text, cut to a size.
fn bytes_text(b: &[u8]) -> Markup {
    let value = serde_json::from_slice(b)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(b).into_owned()));
    payload(&value, None)
}

#[cfg(test)]
mod tests {
    use super::super::page::AppLabel;
    use super::*;

    fn ctx_for_test(app: &AppLabel) -> Ctx<'_> {
        Ctx {
            csrf: "t",
            done: None,
            live: false,
            app,
        }
    }

    fn job(headers: &ruststream_core::Headers, payload: &[u8]) -> Job {
        let raw = ruststream_redis::frame::encode_parts("order-7", 2, headers, payload);
        Job::of_frame("orders", JobState::Dead, &raw)
    }

    #[test]
    fn html_in_a_payload_or_header_renders_as_text() {
        let app = AppLabel::default();
        let mut h = ruststream_core::Headers::new();
        h.insert("tenant".into(), "<b>acme</b>".into());
        let job = job(&h, br#"{"note":"</script><script>alert(1)</script>"}"#);
        let page = job_page(
            &ctx_for_test(&app),
            &JobView {
                b: 0,
                job: &job,
                record: None,
                flow: None,
            },
        )
        .into_string();
        assert!(
            !page.contains("<b>acme") && !page.contains("<script>"),
            "{page}"
        );
        assert!(page.contains("&lt;b&gt;acme"), "{page}");
        assert!(page.contains("&lt;/script&gt;"), "{page}");
        assert!(page.contains(r#"data-op="requeue""#), "{page}");
    }

    #[test]
    fn a_binary_or_huge_payload_renders_safely() {
        let app = AppLabel::default();
        let h = ruststream_core::Headers::new();
        let binary = job(&h, &[0xff, 0xfe, 0x00, 0x80]);
        let page = job_page(
            &ctx_for_test(&app),
            &JobView {
                b: 0,
                job: &binary,
                record: None,
                flow: None,
            },
        )
        .into_string();
        assert!(page.contains("not UTF-8"), "{page}");
        let huge = job(&h, "x".repeat(1_000_000).as_bytes());
        let page = job_page(
            &ctx_for_test(&app),
            &JobView {
                b: 0,
                job: &huge,
                record: None,
                flow: None,
            },
        )
        .into_string();
        assert!(page.len() < 100_000, "{}", page.len());
        assert!(page.contains("cut at"));
        let list = job_list(
            &ctx_for_test(&app),
            &JobList {
                b: 0,
                name: "orders",
                state: JobState::Dead,
                page: 0,
                jobs: &[],
                total: 0,
            },
        )
        .into_string();
        assert!(list.contains("No jobs here"), "{list}");
    }
}
