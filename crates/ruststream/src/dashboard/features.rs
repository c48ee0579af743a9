//! `/features`: the periodic jobs every instance registered (schedule, zone, where they publish,
//! last and next tick) and each list's fair groups (the largest groups, their waiting counts,
//! which are paused).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{Markup, html};
use ruststream_redis::operate::{Inspection, PeriodicJob};

use super::Shared;
use super::page::{self, Ctx, layout, ms};

pub(super) async fn features(State(s): State<Shared>) -> Response {
    let mut periodic = Vec::new();
    let mut grouped = Vec::new();
    for (b, op) in s.ops.iter().enumerate() {
        match op.periodic().await {
            Ok(jobs) => periodic.extend(jobs),
            Err(e) => return s.failure(StatusCode::BAD_GATEWAY, &e.to_string()),
        }
        match op.inspect(None).await {
            Ok(all) => grouped.extend(
                all.into_iter()
                    .filter(|i| i.groups.is_some())
                    .map(|i| (b, i)),
            ),
            Err(e) => return s.failure(StatusCode::BAD_GATEWAY, &e.to_string()),
        }
    }
    let ctx = s.ctx(None);
    Html(render(&ctx, &periodic, &grouped).into_string()).into_response()
}

fn render(ctx: &Ctx<'_>, periodic: &[PeriodicJob], grouped: &[(usize, Inspection)]) -> Markup {
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
    layout("Periodic jobs and fair groups", None, ctx, body)
}
