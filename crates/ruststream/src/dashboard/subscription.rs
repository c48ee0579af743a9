//! One subscription's page: its charts, state, keys, consumers, rate limit and cap in use, open
//! flows, dead letters, delayed entries and the form that cancels a message by id.

use maud::{Markup, html};
use ruststream_redis::history::{Point, Span};
use ruststream_redis::operate::{DeadLetter, DelayedEntry, Inspection};

use super::chart;
use super::limits::{LimitRow, OpenFlows, flows_table, limits_table};
use super::page::{
    Ctx, action, charts, count, layout, ms, pause_buttons, span_tabs, state_cells,
    subscription_href,
};
use super::view::{headers, payload, urlencode};

/// Seconds between reloads of a subscription's page when asked to reload.
const LIVE_SECS: u32 = 10;

/// What one subscription's page shows.
pub(super) struct Detail<'a> {
    pub(super) b: usize,
    pub(super) inspection: &'a Inspection,
    pub(super) dead: &'a [DeadLetter],
    pub(super) delayed: &'a [DelayedEntry],
    /// Most entries listed per table.
    pub(super) limit: usize,
    /// Its history over `span`.
    pub(super) history: &'a [Point],
    pub(super) span: Span,
    /// Whether the page reloads itself.
    pub(super) live: bool,
    /// Its rate limit and cap in use.
    pub(super) limits: Option<&'a LimitRow>,
    /// Its open flows.
    pub(super) flows: Option<&'a OpenFlows>,
}

/// One subscription: its state and keys, the group's consumers, dead letters, delayed entries.
pub(super) fn subscription(ctx: &Ctx<'_>, d: &Detail<'_>) -> Markup {
    let i = d.inspection;
    let k = &i.keys;
    let keys = [
        ("queue", Some(&k.queue)),
        ("processing", k.processing.as_ref()),
        ("recovery", k.recovery.as_ref()),
        ("group", k.group.as_ref()),
        ("delayed", k.delayed.as_ref()),
        ("delayed payloads", k.delayed_payloads.as_ref()),
        ("dead", k.dead.as_ref()),
        ("paused", k.paused.as_ref()),
    ];
    let href = subscription_href(d.b, &k.name);
    let (span_key, _) = chart::span_name(d.span);
    let body = html! {
        p { (k.transport) ", " (k.mode) " " (pause_buttons(ctx, d.b, i)) }
        (span_tabs(&format!("{href}&"), d.span))
        (charts("", d.span, d.history))
        p.muted {
            @if d.live { "Reloads every " (LIVE_SECS) " s. " a href=(format!("{href}&span={span_key}")) { "Stop reloading" } }
            @else { a #live href=(format!("{href}&span={span_key}&live=1")) { "Reload every " (LIVE_SECS) " s" } }
            " · " a href=(format!("/jobs?b={}&name={}", d.b, urlencode(&k.name))) { "Jobs of this subscription" }
        }
        table #state {
            tr { th { "ready" } th { "in flight" } th { "delayed" } th { "dead" } th { "paused" } th { "group / subscribers" } }
            tr { (state_cells(i)) }
        }
        h2 { "Keys" }
        table #keys { @for (what, key) in keys { @if let Some(key) = key { tr { th { (what) } td { code { (key) } } } } } }
        @if let Some(g) = &i.group {
            h2 { "Consumers " small { "last delivered " (g.last_delivered_id) } }
            table #consumers {
                tr { th { "consumer" } th { "pending" } th { "idle" } }
                @for c in &g.consumers { tr { td { (c.name) } td.n { (c.pending) } td.n { (ms(c.idle_ms as i64)) } } }
            }
        }
        @if let Some(l) = d.limits { h2 { "Rate limit and cap" } (limits_table(std::slice::from_ref(l))) }
        @if let Some(f) = d.flows { h2 { "Open flows " small { (f.flows.len()) } } (flows_table(f)) }
        @if k.dead.is_some() { (dead_letters(ctx, d)) }
        @if k.delayed.is_some() { (delayed(ctx, d)) }
        @if k.transport == "list" || k.transport == "stream" { (cancel_message(ctx, d.b, &k.name)) }
    };
    layout(&k.name, d.live.then_some(LIVE_SECS), ctx, body)
}

fn dead_letters(ctx: &Ctx<'_>, d: &Detail<'_>) -> Markup {
    let name = &d.inspection.keys.name;
    html! {
        h2 { "Dead letters " small { (count(d.inspection.dead)) " (the oldest " (d.limit) " shown)" } }
        @if !d.dead.is_empty() {
            p { (action(ctx, d.b, name, "requeue", None, "Requeue all")) (action(ctx, d.b, name, "purge", None, "Purge all")) }
        }
        table #dead {
            tr { th { "id" } th { "attempt" } th { "reason" } th { "headers" } th { "payload" } th {} }
            @for e in d.dead {
                tr data-id=(e.id) {
                    td { code { (e.id) } } td.n { (e.attempt) } td { (e.reason.as_deref().unwrap_or("–")) }
                    td { (headers(&e.headers)) } td { (payload(&e.payload, Some(e.size))) }
                    td { (action(ctx, d.b, name, "requeue", Some(&e.id), "Requeue")) (action(ctx, d.b, name, "purge", Some(&e.id), "Purge")) }
                }
            }
        }
    }
}

fn delayed(ctx: &Ctx<'_>, d: &Detail<'_>) -> Markup {
    let name = &d.inspection.keys.name;
    html! {
        h2 { "Delayed " small { (count(d.inspection.delayed)) " (the earliest " (d.limit) " shown)" } }
        @if !d.delayed.is_empty() {
            p { (action(ctx, d.b, name, "promote", None, "Promote all")) (action(ctx, d.b, name, "cancel", None, "Cancel all")) }
        }
        table #delayed {
            tr { th { "id" } th { "due in" } th { "attempt" } th { "headers" } th { "payload" } th {} }
            @for e in d.delayed {
                tr data-id=(e.id) {
                    td { code { (e.id) } } td.n { (ms(e.due_in_ms)) } td.n { (e.attempt) }
                    td { (headers(&e.headers)) } td { (payload(&e.payload, None)) }
                    td { (action(ctx, d.b, name, "promote", Some(&e.id), "Promote")) (action(ctx, d.b, name, "cancel", Some(&e.id), "Cancel")) }
                }
            }
        }
    }
}

/// The form that cancels one message of a list or stream by id, wherever it is (`cancel SUB --id ID`).
fn cancel_message(ctx: &Ctx<'_>, b: usize, name: &str) -> Markup {
    html! {
        h2 { "Cancel a message" }
        form #cancel-message method="post" action="/action" data-op="cancel-message" {
            input type="hidden" name="csrf" value=(ctx.csrf);
            input type="hidden" name="b" value=(b);
            input type="hidden" name="name" value=(name);
            input type="hidden" name="op" value="cancel-message";
            input type="text" name="id" placeholder="message id" required;
            " "
            button type="submit" { "Cancel it" }
            " "
            small { "delayed: removed; running: its handler is told, and dropped after its grace; queued: dropped when claimed" }
        }
    }
}
