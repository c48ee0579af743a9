//! `/features`: the periodic jobs every instance registered (schedule, zone, where they publish,
//! last and next tick), each list's fair groups (the largest groups, their waiting counts,
//! which are paused), the rate limits and caps in use, and the open flows of every queue.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{Markup, html};
use ruststream_redis::operate::{FLOWS_SCANNED, Inspection, PeriodicJob};

use super::Shared;
use super::limits::{LimitRow, OpenFlows, flows_of, flows_table, limits_of, limits_table};
use super::page::{self, Ctx, layout, ms};

pub(super) async fn features(State(s): State<Shared>) -> Response {
    let mut f = Found::default();
    let loaded = async {
        for (b, op) in s.ops.iter().enumerate() {
            f.periodic.extend(op.periodic().await?);
            for i in op.inspect(None).await? {
                f.limits.extend(limits_of(op, b, &i).await?);
                f.flows
                    .extend(flows_of(op, b, &i.keys.name, i.keys.transport).await?);
                if i.groups.is_some() {
                    f.grouped.push((b, i));
                }
            }
        }
        crate::Result::Ok(())
    };
    if let Err(e) = loaded.await {
        return s.failure(StatusCode::BAD_GATEWAY, &crate::Error::to_string(&e));
    }
    let ctx = s.ctx(None);
    Html(render(&ctx, &f).into_string()).into_response()
}

/// What the page shows, from every broker.
#[derive(Default)]
struct Found {
    periodic: Vec<PeriodicJob>,
    grouped: Vec<(usize, Inspection)>,
    limits: Vec<LimitRow>,
    flows: Vec<OpenFlows>,
}

fn render(ctx: &Ctx<'_>, f: &Found) -> Markup {
    let (periodic, grouped) = (&f.periodic, &f.grouped);
    let body = html! {
        h2 { "Periodic jobs" }
        @if periodic.is_empty() { p.muted { "No periodic job is registered under this app's prefix." } }
        @else {
            div.scroll { table #periodic {
                tr { th { "name" } th { "schedule" } th { "zone" } th { "publishes to" } th { "last run" } th { "next run" } th { "catch-up" } }
                @for j in periodic {
                    tr data-name=(j.name) {
                        td { (j.name) }
                        td { code { (j.cron) } }
                        td { (j.tz) }
                        td { (j.destination.as_deref().unwrap_or("(its message type's name)")) }
                        td { @if let Some(ago) = j.last_ago_ms { (ms(ago)) " ago" } @else { "never" } }
                        td { @if let Some(next) = j.next_in_ms { "in " (ms(next)) } @else { "–" } }
                        td { (format!("{:?}", j.catch_up)) @if let Some(u) = &j.unreadable { br; small.muted { (u) } } }
                    }
                }
            } }
        }
        h2 { "Fair groups" }
        @if grouped.is_empty() { p.muted { "No list of this app has fair groups." } }
        @for (b, i) in grouped {
            @if let Some(g) = &i.groups {
                h2 { a href=(page::subscription_href(*b, &i.keys.name)) { (i.keys.name) }
                    small { " " (g.groups) " groups with work, " (g.waiting) " waiting, " (g.inbox) " in the inbox, " (g.paused) " paused" } }
                div.scroll { table.groups data-name=(i.keys.name) {
                    tr { th { "group" } th { "waiting" } th { "state" } }
                    @for l in &g.largest {
                        tr {
                            td { @if l.name.is_empty() { "(no group)" } @else { (l.name) } }
                            td.n { (l.waiting) }
                            td { @if l.paused { span.badge.st-paused { "paused" } } @else { span.badge.st-running { "served" } } }
                        }
                    }
                } }
            }
        }
    };
    let body = html! {
        (body)
        h2 { "Rate limits and caps" }
        @if f.limits.is_empty() { p.muted { "No subscription of this app has a rate limit or a cap." } }
        @else { (limits_table(&f.limits)) }
        h2 { "Open flows" }
        @if f.flows.is_empty() { p.muted #no-flows { "No flow waits for its children (among the first " (FLOWS_SCANNED) " records of each queue)." } }
        @for open in &f.flows {
            h2 { a href=(page::subscription_href(open.b, &open.name)) { (open.name) } small { " " (open.flows.len()) " open" } }
            (flows_table(open))
        }
    };
    layout("Periodic jobs, groups, limits and flows", None, ctx, body)
}
