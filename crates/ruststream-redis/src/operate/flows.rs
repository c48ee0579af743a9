//! A queue's open flows and what each waits for: the flow records whose parent goes to the
//! queue (`K.flow:<id>`, `crate::flow`), found by `SCAN MATCH` (on every node of a cluster; no
//! index of them is kept), at most [`FLOWS_SCANNED`] keys in at most
//! [`SCAN_CALLS`](super::SCAN_CALLS) calls, then one `HGETALL` each (a record
//! holds at most 1,000 children).

use ruststream_core::Result;
use ruststream_core::flow::FlowState;

use super::Operator;
use super::scan::scan_keys;
use crate::keys::SourceKeys;
use crate::keys::escape_glob;

/// Most flow records a queue's list of open flows reads.
pub const FLOWS_SCANNED: usize = 1000;

impl Operator {
    /// The flows whose parent goes to the subscription `name` (each partition of the queue
    /// `name`) and still wait for a child, among the first [`FLOWS_SCANNED`] records found.
    pub async fn open_flows(&self, name: &str) -> Result<Vec<FlowState>> {
        let parts = self.partitions_of(name);
        let queues: Vec<&SourceKeys> = if parts.is_empty() {
            vec![self.queue(name)?]
        } else {
            parts
        };
        let client = self.conns.pool()?.next().clone();
        let mut open = Vec::new();
        for q in queues {
            let head = self.conns.keys.derived(&q.queue, ".flow:");
            let keys =
                scan_keys(&client, format!("{}*", escape_glob(&head)), FLOWS_SCANNED).await?;
            let reads = keys.iter().filter_map(|k| k.as_str()).map(|key| {
                let client = client.clone();
                async move { crate::flow::read(&client, key).await }
            });
            let states = futures::future::try_join_all(reads).await?;
            open.extend(
                states
                    .into_iter()
                    .flatten()
                    .filter(|f| f.state == "pending"),
            );
        }
        open.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(open)
    }
}
