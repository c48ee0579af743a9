//! Reading a subscription's history back for a chart: the hashes of the span (`HGETALL` each,
//! sent concurrently), folded into evenly spaced points.

use std::collections::HashMap;

use fred::prelude::*;
use ruststream_core::Result;
use ruststream_core::history::Counts;

use super::{DAY_MS, HOUR_MS, MINUTE_MS, field_counts};
use crate::error::core;
use crate::operate::Operator;

/// How far back a chart looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// The last hour, by the minute (60 points).
    Hour,
    /// The last 24 hours, by 10 minutes (144 points).
    Day,
    /// The last 30 days, by 6 hours (120 points).
    Month,
}

impl Span {
    /// The span's length and its points' width, in ms; whether it reads the hours hashes.
    fn shape(self) -> (i64, i64, bool) {
        match self {
            Span::Hour => (HOUR_MS, MINUTE_MS, false),
            Span::Day => (DAY_MS, 10 * MINUTE_MS, false),
            Span::Month => (30 * DAY_MS, 6 * HOUR_MS, true),
        }
    }
}

/// What happened in one point of a chart.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Point {
    /// When the point starts, in ms since the epoch.
    pub at_ms: i64,
    /// Every worker's counts added up.
    pub counts: Counts,
    /// The highest sample of waiting entries, if one was taken.
    pub waiting: Option<u64>,
    /// The highest sample of entries in flight, if one was taken.
    pub in_flight: Option<u64>,
}

impl Point {
    fn sample(&mut self, name: &str, n: u64) {
        let slot = match name {
            "q" => &mut self.waiting,
            "i" => &mut self.in_flight,
            _ => return field_counts(&mut self.counts, name, n),
        };
        *slot = Some(slot.map_or(n, |v| v.max(n)));
    }
}

impl Operator {
    /// The history of the subscription `name` (a queue with partitions by its own name) over
    /// `span` up to `now_ms`: evenly spaced points, oldest first, empty where nothing was
    /// written. At most 25 (`Hour`, `Day`) or 31 (`Month`) `HGETALL`s.
    pub async fn history(&self, name: &str, span: Span, now_ms: i64) -> Result<Vec<Point>> {
        let parts = self.partitions_of(name);
        let queues: Vec<_> = if parts.is_empty() {
            vec![self.queue(name)?.clone()]
        } else {
            parts.into_iter().cloned().collect()
        };
        let space = &self.conns.keys;
        let base = super::base(space, name, &queues);
        let (length, width, hours) = span.shape();
        // The unit of a hash's fields (a minute or an hour) and of a hash (an hour or a day).
        let (unit, per_hash) = if hours {
            (HOUR_MS, 24)
        } else {
            (MINUTE_MS, 60)
        };
        let first_unit = (now_ms - length).div_euclid(unit) + 1;
        let last_unit = now_ms.div_euclid(unit);
        let hashes: Vec<i64> =
            (first_unit.div_euclid(per_hash)..=last_unit.div_euclid(per_hash)).collect();
        let pool = self.conns.pool()?;
        let reads = hashes.iter().map(|&n| {
            let key = if hours {
                space.history_hours(&base, n)
            } else {
                space.history_minutes(&base, n)
            };
            let client = pool.next().clone();
            async move {
                let fields: HashMap<String, String> = client.hgetall(&key).await.map_err(core)?;
                Ok::<_, ruststream_core::Error>((n, fields))
            }
        });
        let read = futures::future::try_join_all(reads).await?;
        let start = first_unit * unit;
        let count = usize::try_from(length / width).unwrap_or(0);
        let mut points: Vec<Point> = (0..count)
            .map(|i| Point {
                at_ms: start + i as i64 * width,
                ..Point::default()
            })
            .collect();
        for (n, fields) in read {
            for (field, value) in fields {
                let Some((at, name)) = field.split_once(':') else {
                    continue;
                };
                let (Ok(at), Ok(v)) = (at.parse::<i64>(), value.parse::<u64>()) else {
                    continue;
                };
                let when = (n * per_hash + at) * unit;
                let Ok(i) = usize::try_from((when - start).div_euclid(width)) else {
                    continue;
                };
                if let Some(p) = points.get_mut(i) {
                    p.sample(name, v);
                }
            }
        }
        Ok(points)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_keep_the_highest_and_counts_add() {
        let mut p = Point::default();
        p.sample("q", 4);
        p.sample("q", 2);
        p.sample("h", 3);
        p.sample("h", 3);
        assert_eq!(
            (p.waiting, p.in_flight, p.counts.handled),
            (Some(4), None, 6)
        );
    }
}
