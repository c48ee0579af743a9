//! One job's story beyond where it stands: its step records (`K.steps:<id>`, `crate::steps`:
//! each step's name, state, when it ran and how long, its result's size or its error; a durable
//! sleep's wake-up time and a wait's deadline; when the record expires) and the flow it is a
//! child of (the record its `rs.flow` header names). Reads only: `HKEYS` (a record holds at
//! most `MAX_STEP_FIELDS` names), then `HSTRLEN` of each field and `HGET` of each small one (a
//! timing, a sleep, a wait, an error of at most 4 KiB), `PTTL` and `TIME`, in one pipeline on
//! the record's slot; a parent flow's `HGETALL`.

use std::collections::HashMap;

use fred::prelude::*;
use ruststream_core::Result;
use ruststream_core::flow::{CHILD_HEADER, FlowState};
use ruststream_core::steps::parse_timing;
use serde::{Deserialize, Serialize};

use super::Operator;
use super::jobs::Job;
use crate::error::core;

/// Where one recorded step of a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StepState {
    /// Its result is recorded (a sleep: it woke up; a wait: its signal came or it timed out).
    Recorded,
    /// Its last run failed and no result is recorded: its error is.
    Failed,
    /// A durable sleep not over yet.
    Sleeping,
    /// A wait for a signal that has not come, before its deadline: the message is parked.
    Waiting,
}

impl StepState {
    /// The state as a word: `recorded`, `failed`, `sleeping` or `waiting`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recorded => "recorded",
            Self::Failed => "failed",
            Self::Sleeping => "sleeping",
            Self::Waiting => "waiting",
        }
    }
}

/// One recorded step of a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Step {
    /// The step's name (`sleep:<n>` for a durable sleep, `wait:<signal>` for a wait, `cursor`
    /// for the last checkpoint, `signal:<name>` for a signal no wait has reached yet).
    pub name: String,
    /// Where it stands.
    pub state: StepState,
    /// The size of its recorded result (a wait's: its signal's payload), in bytes.
    pub size: u64,
    /// When its last run began, ms since the epoch on the server's clock (a sleep or a wait:
    /// when it began); `None` when the record holds no timing for it.
    pub began_ms: Option<u64>,
    /// How long its last run took, in ms (a sleep: its length; a wait: its timeout).
    pub took_ms: Option<u64>,
    /// A durable sleep: in how many ms it wakes up; a wait: in how many ms its deadline passes
    /// (negative: that long ago).
    pub wakes_in_ms: Option<i64>,
    /// A failed step: its last error.
    pub error: Option<String>,
    /// A durable sleep: when it wakes up; a wait: its deadline (ms since the epoch, on the
    /// server's clock).
    pub until_ms: Option<u64>,
}

/// A job's step record.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Steps {
    /// Its steps, in the order they began (those without a timing last, by name).
    pub steps: Vec<Step>,
    /// In how many ms the record expires (`None`: no expiry set).
    pub expires_in_ms: Option<i64>,
}

/// Whether the field `name` holds a small value the story reads whole.
fn small(name: &str) -> bool {
    ["t:", "sleep:", "wait:", "failed:"]
        .iter()
        .any(|p| name.starts_with(p))
}

impl Operator {
    /// The step record of message `id` of the subscription `name` (on its own queue's key);
    /// `None` when it has none.
    pub async fn steps(&self, name: &str, id: &str) -> Result<Option<Steps>> {
        let q = self.queue(name)?;
        let key = self.conns.keys.steps(&q.queue, id);
        let client = self.conns.pool()?.next().clone();
        let mut names: Vec<String> = client.hkeys(&key).await.map_err(core)?;
        if names.is_empty() {
            return Ok(None);
        }
        names.sort();
        let pipeline = client.pipeline();
        for n in &names {
            let () = pipeline.hstrlen(&key, n.as_str()).await.map_err(core)?;
        }
        let read: Vec<&String> = names.iter().filter(|n| small(n)).collect();
        for n in &read {
            let () = pipeline.hget(&key, n.as_str()).await.map_err(core)?;
        }
        let () = pipeline.pttl(&key).await.map_err(core)?;
        let mut replies: Vec<Value> = pipeline.all().await.map_err(core)?;
        let now = super::inspect::server_ms(&client).await?;
        let left = replies.pop().and_then(|v| v.as_i64()).filter(|ms| *ms >= 0);
        let values: HashMap<&str, String> = read
            .iter()
            .map(|n| n.as_str())
            .zip(replies.split_off(names.len().min(replies.len())))
            .filter_map(|(n, v)| Some((n, v.as_string()?)))
            .collect();
        let sizes: HashMap<&str, u64> = names
            .iter()
            .map(String::as_str)
            .zip(replies.iter().map(|v| v.as_u64().unwrap_or(0)))
            .collect();
        let record = Record { now, sizes, values };
        let mut steps: Vec<Step> = names.iter().filter_map(|n| record.step(n)).collect();
        steps.sort_by_key(|st| (st.began_ms.unwrap_or(u64::MAX), st.name.clone()));
        Ok(Some(Steps {
            steps,
            expires_in_ms: left,
        }))
    }

    /// The flow `job` is a child of (the record its `rs.flow` header names, when it is one of
    /// this app's flow records); `None` when it is no flow's child or the record is gone.
    pub async fn parent_flow(&self, job: &Job) -> Result<Option<FlowState>> {
        let Some(record) = job.headers.get(CHILD_HEADER) else {
            return Ok(None);
        };
        if !is_flow_record(record, self.conns.keys.prefix()) {
            return Ok(None);
        }
        let client = self.conns.pool()?.next().clone();
        crate::flow::read(&client, record).await
    }
}

/// Whether `key` (from a header: untrusted) names a flow record under `prefix`.
fn is_flow_record(key: &str, prefix: &str) -> bool {
    key.starts_with(prefix) && key.contains(".flow:")
}

/// A step record as the story read it: each field's size, the small fields' values, and the
/// server's time of the read.
struct Record<'a> {
    now: i64,
    sizes: HashMap<&'a str, u64>,
    values: HashMap<&'a str, String>,
}

impl Record<'_> {
    /// The step the field `name` stands for; `None` for a field that is part of another's
    /// (a timing, a failure of a step recorded since, a signal its wait shows).
    fn step(&self, name: &str) -> Option<Step> {
        let size = |f: &str| self.sizes.get(f).copied().unwrap_or(0);
        let value = |f: &str| self.values.get(f).map(String::as_str);
        let timing = |f: &str| value(&format!("t:{f}")).and_then(parse_timing);
        let until = |f: &str| value(f).and_then(|v| v.parse::<u64>().ok());
        let wakes = |f: &str| until(f).map(|at| i64::try_from(at).unwrap_or(i64::MAX) - self.now);
        let mut step = Step {
            name: name.to_owned(),
            state: StepState::Recorded,
            size: size(name),
            began_ms: None,
            took_ms: None,
            wakes_in_ms: None,
            error: None,
            until_ms: None,
        };
        let mut of = name;
        if name.starts_with("t:") {
            return None;
        } else if let Some(step_name) = name.strip_prefix("failed:") {
            if self.sizes.contains_key(step_name) {
                return None;
            }
            of = step_name;
            step.name = step_name.to_owned();
            step.state = StepState::Failed;
            step.size = 0;
            step.error =
                value(name).map(|e| serde_json::from_str(e).unwrap_or_else(|_| e.to_owned()));
        } else if let Some(signal) = name.strip_prefix("signal:") {
            if self.sizes.contains_key(format!("wait:{signal}").as_str()) {
                return None;
            }
        } else if name.starts_with("sleep:") {
            step.size = 0;
            step.until_ms = until(name);
            step.wakes_in_ms = wakes(name);
            if step.wakes_in_ms.is_some_and(|w| w > 0) {
                step.state = StepState::Sleeping;
            }
        } else if let Some(signal) = name.strip_prefix("wait:") {
            let payload = format!("signal:{signal}");
            step.size = size(&payload);
            step.until_ms = until(name);
            step.wakes_in_ms = wakes(name);
            if !self.sizes.contains_key(payload.as_str()) && step.wakes_in_ms.is_some_and(|w| w > 0)
            {
                step.state = StepState::Waiting;
            }
        }
        if let Some((began, took)) = timing(of) {
            step.began_ms = Some(began);
            step.took_ms = Some(took);
        }
        Some(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_as_steps_with_their_state_and_timing() {
        let fields = [
            ("charge", "\"paid\""),
            ("t:charge", "1000,25"),
            ("failed:reserve", "\"down\""),
            ("t:reserve", "1100,7"),
            ("sleep:1", "90000"),
            ("t:sleep:1", "1200,88800"),
            ("wait:go", "95000"),
            ("t:wait:go", "1300,93700"),
        ];
        let record = Record {
            now: 50_000,
            sizes: fields.iter().map(|(n, v)| (*n, v.len() as u64)).collect(),
            values: fields
                .iter()
                .filter(|(n, _)| small(n))
                .map(|(n, v)| (*n, (*v).to_owned()))
                .collect(),
        };
        let charge = record.step("charge").expect("a step");
        assert_eq!(charge.state, StepState::Recorded);
        assert_eq!(
            (charge.began_ms, charge.took_ms, charge.size),
            (Some(1000), Some(25), 6)
        );
        assert!(
            record.step("t:charge").is_none(),
            "a timing is part of its step"
        );
        let reserve = record.step("failed:reserve").expect("a failed step");
        assert_eq!(
            (reserve.name.as_str(), reserve.state),
            ("reserve", StepState::Failed)
        );
        assert_eq!(reserve.error.as_deref(), Some("down"));
        assert_eq!(reserve.took_ms, Some(7));
        let sleep = record.step("sleep:1").expect("a sleep");
        assert_eq!(sleep.state, StepState::Sleeping);
        assert_eq!(
            (sleep.until_ms, sleep.wakes_in_ms),
            (Some(90_000), Some(40_000))
        );
        let wait = record.step("wait:go").expect("a wait");
        assert_eq!(wait.state, StepState::Waiting);
        assert_eq!((wait.began_ms, wait.until_ms), (Some(1300), Some(95_000)));
    }

    #[test]
    fn only_a_flow_record_of_this_prefix_is_read() {
        assert!(is_flow_record("app:{reports}.flow:f1", "app:"));
        assert!(!is_flow_record("app:{reports}", "app:"));
        assert!(!is_flow_record("other:{reports}.flow:f1", "app:"));
    }
}
