//! The nodes of a Redis Cluster, for the benchmark's per-node figures: who they are (`CLUSTER
//! NODES` on the first URL), which primary holds which of the queue's keys (by hash slot), and
//! each node's CPU (`INFO cpu`: `used_cpu_sys` + `used_cpu_user`, every thread of the server)
//! and command counts (`INFO commandstats`) before and after a phase.
//!
//! Each node is read through a client of its own (no redirects), so a reading is that node's
//! alone. Replicas are read too: replicating the primaries' writes costs them CPU as well.

use std::collections::HashMap;
use std::fmt::Write as _;

use fred::prelude::*;

use crate::BoxError;
use crate::raw;

/// Slot ranges, inclusive.
type Slots = Vec<(u16, u16)>;

/// One node of the cluster.
pub struct Node {
    /// `host:port`.
    pub addr: String,
    /// Whether it is a primary: a master serving slots (else a replica).
    pub primary: bool,
    /// Slot ranges it serves (primaries only).
    slots: Slots,
    /// A client on this node alone.
    pub client: Client,
}

/// Every node of the cluster, primaries first, each in port order.
pub struct Nodes(pub Vec<Node>);

/// CPU seconds per node (in [`Nodes`] order) and the command counts of the primaries, summed.
pub struct Sample {
    cpu_s: Vec<f64>,
    pub calls: HashMap<String, (u64, u64)>,
}

impl Nodes {
    /// Discovers the nodes from the first of `urls` and connects to each.
    pub async fn discover(urls: &[String]) -> Result<Self, BoxError> {
        let first = urls.first().ok_or("--cluster needs at least one URL")?;
        let seed = raw::client(first).await?;
        let text: String = seed.custom(raw::cmd("CLUSTER"), vec!["NODES"]).await?;
        let _ = seed.quit().await;
        let mut nodes = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (addr, primary, slots) = parse_line(line)
                .ok_or_else(|| format!("cannot read the CLUSTER NODES line `{line}`"))?;
            let client = raw::client(&format!("redis://{addr}")).await?;
            nodes.push(Node {
                addr,
                primary,
                slots,
                client,
            });
        }
        nodes.sort_by(|a, b| (!a.primary, &a.addr).cmp(&(!b.primary, &b.addr)));
        if !nodes.iter().any(|n| n.primary) {
            return Err("CLUSTER NODES names no primary".into());
        }
        Ok(Self(nodes))
    }

    /// The primaries.
    pub fn primaries(&self) -> impl Iterator<Item = &Node> {
        self.0.iter().filter(|n| n.primary)
    }

    /// Reads every node's CPU and the primaries' command counts.
    pub async fn sample(&self) -> Result<Sample, BoxError> {
        let mut cpu_s = Vec::with_capacity(self.0.len());
        let mut calls: HashMap<String, (u64, u64)> = HashMap::new();
        for node in &self.0 {
            let info: String = node.client.info(Some(fred::types::InfoKind::Cpu)).await?;
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .ok_or_else(|| format!("{}: no {name} in INFO cpu", node.addr))
            };
            cpu_s.push(field("used_cpu_sys")? + field("used_cpu_user")?);
            if node.primary {
                for (k, (c, us)) in crate::command_calls(&node.client).await? {
                    let e = calls.entry(k).or_default();
                    e.0 += c;
                    e.1 += us;
                }
            }
        }
        Ok(Sample { cpu_s, calls })
    }

    /// How many of `keys` each node's slots hold (0 for replicas), in [`Nodes`] order.
    pub fn holders(&self, keys: &[String]) -> Vec<usize> {
        let slots: Vec<u16> = keys
            .iter()
            .map(|k| fred::util::redis_keyslot(k.as_bytes()))
            .collect();
        self.0
            .iter()
            .map(|n| {
                slots
                    .iter()
                    .filter(|s| n.slots.iter().any(|(lo, hi)| (lo..=hi).contains(s)))
                    .count()
            })
            .collect()
    }

    /// One `NODE` line per node: its role, how many of the queue's keys it holds, and for each
    /// phase (`name`, before, after) the CPU seconds it used and its CPU µs per message.
    pub fn lines(
        &self,
        head: &str,
        n: u64,
        holders: &[usize],
        phases: &[(&str, &Sample, &Sample)],
    ) -> Vec<String> {
        #[allow(clippy::cast_precision_loss)]
        let per_msg = |s: f64| s * 1e6 / n.max(1) as f64;
        self.0
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let role = if node.primary { "primary" } else { "replica" };
                let mut s = format!(
                    "NODE {head} node={} role={role} queue_keys={}",
                    node.addr,
                    holders.get(i).copied().unwrap_or(0)
                );
                for (name, a, b) in phases {
                    let used = (b.cpu_s[i] - a.cpu_s[i]).max(0.0);
                    let _ = write!(
                        s,
                        " {name}_cpu_s={used:.3} {name}_us_per_msg={:.2}",
                        per_msg(used)
                    );
                }
                s
            })
            .collect()
    }

    /// The CPU µs per message of a phase summed over all primaries, and the busiest primary's.
    pub fn primary_us_per_msg(&self, n: u64, a: &Sample, b: &Sample) -> (f64, f64) {
        #[allow(clippy::cast_precision_loss)]
        let n = n.max(1) as f64;
        let used: Vec<f64> = self
            .0
            .iter()
            .enumerate()
            .filter(|(_, node)| node.primary)
            .map(|(i, _)| (b.cpu_s[i] - a.cpu_s[i]).max(0.0) * 1e6 / n)
            .collect();
        (used.iter().sum(), used.iter().copied().fold(0.0, f64::max))
    }
}

/// `(host:port, primary, slot ranges)` of one `CLUSTER NODES` line:
/// `<id> <ip:port@cport[,hostname]> <flags> <primary-id> <ping> <pong> <epoch> <link> <slot>...`.
fn parse_line(line: &str) -> Option<(String, bool, Slots)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let addr = fields.get(1)?.split(['@', ',']).next()?.to_owned();
    let flags = fields.get(2)?;
    let slots: Slots = fields
        .iter()
        .skip(8)
        // `[slot->-node]` / `[slot-<-node]`: a slot being migrated, still served here.
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
            None => s.parse().ok().map(|x| (x, x)),
        })
        .collect();
    // A node this view still calls a master but that serves no slot (a replica whose new role
    // has not reached the seed yet) is no primary: its keys would answer MOVED.
    let primary = flags.split(',').any(|f| f == "master") && !slots.is_empty();
    Some((addr, primary, slots))
}

#[cfg(test)]
mod tests {
    use super::parse_line;

    #[test]
    fn reads_a_primary_and_a_replica_line() {
        let p = "07c3 127.0.0.1:30004@40004 myself,master - 0 0 1 connected 0-5460 6000";
        let r = "e7d1 127.0.0.1:30005@40005,host slave 07c3 0 1 2 connected";
        assert_eq!(
            parse_line(p),
            Some((
                "127.0.0.1:30004".to_owned(),
                true,
                vec![(0, 5460), (6000, 6000)]
            ))
        );
        assert_eq!(
            parse_line(r),
            Some(("127.0.0.1:30005".to_owned(), false, vec![]))
        );
    }
}
