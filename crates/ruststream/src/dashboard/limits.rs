//! Rate limits, caps and open flows, as the features page and a subscription's page show them:
//! each limit's use now against its limit, each cap's in-flight count against its cap, and each
//! open flow with the children it still waits for.

use maud::{Markup, html};
use ruststream_core::{ChildOutcome, FlowState};
use ruststream_redis::operate::{Inspection, Operator, RateUse};

use super::jobs::job_href;
use super::page::{ms, subscription_href};

/// One subscription's limits in use.
pub(super) struct LimitRow {
    pub(super) b: usize,
    pub(super) name: String,
    /// The partitioned queue whose whole limit this row shows, when it is one.
    pub(super) whole: Option<String>,
    pub(super) rate: Option<RateUse>,
    pub(super) cap: Option<u32>,
    pub(super) in_flight: Option<u64>,
}

/// One queue's open flows.
pub(super) struct OpenFlows {
    pub(super) b: usize,
    pub(super) name: String,
    pub(super) flows: Vec<FlowState>,
}

/// The limits of `inspection`'s subscription (`None` when it has neither a rate limit nor a cap).
pub(super) async fn limits_of(
    op: &Operator,
    b: usize,
    i: &Inspection,
) -> crate::Result<Option<LimitRow>> {
    let k = &i.keys;
    if k.rate_limit.is_none() && k.max_in_flight.is_none() {
        return Ok(None);
    }
    Ok(Some(LimitRow {
        b,
        name: k.name.clone(),
        // A partitioned queue's limit holds over the whole queue; its first partition carries it.
        whole: k.partition_of.clone().filter(|_| k.rate_limit.is_some()),
        rate: op.rate_use(&k.name).await?,
        cap: k.max_in_flight,
        in_flight: i.in_flight,
    }))
}

/// The open flows of `name` (`None` when it has none, or is no list or stream).
pub(super) async fn flows_of(
    op: &Operator,
    b: usize,
    name: &str,
    transport: &str,
) -> crate::Result<Option<OpenFlows>> {
    if transport != "list" && transport != "stream" {
        return Ok(None);
    }
    let flows = op.open_flows(name).await?;
    Ok((!flows.is_empty()).then(|| OpenFlows {
        b,
        name: name.to_owned(),
        flows,
    }))
}

pub(super) fn limits_table(rows: &[LimitRow]) -> Markup {
    html! {
        div.scroll { table #limits {
            tr { th { "subscription" } th { "rate limit" } th { "in use now" } th { "cap (max in flight)" } th { "in flight" } }
            @for r in rows {
                tr data-name=(r.name) {
                    td { a href=(subscription_href(r.b, &r.name)) { (r.name) } }
                    td { @if let Some(u) = &r.rate {
                        (u.limit.n) " per " (ms(i64::try_from(u.limit.per_ms).unwrap_or(i64::MAX)))
                        @if let Some(h) = &u.limit.by_header { " for each " code { (h) } }
                        @if let Some(q) = &r.whole { ", over all of " code { (q) } "'s partitions" }
                    } @else { "–" } }
                    td.rate-use { @if let Some(u) = &r.rate {
                        @if u.limit.by_header.is_some() {
                            (u.keys) " key(s) active"
                            @for (k, used) in &u.busiest { br; code { (k) } ": " (used) " of " (u.limit.n) }
                        } @else { (u.used) " of " (u.limit.n) }
                    } @else { "–" } }
                    td.n { @if let Some(c) = r.cap { (c) } @else { "–" } }
                    td.n.cap-use { @if let Some(n) = r.in_flight { (n) @if let Some(c) = r.cap { " of " (c) } } @else { "–" } }
                }
            }
        } }
    }
}

pub(super) fn flows_table(open: &OpenFlows) -> Markup {
    html! {
        div.scroll { table.flows data-name=(open.name) {
            tr { th { "flow (parent id)" } th { "children done" } th { "waits for" } }
            @for f in &open.flows {
                tr data-id=(f.id) {
                    td { code { (f.id) } }
                    td.n { (f.children.iter().filter(|c| !matches!(c.outcome, ChildOutcome::Pending)).count()) " of " (f.children.len()) }
                    td { @for c in f.children.iter().filter(|c| matches!(c.outcome, ChildOutcome::Pending)).take(20) {
                        a href=(job_href(open.b, "", &c.id)) { code { (c.id) } } " "
                    } }
                }
            }
        } }
    }
}
