//! One job's page, its whole story from what Redis holds: where it stands (state, attempt, a
//! stream entry's consumer and deliveries, when it is due, the dead-letter reason), its
//! history (`Job::timeline`: published, each return to the queue with its reason, claimed,
//! dead), its headers and payload, its handler's progress and result, the steps it recorded, the flow it
//! is a child of and the flow it is the parent of, and the actions its state allows.

use maud::{Markup, html};
use ruststream_core::{ChildOutcome, FlowState, JobRecord};
use ruststream_redis::operate::{Job, JobState, StepState, Steps};
use ruststream_redis::timeline::Event;

use super::jobs::{badge, job_href};
use super::page::{Ctx, action_back, layout, ms};
use super::view::{headers, payload};
use crate::operate::print::utc_text;

/// What one job's page shows.
pub(super) struct JobView<'a> {
    pub(super) b: usize,
    pub(super) job: &'a Job,
    /// Its handler's record (progress, result, error).
    pub(super) record: Option<&'a JobRecord>,
    /// The flow it is the parent of.
    pub(super) flow: Option<&'a FlowState>,
    /// The flow it is a child of.
    pub(super) parent: Option<&'a FlowState>,
    /// Its step record.
    pub(super) steps: Option<&'a Steps>,
}

pub(super) fn job_page(ctx: &Ctx<'_>, v: &JobView<'_>) -> Markup {
    let j = v.job;
    let back = job_href(v.b, &j.subscription, &j.id);
    let act = |op: &str, label: &str| {
        action_back(ctx, v.b, &j.subscription, op, Some(&j.id), label, &back)
    };
    let for_ms = |v: u64| ms(i64::try_from(v).unwrap_or(i64::MAX));
    let body = html! {
        p { (badge(j.state)) @if !j.subscription.is_empty() { " in " a href=(super::page::subscription_href(v.b, &j.subscription)) { (j.subscription) } } }
        div #actions {
            @match j.state {
                JobState::Dead => { (act("requeue", "Requeue")) (act("purge", "Purge")) }
                JobState::Delayed | JobState::Retrying => { (act("promote", "Run now")) (act("cancel", "Cancel")) }
                JobState::Queued | JobState::Running => { (act("cancel-message", "Cancel")) }
                JobState::Completed => {}
            }
        }
        dl.facts #facts {
            dt { "id" } dd { code { (j.id) } }
            dt { "state" } dd #state { (j.state.name()) }
            @if j.state != JobState::Completed { dt { "attempt" } dd { (j.attempt) } }
            @if let Some(e) = &j.entry { dt { "stream entry" } dd { code { (e) } } }
            @if let Some(n) = j.deliveries { dt { "deliveries" } dd { (n) } }
            @if let Some(reason) = &j.reason { dt { @if j.state == JobState::Dead { "dead-letter reason" } @else { "error" } } dd #reason { (reason) } }
            @if let Some(due) = j.due_in_ms { dt { @if j.state == JobState::Retrying { "retries in" } @else { "due in" } } dd #due { (ms(due)) } }
            @if let Some(w) = &j.worker { dt { @if j.entry.is_some() { "consumer" } @else { "worker" } } dd #worker { code { (w) } } }
            @if let Some(r) = j.running_ms { dt { @if j.entry.is_some() { "idle for" } @else { "running for" } } dd { (for_ms(r)) } }
            @if let Some(ago) = j.finished_ms_ago { dt { "finished" } dd { (for_ms(ago)) " ago" } }
            @if let Some(g) = j.headers.get(ruststream_core::GROUP_HEADER) { dt { "fair group" } dd #group { (g) } }
            @if j.state != JobState::Completed { dt { "payload size" } dd { (j.size) " bytes" } }
        }
        h2 { "History" }
        (timeline(&j.timeline()))
        @if let Some(r) = v.record {
            h2 { "Progress and result" }
            dl.facts #record {
                @if let Some(p) = &r.progress { dt { "progress" } dd { (bytes_text(p)) } }
                @if let Some(res) = &r.result { dt { "result" } dd #result { (bytes_text(res)) } }
                @if let Some(e) = &r.error { dt { "error" } dd { (e) } }
            }
        } @else if let Some(res) = &j.result {
            h2 { "Result" }
            div #result { (payload(res, None)) }
        }
        @if let Some(s) = v.steps {
            h2 { "Steps " small { (s.steps.len()) " recorded" @if let Some(left) = s.expires_in_ms { ", the record expires in " (ms(left)) } } }
            div.scroll { table #steps {
                tr { th { "step" } th { "state" } th { "began" } th { "took" } th { "result size or error" } th { "until" } }
                @for st in &s.steps {
                    tr {
                        td { code { (st.name) } }
                        td { (st.state.as_str()) @if st.state == StepState::Waiting { " for the signal " code { (st.name.strip_prefix("wait:").unwrap_or(&st.name)) } } }
                        td { @if let Some(b) = st.began_ms { (utc_text(b)) } }
                        td.n { @if let Some(t) = st.took_ms { (ms(i64::try_from(t).unwrap_or(i64::MAX))) } }
                        td { @if let Some(e) = &st.error { (e) } @else { (st.size) " bytes" } }
                        td { @if let (Some(u), Some(w)) = (st.until_ms, st.wakes_in_ms) { (utc_text(u)) @if w >= 0 { " (in " (ms(w)) ")" } @else { " (" (ms(-w)) " ago)" } } }
                    }
                }
            } }
        }
        @if let Some(f) = v.parent {
            h2 { "Child of flow " code { (f.id) } " " small { (f.state) } }
            (children(f, Some(&j.id)))
        }
        @if let Some(f) = v.flow {
            h2 { "Flow " small { (f.state) } }
            (children(f, None))
        }
        @if j.state != JobState::Completed {
            h2 { "Headers" }
            p #headers { (headers(&j.headers)) }
            h2 { "Payload" }
            div #payload { (payload(&j.payload, Some(j.size))) }
        }
    };
    layout(&format!("Job {}", j.id), None, ctx, body)
}

/// A job's timeline, oldest first: each event's time, kind, attempt and detail.
fn timeline(events: &[Event]) -> Markup {
    html! {
        div.scroll { table #history {
            tr { th { "when" } th { "event" } th { "attempt" } th { "detail" } }
            @for e in events {
                tr {
                    td { (e.at_text()) }
                    td { (e.kind) }
                    td.n { @if let Some(a) = e.attempt { (a) } }
                    td { (e.detail) }
                }
            }
        } }
    }
}

/// A flow's children with their outcomes and results, `this` one marked.
fn children(f: &FlowState, this: Option<&str>) -> Markup {
    html! {
        div.scroll { table.flow #flow {
            tr { th { "child" } th { "outcome" } th { "result" } }
            @for c in &f.children {
                tr.this[this == Some(c.id.as_str())] {
                    td { code { (c.id) } }
                    td { (outcome(&c.outcome)) }
                    td { @if let Some(r) = &c.result { (bytes_text(r)) } }
                }
            }
        } }
    }
}

fn outcome(o: &ChildOutcome) -> String {
    match crate::operate::flow::outcome(o) {
        (word, Some(reason)) => format!("{word}: {reason}"),
        (word, None) => word.to_owned(),
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

    /// `job`'s page, with `steps`.
    fn page_of(app: &AppLabel, job: &Job, steps: Option<&Steps>) -> String {
        let view = JobView {
            b: 0,
            job,
            record: None,
            flow: None,
            parent: None,
            steps,
        };
        job_page(&ctx_for_test(app), &view).into_string()
    }

    #[test]
    fn html_in_a_payload_or_header_renders_as_text() {
        let app = AppLabel::default();
        let mut h = ruststream_core::Headers::new();
        h.insert("tenant".into(), "<b>acme</b>".into());
        let job = job(&h, br#"{"note":"</script><script>alert(1)</script>"}"#);
        let page = page_of(&app, &job, None);
        assert!(
            !page.contains("<b>acme") && !page.contains("<script>"),
            "{page}"
        );
        assert!(page.contains("&lt;b&gt;acme"), "{page}");
        assert!(page.contains("&lt;/script&gt;"), "{page}");
        assert!(page.contains(r#"data-op="requeue""#), "{page}");
    }

    #[test]
    fn steps_show_their_state_time_duration_and_wait() {
        let app = AppLabel::default();
        let job = job(&ruststream_core::Headers::new(), b"{}");
        let steps: Steps = serde_json::from_value(serde_json::json!({
            "expires_in_ms": 60_000,
            "steps": [
                {"name": "charge", "state": "recorded", "size": 6,
                 "began_ms": 1_796_659_419_123_u64, "took_ms": 25, "wakes_in_ms": null,
                 "error": null, "until_ms": null},
                {"name": "wait:go", "state": "waiting", "size": 0,
                 "began_ms": 1_796_659_419_200_u64, "took_ms": 60_000, "wakes_in_ms": 30_000,
                 "error": null, "until_ms": 1_796_659_479_200_u64}
            ]
        }))
        .expect("steps");
        let page = page_of(&app, &job, Some(&steps));
        assert!(page.contains("2026-12-07 16:03:39.123 UTC"), "{page}");
        assert!(page.contains("25 ms"), "{page}");
        assert!(
            page.contains("waiting for the signal <code>go</code>"),
            "{page}"
        );
        assert!(
            page.contains("2026-12-07 16:04:39.200 UTC (in 30.0 s)"),
            "{page}"
        );
    }

    #[test]
    fn the_history_shows_in_order_and_a_reason_with_html_or_bad_bytes_renders_as_text() {
        let app = AppLabel::default();
        let mut h = ruststream_core::Headers::new();
        let history = "1700000000100 retry 1 <script>alert(1)</script>\n\
                       1700000000200 retry 2 card \u{1}declined\n\
                       1700000000300 dead 3 max-attempts";
        h.insert("rs.history".into(), history.into());
        h.insert("dead-at".into(), "1700000000300".into());
        let id = "0190f2a1-0000-7000-8000-000000000000";
        let raw = ruststream_redis::frame::encode_parts(id, 3, &h, b"{}");
        // The reason's \x01 made a byte that is not UTF-8.
        let mut raw = raw.to_vec();
        let at = raw.windows(9).position(|w| w == b"\x01declined");
        raw[at.expect("the marked reason")] = 0xff;
        let job = Job::of_frame("orders", JobState::Dead, &raw.into());
        let page = page_of(&app, &job, None);
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(page.contains("&lt;script&gt;alert(1)"), "{page}");
        assert!(page.contains("card \u{fffd}declined"), "{page}");
        let at = |what: &str| page.find(what).unwrap_or_else(|| panic!("{what}: {page}"));
        assert!(at("published") < at("&lt;script&gt;"));
        assert!(at("&lt;script&gt;") < at("card \u{fffd}"));
        assert!(at("card \u{fffd}") < at("max-attempts"));
        assert!(page.contains("2023-11-14 22:13:20.300 UTC"), "{page}");
        assert!(
            !page.contains("rs.history"),
            "not among the headers: {page}"
        );
    }

    #[test]
    fn a_binary_or_huge_payload_renders_safely() {
        let app = AppLabel::default();
        let h = ruststream_core::Headers::new();
        let binary = job(&h, &[0xff, 0xfe, 0x00, 0x80]);
        let page = page_of(&app, &binary, None);
        assert!(page.contains("not UTF-8"), "{page}");
        let huge = job(&h, "x".repeat(1_000_000).as_bytes());
        let page = page_of(&app, &huge, None);
        assert!(page.len() < 100_000, "{}", page.len());
        assert!(page.contains("cut at"));
        let list = super::super::jobs::job_list(
            &ctx_for_test(&app),
            &super::super::jobs::JobList {
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
