//! `job show ID` and `job list STATE`: the jobs of the app's list queues, through the operator
//! library's job reads (`ruststream_redis::operate::Operator::jobs`, `find_job`).

use std::process::ExitCode;

use ruststream_redis::operate::{Job, JobState, Operator};

use super::print::{ms_text, print_out};
use super::{JobCommand, NOTHING_MATCHED, USAGE};
use crate::Result;

/// Runs a `job` command on every broker's list queues (or the one subscription named).
pub(super) async fn run(ops: &[Operator], command: JobCommand) -> Result<ExitCode> {
    for o in ops {
        o.connect().await?;
    }
    match command {
        JobCommand::Show { id, json } => {
            let mut found = Vec::new();
            for o in ops {
                found.extend(o.find_job(&id).await?);
            }
            let record = match ops.first() {
                Some(o) => o.job_record(&id).await?,
                None => None,
            };
            if found.is_empty() && record.is_none() {
                eprintln!(
                    "no job `{id}` waits, runs, is delayed or dead in this app's list queues"
                );
                return Ok(ExitCode::from(NOTHING_MATCHED));
            }
            let view = serde_json::json!({
                "jobs": found,
                "record": record.as_ref().map(|r| serde_json::json!({
                    "progress": r.progress.as_deref().map(String::from_utf8_lossy),
                    "result": r.result.as_deref().map(String::from_utf8_lossy),
                    "error": r.error,
                })),
            });
            print_out(json, &view, || show_text(&found, &view["record"]))?;
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
                    "error: no state `{state}`; use queued, running, delayed, retrying or dead"
                );
                return Ok(ExitCode::from(USAGE));
            };
            let mut jobs = Vec::new();
            for o in ops {
                for q in o.subscriptions().iter().filter(|q| q.transport == "list") {
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

/// `job show` in words: each place the job is, then its handler's record.
fn show_text(found: &[Job], record: &serde_json::Value) -> String {
    let mut out = String::new();
    for j in found {
        out.push_str(&line(j));
        for (k, v) in &j.headers {
            out.push_str(&format!("  header {k}={v}\n"));
        }
        let payload = serde_json::to_string_pretty(&j.payload).unwrap_or_default();
        out.push_str(&format!("  payload ({} bytes):\n{payload}\n", j.size));
    }
    if !record.is_null() {
        out.push_str(&format!("record: {record}\n"));
    }
    out
}
