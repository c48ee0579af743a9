//! `job show ID` and `job list STATE`: the jobs of the app's list queues and streams (and the
//! completed ones where results are kept), through the operator library's job reads
//! (`ruststream_redis::operate::Operator::jobs`, `completed`, `find_job`, `steps`,
//! `parent_flow`, `flow`): `job show` prints what the dashboard's job page shows.

use std::process::ExitCode;

use ruststream_core::FlowState;
use ruststream_redis::operate::{Job, JobState, Operator, Step, StepState, Steps};

use super::flow::{FlowView, flow_text};

use super::print::{ms_text, print_out, utc_text};
use super::{JobCommand, NOTHING_MATCHED, USAGE};
use crate::Result;

/// Runs a `job` command on every broker's list queues (or the one subscription named).
pub(super) async fn run(ops: &[Operator], command: JobCommand) -> Result<ExitCode> {
    for o in ops {
        o.connect().await?;
    }
    match command {
        JobCommand::Show { id, json } => {
            let mut stories = Vec::new();
            let mut record = None;
            for o in ops {
                for job in o.find_job(&id).await? {
                    stories.push(Story::of(o, job).await?);
                }
                if record.is_none() {
                    record = o.job_record(&id).await?;
                }
            }
            if stories.is_empty() && record.is_none() {
                eprintln!(
                    "no job `{id}` waits, runs, is delayed, dead or completed in this app's queues"
                );
                return Ok(ExitCode::from(NOTHING_MATCHED));
            }
            let view = serde_json::json!({
                "jobs": stories.iter().map(Story::json).collect::<Vec<_>>(),
                "record": record.as_ref().map(|r| serde_json::json!({
                    "progress": r.progress.as_deref().map(String::from_utf8_lossy),
                    "result": r.result.as_deref().map(String::from_utf8_lossy),
                    "error": r.error,
                })),
            });
            print_out(json, &view, || show_text(&stories, &view["record"]))?;
            Ok(ExitCode::SUCCESS)
        }
        JobCommand::List {
            state,
            subscription,
            offset,
            limit,
            json,
        } => {
            let Some(state) = JobState::parse(&state) else {
                eprintln!(
                    "error: no state `{state}`; use queued, running, delayed, retrying, dead or completed"
                );
                return Ok(ExitCode::from(USAGE));
            };
            let mut jobs = Vec::new();
            for o in ops {
                if state == JobState::Completed {
                    jobs.extend(o.completed(offset, limit).await?.jobs);
                    continue;
                }
                let queues = o.subscriptions().iter();
                for q in queues.filter(|q| q.transport == "list" || q.transport == "stream") {
                    if subscription.as_ref().is_some_and(|s| *s != q.name) {
                        continue;
                    }
                    jobs.extend(o.jobs(&q.name, state, offset, limit).await?.jobs);
                }
            }
            print_out(json, &jobs, || jobs.iter().map(line).collect())?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// One place a job is, with its story: its timeline (`Job::timeline`), steps, the flow it is a child of, the flow it parents.
struct Story {
    job: Job,
    steps: Option<Steps>,
    parent: Option<FlowState>,
    flow: Option<FlowState>,
}

impl Story {
    async fn of(o: &Operator, job: Job) -> Result<Self> {
        Ok(Self {
            steps: o.steps(&job.subscription, &job.id).await?,
            parent: o.parent_flow(&job).await?,
            flow: o.flow(&job.subscription, &job.id).await?,
            job,
        })
    }

    fn json(&self) -> serde_json::Value {
        let mut view = serde_json::to_value(&self.job).unwrap_or_default();
        if let Some(map) = view.as_object_mut() {
            let flow = |f: &Option<FlowState>| {
                f.as_ref()
                    .and_then(|f| {
                        serde_json::to_value(FlowView::of(f, &self.job.subscription)).ok()
                    })
                    .unwrap_or_default()
            };
            map.insert(
                "steps".into(),
                serde_json::to_value(&self.steps).unwrap_or_default(),
            );
            map.insert(
                "timeline".into(),
                serde_json::to_value(self.job.timeline()).unwrap_or_default(),
            );
            map.insert("parent_flow".into(), flow(&self.parent));
            map.insert("flow".into(), flow(&self.flow));
        }
        view
    }

    fn text(&self) -> String {
        let j = &self.job;
        let mut out = line(j);
        for e in j.timeline() {
            out.push_str(&format!("  {}  {}", e.at_text(), e.kind));
            if let Some(a) = e.attempt {
                out.push_str(&format!(" (attempt {a})"));
            }
            if !e.detail.is_empty() {
                out.push_str(&format!(": {}", e.detail));
            }
            out.push('\n');
        }
        for (k, v) in &j.headers {
            out.push_str(&format!("  header {k}={v}\n"));
        }
        if let (Some(e), Some(n)) = (&j.entry, j.deliveries) {
            out.push_str(&format!("  stream entry {e}, delivered {n} time(s)\n"));
        }
        for st in self.steps.iter().flat_map(|s| &s.steps) {
            out.push_str(&step_text(st));
        }
        for (what, f) in [("child of", &self.parent), ("parent of", &self.flow)] {
            if let Some(f) = f {
                out.push_str(&format!("  {what} {}", flow_text(f, &j.subscription)));
            }
        }
        let payload = serde_json::to_string_pretty(&j.payload).unwrap_or_default();
        out.push_str(&format!("  payload ({} bytes):\n{payload}\n", j.size));
        out
    }
}

/// One step of a job on one line: its name and state, when it began and how long it took,
/// its result's size or its error, and for a sleep or a wait until when.
fn step_text(st: &Step) -> String {
    let mut out = format!("  step {} {}", st.name, st.state.as_str());
    if let Some(began) = st.began_ms {
        out.push_str(&format!(" at {}", utc_text(began)));
    }
    if let Some(took) = st.took_ms {
        out.push_str(&format!(
            " took {}",
            ms_text(i64::try_from(took).unwrap_or(i64::MAX))
        ));
    }
    match &st.error {
        Some(e) => out.push_str(&format!(" error: {e}")),
        None => out.push_str(&format!(" ({} bytes)", st.size)),
    }
    if let Some(w) = st.wakes_in_ms {
        let until = st.until_ms.map(utc_text).unwrap_or_default();
        match st.state {
            StepState::Waiting => out.push_str(&format!(
                ", waits for the signal `{}` until {until} (in {})",
                wait_name(&st.name),
                ms_text(w)
            )),
            StepState::Sleeping => {
                out.push_str(&format!(", sleeps until {until} (in {})", ms_text(w)));
            }
            _ => out.push_str(&format!(", ended {} ago", ms_text(w.saturating_neg()))),
        }
    }
    out.push('\n');
    out
}

/// The signal a wait's step name (`wait:<signal>`) waits for.
fn wait_name(name: &str) -> &str {
    name.strip_prefix("wait:").unwrap_or(name)
}

/// One job on one line: id, subscription, state, attempt, where it stands, payload.
fn line(j: &Job) -> String {
    let mut at = String::new();
    if let Some(due) = j.due_in_ms {
        at = format!("  due in {}", ms_text(due));
    }
    if let Some(w) = &j.worker {
        at = format!("  worker {w}");
    }
    if let Some(r) = j.running_ms {
        at.push_str(&format!(
            " for {}",
            ms_text(i64::try_from(r).unwrap_or(i64::MAX))
        ));
    }
    if let Some(reason) = &j.reason {
        at = format!("  reason {reason}");
    }
    format!(
        "{}  {}  {}  attempt {}{at}  {}\n",
        j.id,
        j.subscription,
        j.state.name(),
        j.attempt,
        j.payload
    )
}

/// `job show` in words: each place the job is with its story, then its handler's record.
fn show_text(stories: &[Story], record: &serde_json::Value) -> String {
    let mut out: String = stories.iter().map(Story::text).collect();
    if !record.is_null() {
        out.push_str(&format!("record: {record}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_shows_its_state_time_duration_and_what_it_waits_for() {
        let step =
            |json: serde_json::Value| -> Step { serde_json::from_value(json).expect("a step") };
        let charge = step(
            serde_json::json!({"name": "charge", "state": "recorded", "size": 6,
            "began_ms": 1_796_659_419_123_u64, "took_ms": 25, "wakes_in_ms": null,
            "error": null, "until_ms": null}),
        );
        assert_eq!(
            step_text(&charge),
            "  step charge recorded at 2026-12-07 16:03:39.123 UTC took 25ms (6 bytes)\n"
        );
        let wait = step(
            serde_json::json!({"name": "wait:go", "state": "waiting", "size": 0,
            "began_ms": 1_796_659_419_123_u64, "took_ms": 60_000, "wakes_in_ms": 30_000,
            "error": null, "until_ms": 1_796_659_479_123_u64}),
        );
        let text = step_text(&wait);
        assert!(
            text.contains("waits for the signal `go` until 2026-12-07 16:04:39.123 UTC (in 30.0s)"),
            "{text}"
        );
        let failed = step(
            serde_json::json!({"name": "reserve", "state": "failed", "size": 0,
            "began_ms": null, "took_ms": 7, "wakes_in_ms": null, "error": "down",
            "until_ms": null}),
        );
        assert_eq!(
            step_text(&failed),
            "  step reserve failed took 7ms error: down\n"
        );
    }

    #[test]
    fn job_show_prints_the_history_in_order_with_times_attempts_and_reasons() {
        let mut h = ruststream_core::Headers::new();
        let history = "1700000000100 retry 1 card declined\n\
                       1700000000200 retry 2 <b>card</b> expired\n\
                       1700000000300 dead 3 max-attempts";
        h.insert("rs.history".into(), history.into());
        let raw = ruststream_redis::frame::encode_parts("order-7", 3, &h, b"{}");
        let story = Story {
            job: Job::of_frame("orders", JobState::Dead, &raw),
            steps: None,
            parent: None,
            flow: None,
        };
        let text = story.text();
        let lines: Vec<&str> = text.lines().skip(1).take(4).collect();
        assert_eq!(
            lines,
            [
                "  time not known  published: its id is not a UUIDv7, so when is not known",
                "  2023-11-14 22:13:20.100 UTC  retry (attempt 1): card declined",
                "  2023-11-14 22:13:20.200 UTC  retry (attempt 2): <b>card</b> expired",
                "  2023-11-14 22:13:20.300 UTC  dead (attempt 3): max-attempts",
            ],
            "{text}"
        );
        assert!(!text.contains("header rs.history"), "{text}");
        let json = story.json();
        assert_eq!(json["timeline"][1]["detail"], "card declined");
        assert_eq!(json["timeline"][3]["attempt"], 3);
    }
}
