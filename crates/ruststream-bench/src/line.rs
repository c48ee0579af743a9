//! The benchmark's output: one `RESULT` line per scenario and configuration, and the `STATS`
//! line a child prints, read into it.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::common::{Config, Scenario};

/// One `RESULT` line.
pub(crate) struct Line {
    pub(crate) scenario: Scenario,
    pub(crate) config: Config,
    pub(crate) n: u64,
    pub(crate) publish_per_s: Option<f64>,
    pub(crate) consume_per_s: Option<f64>,
    pub(crate) baseline_per_s: Option<f64>,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) rss_mb: Option<f64>,
    pub(crate) lost: Option<u64>,
    pub(crate) dup: Option<u64>,
    pub(crate) extras: Vec<(String, String)>,
    /// Lines printed after the `RESULT` line (a cluster's `NODE` lines).
    pub(crate) after: Vec<String>,
}

impl Line {
    pub(crate) fn new(scenario: Scenario, config: Config, n: u64, set: String) -> Self {
        Self {
            scenario,
            config,
            n,
            publish_per_s: None,
            consume_per_s: None,
            baseline_per_s: None,
            p50_ms: None,
            p99_ms: None,
            rss_mb: None,
            lost: None,
            dup: None,
            extras: vec![("set".to_owned(), set)],
            after: Vec::new(),
        }
    }

    pub(crate) fn extra(&mut self, k: &str, v: impl ToString) {
        self.extras.push((k.to_owned(), v.to_string()));
    }

    pub(crate) fn render(&self) -> String {
        let f = |v: Option<f64>, prec: usize| {
            v.map_or_else(|| "-".to_owned(), |v| format!("{v:.prec$}"))
        };
        let u = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        let measured = if self.scenario.is_publish() {
            self.publish_per_s
        } else {
            self.consume_per_s
        };
        let ratio = match (measured, self.baseline_per_s) {
            (Some(m), Some(b)) if b > 0.0 => Some(m / b),
            _ => None,
        };
        let mut s = format!(
            "RESULT scenario={} config={} n={} publish_per_s={} consume_per_s={} baseline_per_s={} ratio={} p50_ms={} p99_ms={} rss_mb={} lost={} dup={}",
            self.scenario,
            self.config.name(),
            self.n,
            f(self.publish_per_s, 0),
            f(self.consume_per_s, 0),
            f(self.baseline_per_s, 0),
            f(ratio, 2),
            f(self.p50_ms, 2),
            f(self.p99_ms, 2),
            f(self.rss_mb, 1),
            u(self.lost),
            u(self.dup),
        );
        for (k, v) in &self.extras {
            let _ = write!(s, " {k}={v}");
        }
        for l in &self.after {
            let _ = write!(s, "\n{l}");
        }
        s
    }
}

/// The `STATS` line of a child, as key/value pairs.
pub(crate) struct Stats(pub(crate) HashMap<String, String>);

impl Stats {
    pub(crate) fn f(&self, k: &str) -> Option<f64> {
        self.0.get(k).and_then(|v| v.parse().ok())
    }
    pub(crate) fn u(&self, k: &str) -> Option<u64> {
        self.0.get(k).and_then(|v| v.parse().ok())
    }
    pub(crate) fn ms(&self, k: &str) -> Option<f64> {
        self.f(k).map(|us| us / 1000.0)
    }
    pub(crate) fn mb(&self, k: &str) -> Option<f64> {
        self.f(k).map(|kb| kb / 1024.0)
    }
}

/// Takes a consuming child's figures into the line.
pub(crate) fn take_consumer(line: &mut Line, n: u64, st: &Stats) {
    line.consume_per_s = st.f("rate");
    let distinct = st.u("distinct").unwrap_or(0);
    line.lost = Some(n.saturating_sub(distinct));
    line.dup = st.u("dups");
    line.rss_mb = st.mb("hwm_kb");
    line.extra(
        "base_rss_mb",
        format!("{:.1}", st.mb("base_kb").unwrap_or(0.0)),
    );
    cpu_fields(line, st);
    line.extra("shutdown_ms", st.u("shutdown_ms").unwrap_or(0));
    if st.u("strays").unwrap_or(0) > 0 {
        line.extra("strays", st.u("strays").unwrap_or(0));
    }
}

/// CPU of the child and of Redis during the measured phase, % of one core: run, and waiting for
/// a CPU (time other processes took).
/// With the child's rate, also the CPU each message cost the client and Redis, in µs (CPU time
/// over messages, whatever else the machine was doing).
pub(crate) fn cpu_fields(line: &mut Line, st: &Stats) {
    for k in ["client_cpu", "client_wait", "redis_cpu", "redis_wait"] {
        line.extra(k, format!("{}%", st.0.get(k).map_or("-", String::as_str)));
    }
    if let Some(rate) = st.f("rate").filter(|r| *r > 0.0) {
        for (k, name) in [
            ("client_cpu", "client_us_per_msg"),
            ("redis_cpu", "redis_us_per_msg"),
        ] {
            if let Some(pct) = st.f(k) {
                line.extra(name, format!("{:.2}", pct / 100.0 / rate * 1e6));
            }
        }
    }
}

pub(crate) fn ms(us: u32) -> f64 {
    f64::from(us) / 1000.0
}
