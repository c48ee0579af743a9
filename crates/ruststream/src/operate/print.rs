//! What the operator's commands print: JSON, or text for a terminal (`inspect`'s lines, times
//! as `1.5s`). Sends no command.

use ruststream_redis::operate::{Inspection, PeriodicJob};

use super::Rates;
use crate::{Error, Result};

/// Prints `value` as JSON, or the text `text` makes.
pub(super) fn print_out<T: serde::Serialize>(
    json: bool,
    value: &T,
    text: impl FnOnce() -> String,
) -> Result<()> {
    if json {
        let s = serde_json::to_string_pretty(value).map_err(|e| Error::Encode(e.to_string()))?;
        println!("{s}");
    } else {
        print!("{}", text());
    }
    Ok(())
}

pub(super) fn pretty<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).map_or_else(|e| e.to_string(), |s| s + "\n")
}

/// A time as ms since the epoch, in UTC to the ms: `2026-12-07 16:03:39.123 UTC`, as a job's
/// history shows its events (`timeline::utc_text`); empty past the dates it can show.
pub(crate) fn utc_text(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(ruststream_redis::timeline::utc_text)
        .unwrap_or_default()
}

/// `1.5s`, `-200ms`.
pub(super) fn ms_text(ms: i64) -> String {
    if ms.abs() >= 1000 {
        #[allow(clippy::cast_precision_loss)]
        let s = ms as f64 / 1000.0;
        format!("{s:.1}s")
    } else {
        format!("{ms}ms")
    }
}

/// One subscription's line of `inspect`: its state, and its rates when asked for.
#[derive(serde::Serialize)]
pub(super) struct Row<'a> {
    #[serde(flatten)]
    pub(super) inspection: &'a Inspection,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) rates: Option<Rates>,
}

pub(super) fn inspect_text(rows: &[Row<'_>]) -> String {
    let mut out = String::new();
    for row in rows {
        let i = row.inspection;
        let k = &i.keys;
        out.push_str(&format!(
            "{}  {} {}  concurrency {}{}\n",
            k.name,
            k.transport,
            k.mode,
            k.concurrency,
            if i.paused == Some(true) {
                "  PAUSED"
            } else {
                ""
            }
        ));
        let mut keys = vec![format!("queue {}", k.queue)];
        for (label, key) in [
            ("processing", &k.processing),
            ("recovery", &k.recovery),
            ("delayed", &k.delayed),
            ("dead", &k.dead),
        ] {
            if let Some(key) = key {
                keys.push(format!("{label} {key}"));
            }
        }
        out.push_str(&format!("  keys: {}\n", keys.join(", ")));
        let mut counts = counts(i);
        if let Some(r) = row.rates {
            counts.push(format!(
                "{:.1} handled/s, {:.1} failed/s",
                r.handled_per_s, r.failed_per_s
            ));
        }
        out.push_str(&format!("  {}\n", counts.join(" · ")));
        if let Some(g) = &i.group {
            for c in &g.consumers {
                out.push_str(&format!(
                    "  consumer {}: pending {}, idle {}\n",
                    c.name,
                    c.pending,
                    ms_text(i64::try_from(c.idle_ms).unwrap_or(i64::MAX))
                ));
            }
        }
    }
    out
}

fn counts(i: &Inspection) -> Vec<String> {
    let mut parts = Vec::new();
    let n = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
    if i.keys.transport == "pubsub" {
        parts.push(format!("subscribers {}", n(i.subscribers)));
    } else {
        let mut ready = format!("ready {}", n(i.ready));
        if let Some(levels) = &i.levels {
            let each: Vec<String> = levels.iter().map(u64::to_string).collect();
            ready.push_str(&format!(" (by priority level 0..: {})", each.join(" / ")));
        }
        if let Some(g) = &i.groups {
            let largest: Vec<String> = g
                .largest
                .iter()
                .map(|l| {
                    let paused = if l.paused { ", paused" } else { "" };
                    format!("{:?} {}{paused}", l.name, l.waiting)
                })
                .collect();
            ready.push_str(&format!(
                " (in {} groups, {} paused, {} in the inbox; largest: {})",
                g.groups,
                g.paused,
                g.inbox,
                largest.join(", ")
            ));
        }
        parts.push(ready);
        if let Some(in_flight) = i.in_flight {
            let mut flight = format!("in flight {in_flight}");
            let ms = |v: u64| ms_text(i64::try_from(v).unwrap_or(i64::MAX));
            match (i.oldest_claim_age_ms, i.oldest_claim_idle_ms) {
                (Some(age), Some(idle)) => flight.push_str(&format!(
                    " (oldest claimed {} ago; stalest renewal {} ago)",
                    ms(age),
                    ms(idle)
                )),
                (None, Some(idle)) => {
                    flight.push_str(&format!(" (stalest renewal {} ago)", ms(idle)));
                }
                _ => {}
            }
            parts.push(flight);
        }
        let mut delayed = format!("delayed {}", n(i.delayed));
        if let Some(due) = i.next_due_in_ms {
            delayed.push_str(&format!(" (next due in {})", ms_text(due)));
        }
        parts.push(delayed);
    }
    parts.push(format!("dead {}", n(i.dead)));
    if let Some(g) = &i.group {
        parts.push(format!("group lag {}, pending {}", n(g.lag), g.pending));
    }
    parts
}

/// `periodic`'s lines: one job a line, or a note that there is none.
pub(super) fn periodic_text(jobs: &[PeriodicJob]) -> String {
    if jobs.is_empty() {
        return "no periodic job is registered\n".to_owned();
    }
    let mut out = String::new();
    for j in jobs {
        if let Some(why) = &j.unreadable {
            out.push_str(&format!("{}  unreadable definition: {why}\n", j.name));
            continue;
        }
        let last = j
            .last_ago_ms
            .map_or_else(|| "never".to_owned(), |ms| format!("{} ago", ms_text(ms)));
        let next = j
            .next_in_ms
            .map_or_else(|| "none".to_owned(), |ms| format!("in {}", ms_text(ms)));
        out.push_str(&format!(
            "{}  `{}` {}  to {}  catch-up {}  last fired {last}  next due {next}\n",
            j.name,
            j.cron,
            j.tz,
            j.destination.as_deref().unwrap_or("(the type's name)"),
            match j.catch_up {
                crate::periodic::CatchUp::RunOnce => "run-once",
                _ => "skip",
            },
        ));
    }
    out
}
