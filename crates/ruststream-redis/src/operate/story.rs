//! One job's story beyond where it stands: its step records (`K.steps:<id>`, `crate::steps`:
//! each step's name and result size, a durable sleep's wake-up time, when the record expires)
//! and the flow it is a child of (the record its `rs.flow` header names). Reads only: `HKEYS`
//! (a record holds at most `MAX_STEPS` names), then `HSTRLEN` of each step and `HGET` of each
//! sleep, `PTTL` and `TIME`, in one pipeline on the record's slot; a parent flow's `HGETALL`.

use fred::prelude::*;
use ruststream_core::Result;
use ruststream_core::flow::{CHILD_HEADER, FlowState};
use serde::Serialize;

use super::Operator;
use super::jobs::Job;
use crate::error::core;

/// One recorded step of a job.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Step {
    /// The step's name (`sleep:<n>` for a durable sleep).
    pub name: String,
    /// The size of its recorded result, in bytes.
    pub size: u64,
    /// A durable sleep: in how many ms it wakes up (negative: it woke up that long ago).
    pub wakes_in_ms: Option<i64>,
}

/// A job's step record.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Steps {
    /// Its steps, in name order.
    pub steps: Vec<Step>,
    /// In how many ms the record expires (`None`: no expiry set).
    pub expires_in_ms: Option<i64>,
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
        let sleeps: Vec<&String> = names.iter().filter(|n| n.starts_with("sleep:")).collect();
        for n in &sleeps {
            let () = pipeline.hget(&key, n.as_str()).await.map_err(core)?;
        }
        let () = pipeline.pttl(&key).await.map_err(core)?;
        let mut replies: Vec<Value> = pipeline.all().await.map_err(core)?;
        let now = super::inspect::server_ms(&client).await?;
        let left = replies.pop().and_then(|v| v.as_i64()).filter(|ms| *ms >= 0);
        let wakes: Vec<Option<i64>> = replies
            .split_off(names.len().min(replies.len()))
            .into_iter()
            .map(|v| v.as_i64().map(|at| at - now))
            .collect();
        let mut wakes = sleeps.iter().map(|n| n.as_str()).zip(wakes);
        let steps = names
            .iter()
            .zip(replies)
            .map(|(n, size)| Step {
                name: n.clone(),
                size: size.as_u64().unwrap_or(0),
                wakes_in_ms: if n.starts_with("sleep:") {
                    wakes.next().and_then(|(_, at)| at)
                } else {
                    None
                },
            })
            .collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_flow_record_of_this_prefix_is_read() {
        assert!(is_flow_record("app:{reports}.flow:f1", "app:"));
        assert!(!is_flow_record("app:{reports}", "app:"));
        assert!(!is_flow_record("other:{reports}.flow:f1", "app:"));
    }
}
