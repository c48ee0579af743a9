//! The dashboard's HTML, rendered on the server with `maud` (every spliced value is escaped): the
//! overview of every subscription, one subscription's page (its keys, consumers, dead letters and
//! delayed entries), the login page and the error page. No script: the overview reloads itself
//! with a `<meta http-equiv="refresh">`, and every change is a form POST carrying the CSRF token.

use maud::{DOCTYPE, Markup, html};
use ruststream_redis::operate::{DeadLetter, DelayedEntry, Inspection};

use super::rates::Rate;

/// Seconds between reloads of the overview.
pub(super) const REFRESH_SECS: u32 = 5;

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}\
th{background:#f3f3f3}td.n{text-align:right}pre{margin:0;max-width:40em;overflow:auto}\
form.inline{display:inline}button{margin:0 .2em .2em 0}.paused{color:#b00;font-weight:bold}\
.done{background:#e8f5e9;padding:.5em}.err{background:#fdecea;padding:.5em}h2 small{color:#666;font-weight:normal}";

/// What every page of a request shares.
pub(super) struct Ctx<'a> {
    /// The CSRF token the forms carry.
    pub(super) csrf: &'a str,
    /// The outcome of the change that led here, if any.
    pub(super) done: Option<&'a str>,
    /// Whether the rates are live (served beside the app).
    pub(super) live: bool,
}

/// One broker's subscriptions, as the overview shows them.
pub(super) struct BrokerView {
    pub(super) target: String,
    pub(super) rows: Vec<(Inspection, Option<Rate>)>,
}

fn layout(title: &str, refresh: bool, ctx: &Ctx<'_>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @if refresh { meta http-equiv="refresh" content=(REFRESH_SECS); }
                title { (title) " · RustStream" }
                style { (STYLE) }
            }
            body {
                p { a href="/" { "All subscriptions" } }
                h1 { (title) }
                @if let Some(done) = ctx.done { p.done #done { (done) } }
                (body)
            }
        }
    }
}

/// A form of one hidden-field change: `op` on subscription `name` of broker `b`, entry `id`
/// (`None`: every entry), coming back to `back`.
fn action(ctx: &Ctx<'_>, b: usize, name: &str, op: &str, id: Option<&str>, label: &str) -> Markup {
    html! {
        form.inline method="post" action="/action" data-op=(op) data-id=(id.unwrap_or("*")) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            input type="hidden" name="b" value=(b);
            input type="hidden" name="name" value=(name);
            input type="hidden" name="op" value=(op);
            @if let Some(id) = id { input type="hidden" name="id" value=(id); }
            button type="submit" { (label) }
        }
    }
}

/// The link to a subscription's page.
pub(super) fn subscription_href(b: usize, name: &str) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("b", &b.to_string())
        .append_pair("name", name)
        .finish();
    format!("/subscription?{query}")
}

fn count(v: Option<u64>) -> String {
    v.map_or_else(|| "–".into(), |n| n.to_string())
}

/// Milliseconds for people: `850 ms`, `12.5 s`, `3.2 min`, `4.1 h`, `2.0 d`.
pub(super) fn ms(v: i64) -> String {
    let a = v.unsigned_abs() as f64;
    let (n, unit) = match a {
        a if a < 1_000.0 => return format!("{v} ms"),
        a if a < 60_000.0 => (a / 1_000.0, "s"),
        a if a < 3_600_000.0 => (a / 60_000.0, "min"),
        a if a < 86_400_000.0 => (a / 3_600_000.0, "h"),
        a => (a / 86_400_000.0, "d"),
    };
    format!("{}{n:.1} {unit}", if v < 0 { "-" } else { "" })
}

fn pause_buttons(ctx: &Ctx<'_>, b: usize, i: &Inspection) -> Markup {
    html! {
        @match i.paused {
            Some(true) => (action(ctx, b, &i.keys.name, "resume", None, "Resume")),
            Some(false) => (action(ctx, b, &i.keys.name, "pause", None, "Pause")),
            None => {},
        }
    }
}

fn state_cells(i: &Inspection) -> Markup {
    html! {
        td.n { (count(i.ready)) }
        td.n {
            (count(i.in_flight))
            @if let Some(idle) = i.oldest_claim_idle_ms { br; small { "oldest claim idle " (ms(idle as i64)) } }
        }
        td.n {
            (count(i.delayed))
            @if let Some(due) = i.next_due_in_ms { br; small { "next due in " (ms(due)) } }
        }
        td.n { (count(i.dead)) }
        td {
            @match i.paused { Some(true) => span.paused { "paused" }, Some(false) => "no", None => "–" }
        }
        td {
            @if let Some(g) = &i.group {
                "lag " (count(g.lag)) ", pending " (g.pending)
            } @else if let Some(s) = i.subscribers { (s) " subscribers" } @else { "–" }
        }
    }
}

/// The overview: every broker's subscriptions with their state, rates and pause buttons.
pub(super) fn overview(ctx: &Ctx<'_>, brokers: &[BrokerView]) -> Markup {
    let body = html! {
        @if !ctx.live {
            p { small { "Live rates show when the dashboard is served beside the app (run --dashboard ADDR)." } }
        }
        @for (b, broker) in brokers.iter().enumerate() {
            h2 { "Redis " small { (broker.target) } }
            table #subscriptions {
                tr {
                    th { "subscription" } th { "transport" } th { "mode" } th { "ready" }
                    th { "in flight" } th { "delayed" } th { "dead" } th { "paused" }
                    th { "group / subscribers" } th { "handled/s" } th { "failed/s" } th {}
                }
                @for (i, rate) in &broker.rows {
                    tr data-name=(i.keys.name) {
                        td { a href=(subscription_href(b, &i.keys.name)) { (i.keys.name) } }
                        td { (i.keys.transport) } td { (i.keys.mode) }
                        (state_cells(i))
                        td.n { @if let Some(r) = rate { (format!("{:.1}", r.handled)) } @else { "–" } }
                        td.n { @if let Some(r) = rate { (format!("{:.1}", r.failed)) } @else { "–" } }
                        td { (pause_buttons(ctx, b, i)) }
                    }
                }
            }
        }
    };
    layout("RustStream dashboard", true, ctx, body)
}

/// What one subscription's page shows.
pub(super) struct Detail<'a> {
    pub(super) b: usize,
    pub(super) inspection: &'a Inspection,
    pub(super) dead: &'a [DeadLetter],
    pub(super) delayed: &'a [DelayedEntry],
    /// Most entries listed per table.
    pub(super) limit: usize,
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
    let body = html! {
        p { (k.transport) ", " (k.mode) " " (pause_buttons(ctx, d.b, i)) }
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
        @if k.dead.is_some() { (dead_letters(ctx, d)) }
        @if k.delayed.is_some() { (delayed(ctx, d)) }
        @if k.transport == "list" || k.transport == "stream" { (cancel_message(ctx, d.b, &k.name)) }
    };
    layout(&k.name, false, ctx, body)
}

fn headers(h: &ruststream_core::Headers) -> Markup {
    html! { @for (k, v) in h { code { (k) "=" (v) } br; } }
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
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
                    td { (headers(&e.headers)) } td { pre { (pretty(&e.payload)) } small { (e.size) " bytes" } }
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
                    td { (headers(&e.headers)) } td { pre { (pretty(&e.payload)) } }
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

/// The login page of a dashboard with a token.
pub(super) fn login(failed: bool) -> Markup {
    let ctx = Ctx {
        csrf: "",
        done: None,
        live: false,
    };
    let body = html! {
        @if failed { p.err { "That is not the dashboard's token." } }
        form method="post" action="/login" {
            label { "Token " input type="password" name="token" autofocus; }
            " " button type="submit" { "Log in" }
        }
    };
    layout("Log in", false, &ctx, body)
}

/// A failed request's page.
pub(super) fn error(message: &str) -> Markup {
    let ctx = Ctx {
        csrf: "",
        done: None,
        live: false,
    };
    layout("Error", false, &ctx, html! { p.err #error { (message) } })
}
