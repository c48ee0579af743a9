//! The dashboard's HTML, rendered on the server with `maud` (every spliced value is escaped): the
//! layout every page shares (one stylesheet, `style.css`; the app's name and version; the job
//! search), the overview of every subscription with its charts, one subscription's page (its
//! charts, keys, consumers, dead letters and delayed entries), the login page and the error page.
//! No script: the overview reloads itself with a `<meta http-equiv="refresh">`, and every change
//! is a form POST carrying the CSRF token.

use maud::{DOCTYPE, Markup, html};
use ruststream_redis::history::{Point, Span};
use ruststream_redis::operate::Inspection;

use super::chart;
use super::rates::Rate;

/// Seconds between reloads of the overview.
pub(super) const REFRESH_SECS: u32 = 5;

/// The one stylesheet, inlined in every page (the CSP allows inline styles, nothing fetched).
const STYLE: &str = include_str!("style.css");

/// What every page of a request shares.
pub(super) struct Ctx<'a> {
    /// The CSRF token the forms carry.
    pub(super) csrf: &'a str,
    /// The outcome of the change that led here, if any.
    pub(super) done: Option<&'a str>,
    /// Whether the rates are live (served beside the app).
    pub(super) live: bool,
    /// The app's name and version.
    pub(super) app: &'a AppLabel,
}

/// The app's name and version, shown on every page.
#[derive(Debug, Clone, Default)]
pub(super) struct AppLabel {
    pub(super) title: String,
    pub(super) version: String,
}

/// One broker's subscriptions, as the overview shows them.
pub(super) struct BrokerView {
    pub(super) target: String,
    pub(super) rows: Vec<Row>,
}

/// One subscription's row of the overview.
pub(super) struct Row {
    pub(super) inspection: Inspection,
    pub(super) rate: Option<Rate>,
    /// Its history over the chosen span (empty for a partition whose queue's row shows it).
    pub(super) history: Vec<Point>,
}

pub(super) fn layout(title: &str, refresh: Option<u32>, ctx: &Ctx<'_>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(secs) = refresh { meta http-equiv="refresh" content=(secs); }
                title { (title) " · " (ctx.app.title) }
                link rel="icon" type="image/svg+xml" href="/favicon.svg";
                style { (maud::PreEscaped(STYLE)) }
            }
            body {
                header.top {
                    a.brand href="/" { (ctx.app.title) small { "v" (ctx.app.version) " · RustStream" } }
                    nav { a href="/" { "Overview" } a href="/jobs" { "Jobs" }  a href="/features" { "Periodic, groups, limits, flows" } }
                    form #search method="get" action="/search" {
                        input type="search" name="q" placeholder="message id, or header=value" aria-label="find a job";
                        button type="submit" { "Find" }
                    }
                }
                main {
                    h1 { (title) }
                    @if let Some(done) = ctx.done { p.done #done { (done) } }
                    (body)
                }
            }
        }
    }
}

/// The dashboard's icon: an orange rounded square with a white stream.
pub(super) const FAVICON: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="7" fill="#b7410e"/><path d="M6 11h14M6 16h20M6 21h11" stroke="#fff" stroke-width="3" stroke-linecap="round"/></svg>"##;

/// A form of one hidden-field change: `op` on subscription `name` of broker `b`, entry `id`
/// (`None`: every entry); the change leads back to the subscription's page.
pub(super) fn action(
    ctx: &Ctx<'_>,
    b: usize,
    name: &str,
    op: &str,
    id: Option<&str>,
    label: &str,
) -> Markup {
    change_form(ctx, b, name, op, id, label, None)
}

/// [`action`] leading back to `back` (a job's page) instead.
pub(super) fn action_back(
    ctx: &Ctx<'_>,
    b: usize,
    name: &str,
    op: &str,
    id: Option<&str>,
    label: &str,
    back: &str,
) -> Markup {
    change_form(ctx, b, name, op, id, label, Some(back))
}

fn change_form(
    ctx: &Ctx<'_>,
    b: usize,
    name: &str,
    op: &str,
    id: Option<&str>,
    label: &str,
    back: Option<&str>,
) -> Markup {
    let danger = matches!(op, "purge" | "cancel" | "cancel-message");
    html! {
        form.inline method="post" action="/action" data-op=(op) data-id=(id.unwrap_or("*")) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            input type="hidden" name="b" value=(b);
            input type="hidden" name="name" value=(name);
            input type="hidden" name="op" value=(op);
            @if let Some(id) = id { input type="hidden" name="id" value=(id); }
            @if let Some(back) = back { input type="hidden" name="back" value=(back); }
            button.danger[danger] type="submit" { (label) }
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

pub(super) fn count(v: Option<u64>) -> String {
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

pub(super) fn pause_buttons(ctx: &Ctx<'_>, b: usize, i: &Inspection) -> Markup {
    html! {
        @match i.paused {
            Some(true) => (action(ctx, b, &i.keys.name, "resume", None, "Resume")),
            Some(false) => (action(ctx, b, &i.keys.name, "pause", None, "Pause")),
            None => {},
        }
    }
}

pub(super) fn state_cells(i: &Inspection) -> Markup {
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

/// The links to the spans a page's charts can show, the current one marked; `base` is the
/// page's own link with its query (`/?`, `/subscription?b=0&name=jobs&`).
pub(super) fn span_tabs(base: &str, span: Span) -> Markup {
    html! {
        nav.tabs #spans {
            @for s in [Span::Hour, Span::Day, Span::Month] {
                @let (key, words) = chart::span_name(s);
                a.on[s == span] href=(format!("{base}span={key}")) { (words) }
            }
        }
    }
}

/// The four charts of a history: throughput, failures, handler time, depth.
pub(super) fn charts(prefix: &str, span: Span, points: &[Point]) -> Markup {
    html! {
        div.charts {
            (chart::chart(&format!("{prefix}throughput"), "Throughput", span, &chart::throughput(points)))
            (chart::chart(&format!("{prefix}failures"), "Failures", span, &chart::failures(points)))
            (chart::chart(&format!("{prefix}latency"), "Handler time", span, &chart::latency(points)))
            (chart::chart(&format!("{prefix}depth"), "Queue depth", span, &chart::depth(points)))
        }
    }
}

/// The overview: the charts of every subscription's history added up, then every broker's
/// subscriptions with their state, rates, a small chart and pause buttons.
pub(super) fn overview(ctx: &Ctx<'_>, span: Span, brokers: &[BrokerView]) -> Markup {
    let mut all: Vec<Point> = Vec::new();
    for row in brokers.iter().flat_map(|b| &b.rows) {
        add_points(&mut all, &row.history);
    }
    let body = html! {
        (span_tabs("/?", span))
        (charts("all-", span, &all))
        @if !ctx.live {
            p.muted { "Per-second rates show when the dashboard is served beside the app (run --dashboard ADDR); the charts show what every worker wrote." }
        }
        @for (b, broker) in brokers.iter().enumerate() {
            h2 { "Redis " small { (broker.target) } }
            div.scroll { table #subscriptions {
                tr {
                    th { "subscription" } th { "transport" } th { "mode" } th { "ready" }
                    th { "in flight" } th { "delayed" } th { "dead" } th { "paused" }
                    th { "group / subscribers" } th { "handled/s" } th { "failed/s" } th { "handled, " (chart::span_name(span).1) } th {}
                }
                @for row in &broker.rows {
                    @let i = &row.inspection;
                    tr data-name=(i.keys.name) {
                        td { a href=(subscription_href(b, &i.keys.name)) { (i.keys.name) } }
                        td { (i.keys.transport) } td { (i.keys.mode) }
                        (state_cells(i))
                        td.n { @if let Some(r) = row.rate { (format!("{:.1}", r.handled)) } @else { "–" } }
                        td.n { @if let Some(r) = row.rate { (format!("{:.1}", r.failed)) } @else { "–" } }
                        td.spark { (chart::spark(&row.history)) }
                        td { (pause_buttons(ctx, b, i)) }
                    }
                }
            } }
        }
    };
    layout("Overview", Some(REFRESH_SECS), ctx, body)
}

/// Adds `more` to `sum` point by point (same span, so the same times).
fn add_points(sum: &mut Vec<Point>, more: &[Point]) {
    if sum.is_empty() {
        sum.extend_from_slice(more);
        return;
    }
    for (s, m) in sum.iter_mut().zip(more) {
        s.counts.add(&m.counts);
        for (a, b) in [(&mut s.waiting, m.waiting), (&mut s.in_flight, m.in_flight)] {
            if let Some(b) = b {
                *a = Some(a.unwrap_or(0) + b);
            }
        }
    }
}

/// The login page of a dashboard with a token.
pub(super) fn login(app: &AppLabel, failed: bool) -> Markup {
    let ctx = Ctx {
        csrf: "",
        done: None,
        live: false,
        app,
    };
    let body = html! {
        @if failed { p.err { "That is not the dashboard's token." } }
        form method="post" action="/login" {
            label { "Token " input type="password" name="token" autofocus; }
            " " button type="submit" { "Log in" }
        }
    };
    layout("Log in", None, &ctx, body)
}

/// A failed request's page.
pub(super) fn error(app: &AppLabel, message: &str) -> Markup {
    let ctx = Ctx {
        csrf: "",
        done: None,
        live: false,
        app,
    };
    layout("Error", None, &ctx, html! { p.err #error { (message) } })
}
