//! The history's charts, drawn on the server as inline SVG (no script, nothing fetched, so the
//! page's CSP stays as strict): a chart is a few polylines on a grid, with the highest value
//! and the span written beside it.

use maud::{Markup, html};
use ruststream_redis::history::{Point, Span};

/// The drawing's size, in SVG units (it scales to the page's width).
const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 140.0;

/// One line of a chart.
pub(super) struct Line {
    pub(super) label: &'static str,
    /// The line's colour class (`c-ok`, `c-fail`, ... in the stylesheet) and its stroke.
    pub(super) colour: &'static str,
    /// One value per point; `None` where nothing was written.
    pub(super) values: Vec<Option<f64>>,
}

/// The span's name in a query string and on the page.
pub(super) fn span_name(span: Span) -> (&'static str, &'static str) {
    match span {
        Span::Hour => ("hour", "last hour"),
        Span::Day => ("day", "last 24 hours"),
        Span::Month => ("month", "last 30 days"),
    }
}

/// The span a query string names (`hour` when none or unknown).
pub(super) fn span_of(name: Option<&str>) -> Span {
    match name {
        Some("day") => Span::Day,
        Some("month") => Span::Month,
        _ => Span::Hour,
    }
}

/// Minutes in one point of `points` (their spacing), at least one.
fn minutes_per_point(points: &[Point]) -> f64 {
    match points {
        [a, b, ..] => ((b.at_ms - a.at_ms) as f64 / 60_000.0).max(1.0),
        _ => 1.0,
    }
}

/// Handled and failed deliveries per minute.
pub(super) fn throughput(points: &[Point]) -> Vec<Line> {
    let per = minutes_per_point(points);
    let rate = |f: fn(&Point) -> u64| points.iter().map(|p| Some(f(p) as f64 / per)).collect();
    vec![
        Line {
            label: "handled/min",
            colour: "ok",
            values: rate(|p| p.counts.handled),
        },
        Line {
            label: "failed/min",
            colour: "fail",
            values: rate(|p| p.counts.failed),
        },
    ]
}

/// Retried, dead-lettered and timed-out deliveries per minute.
pub(super) fn failures(points: &[Point]) -> Vec<Line> {
    let per = minutes_per_point(points);
    let rate = |f: fn(&Point) -> u64| points.iter().map(|p| Some(f(p) as f64 / per)).collect();
    vec![
        Line {
            label: "retried/min",
            colour: "warn",
            values: rate(|p| p.counts.retried),
        },
        Line {
            label: "dead/min",
            colour: "fail",
            values: rate(|p| p.counts.dead),
        },
        Line {
            label: "timed out/min",
            colour: "other",
            values: rate(|p| p.counts.timed_out),
        },
    ]
}

/// Handler time percentiles, in ms.
pub(super) fn latency(points: &[Point]) -> Vec<Line> {
    let q = |q: f64| points.iter().map(|p| p.counts.percentile_ms(q)).collect();
    vec![
        Line {
            label: "p50 ms",
            colour: "ok",
            values: q(0.5),
        },
        Line {
            label: "p95 ms",
            colour: "warn",
            values: q(0.95),
        },
        Line {
            label: "p99 ms",
            colour: "fail",
            values: q(0.99),
        },
    ]
}

/// Waiting and in-flight samples.
pub(super) fn depth(points: &[Point]) -> Vec<Line> {
    vec![
        Line {
            label: "waiting",
            colour: "info",
            values: points.iter().map(|p| p.waiting.map(|n| n as f64)).collect(),
        },
        Line {
            label: "in flight",
            colour: "ok",
            values: points
                .iter()
                .map(|p| p.in_flight.map(|n| n as f64))
                .collect(),
        },
    ]
}

/// A number for an axis: `0`, `0.25`, `12`, `1.5k`, `2.1M`.
pub(super) fn short(v: f64) -> String {
    match v.abs() {
        a if a >= 1e6 => format!("{:.1}M", v / 1e6),
        a if a >= 1e4 => format!("{:.0}k", v / 1e3),
        a if a >= 1e3 => format!("{:.1}k", v / 1e3),
        a if a >= 10.0 || a == 0.0 => format!("{v:.0}"),
        a if a >= 1.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

/// A chart of `lines` (each one value per point) titled `title`, over `span`.
pub(super) fn chart(id: &str, title: &str, span: Span, lines: &[Line]) -> Markup {
    let top = lines
        .iter()
        .flat_map(|l| l.values.iter().flatten())
        .fold(0.0f64, |a, v| a.max(*v));
    let scale = if top > 0.0 { top * 1.1 } else { 1.0 };
    let n = lines.iter().map(|l| l.values.len()).max().unwrap_or(0);
    let x = |i: usize| {
        if n <= 1 {
            0.0
        } else {
            i as f64 * WIDTH / (n - 1) as f64
        }
    };
    let y = |v: f64| HEIGHT - v / scale * HEIGHT;
    let total: f64 = lines
        .first()
        .map_or(0.0, |l| l.values.iter().flatten().sum());
    html! {
        figure.chart id=(id) data-top=(short(top)) data-total=(total) {
            figcaption { strong { (title) } " " small { (span_name(span).1) ", highest " (short(top)) } }
            svg viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) preserveAspectRatio="none" role="img" aria-label=(title) {
                @for k in 1..4 {
                    line.grid x1="0" x2=(WIDTH) y1=(HEIGHT * f64::from(k) / 4.0) y2=(HEIGHT * f64::from(k) / 4.0) {}
                }
                @for l in lines {
                    @for run in runs(&l.values) {
                        polyline class=(format!("s-{}", l.colour)) points=(
                            run.iter().map(|(i, v)| format!("{:.1},{:.1}", x(*i), y(*v))).collect::<Vec<_>>().join(" ")
                        ) {}
                    }
                }
            }
            p.legend {
                @for l in lines { span class=(format!("k-{}", l.colour)) { "■ " } (l.label) " " }
            }
        }
    }
}

/// A small chart of handled (and failed) deliveries, for a table's cell.
pub(super) fn spark(points: &[Point]) -> Markup {
    let lines = throughput(points);
    let top = lines
        .iter()
        .flat_map(|l| l.values.iter().flatten())
        .fold(0.0f64, |a, v| a.max(*v));
    let scale = if top > 0.0 { top } else { 1.0 };
    let n = points.len().max(2) - 1;
    html! {
        svg viewBox="0 0 100 20" preserveAspectRatio="none" role="img" aria-label=(format!("highest {}/min", short(top))) {
            @for l in &lines {
                polyline class=(format!("s-{}", l.colour)) points=(
                    l.values.iter().enumerate().map(|(i, v)| format!("{:.1},{:.1}", i as f64 * 100.0 / n as f64, 19.0 - v.unwrap_or(0.0) / scale * 18.0)).collect::<Vec<_>>().join(" ")
                ) {}
            }
        }
    }
}

/// The stretches of `values` with a value, as (index, value) runs; a lone point is drawn as a
/// run of two so it shows.
fn runs(values: &[Option<f64>]) -> Vec<Vec<(usize, f64)>> {
    let mut out: Vec<Vec<(usize, f64)>> = Vec::new();
    let mut current = Vec::new();
    for (i, v) in values.iter().enumerate() {
        match v {
            Some(v) => current.push((i, *v)),
            None if !current.is_empty() => out.push(std::mem::take(&mut current)),
            None => {}
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    for run in &mut out {
        if let [(i, v)] = run[..] {
            run.push((i, v));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_draws_every_stretch_and_names_its_top() {
        let line = Line {
            label: "handled/min",
            colour: "ok",
            values: vec![Some(0.0), Some(120.0), None, Some(30.0), Some(0.0)],
        };
        let svg = chart("t", "Throughput", Span::Hour, &[line]).into_string();
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert!(svg.contains(r#"data-top="120""#), "{svg}");
        assert!(svg.contains(r#"data-total="150""#), "{svg}");
        assert!(svg.contains("last hour"), "{svg}");
        assert!(!svg.contains("NaN"), "{svg}");
    }

    #[test]
    fn an_empty_history_draws_nothing_and_no_nan() {
        let empty = Line {
            label: "p50 ms",
            colour: "ok",
            values: vec![None; 60],
        };
        let svg = chart("t", "Latency", Span::Day, &[empty]).into_string();
        assert_eq!(svg.matches("<polyline").count(), 0);
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        assert_eq!(short(1500.0), "1.5k");
        assert_eq!(short(0.25), "0.25");
    }
}
