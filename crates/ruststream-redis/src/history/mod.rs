//! Each subscription's history, kept in Redis for the dashboard's charts: what its handlers did
//! (handled, failed, retried, dead-lettered, timed out, handler times in buckets of a log scale)
//! and the queue's depth and in-flight count sampled beside it.
//!
//! Every worker counts in memory (the core's `Tally`) and, once a minute by default
//! ([`RedisBroker::history_interval`](crate::RedisBroker::history_interval)), adds what changed with one
//! `write.lua` per subscription: `HINCRBY` of the counts, `LLEN`s (a list) or `XINFO GROUPS`
//! (a stream) for the depth, `HSET` of the samples, `EXPIRE` of both hashes. Never a write per
//! message. Counts from several workers add up; a sample is the last one written.
//!
//! Keys of a subscription on `K` (in `K`'s slot; a queue with partitions uses its own key):
//!
//! | name | what | bound |
//! |---|---|---|
//! | `K.history.m:<hour>` | one hour at minute resolution: fields `<minute>:<name>`; `<hour>` counts hours since the epoch | at most 60 × 55 fields; expires 25 h after its last write |
//! | `K.history.h:<day>` | one day at hour resolution: fields `<hour>:<name>`, samples are the hour's highest; `<day>` counts days since the epoch | at most 24 × 55 fields; expires 31 days after its last write |
//!
//! A field's `<name>` is `h`, `f`, `r`, `d`, `t`, `b0` … `b47` (see [`TIME_BUCKETS`]), `q`
//! (waiting) or `i` (in flight). So the last 24 hours are kept by the minute and the last 30
//! days by the hour. The reader ([`Operator::history`](crate::operate::Operator::history))
//! reads at most 25 or 31 hashes (`HGETALL`) per chart.

mod read;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::Result;
use ruststream_core::history::{Counts, HistorySink, TIME_BUCKETS};

pub use self::read::{Point, Span};
use crate::conn::Connections;
use crate::keys::{KeySpace, SourceKeys};
use crate::lua::{self, Call};

pub use crate::defaults::DEFAULT_HISTORY_EVERY;

/// How long a minutes hash lives after its last write: a day and an hour, so the last 24 h are
/// whole.
const MINUTES_TTL_S: u64 = 25 * 3600;

/// How long an hours hash lives after its last write: 31 days.
const HOURS_TTL_S: u64 = 31 * 86_400;

const MINUTE_MS: i64 = 60_000;
const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 86_400_000;

static WRITE: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("write.lua")));

/// The key the history of the subscription with `queues` (its own keys, or its partitions') is
/// named after: the queue's full name, or with partitions, the full name of the user's `key`.
pub(crate) fn base(space: &KeySpace, key: &str, queues: &[SourceKeys]) -> String {
    match queues {
        [one] => one.queue.clone(),
        _ => space.key(key),
    }
}

/// Where the queue's depth is read.
#[derive(Debug, Clone, PartialEq)]
enum Depth {
    /// A list: its levels (and its groups' ring), and its processing list if it has one.
    List {
        waiting: Vec<String>,
        processing: Option<String>,
    },
    /// A stream and its group.
    Stream { stream: String, group: String },
    /// Nothing to sample (Pub/Sub, a queue with partitions).
    None,
}

impl Depth {
    fn of(queues: &[SourceKeys]) -> Self {
        let [q] = queues else { return Depth::None };
        match (q.transport, &q.group) {
            ("list", _) => {
                let mut waiting = vec![q.queue.clone()];
                waiting.extend(q.levels.iter().cloned());
                Depth::List {
                    waiting,
                    processing: q.processing.clone(),
                }
            }
            ("stream", Some(group)) => Depth::Stream {
                stream: q.queue.clone(),
                group: group.clone(),
            },
            _ => Depth::None,
        }
    }
}

/// One call of `write.lua`: `counts` added at a minute of an hour of a day.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WriteHistory<'a> {
    /// The minutes hash of the hour.
    minutes: String,
    /// The hours hash of the day.
    hours: String,
    /// The minute of the hour, the hour of the day.
    at: (i64, i64),
    depth: &'a Depth,
    counts: &'a Counts,
}

impl<'a> WriteHistory<'a> {
    /// `counts` of the history of the full key `base` at `minute` (since the epoch).
    fn new(
        space: &KeySpace,
        base: &str,
        minute: i64,
        depth: &'a Depth,
        counts: &'a Counts,
    ) -> Self {
        let hour = minute.div_euclid(60);
        Self {
            minutes: space.history_minutes(base, hour),
            hours: space.history_hours(base, hour.div_euclid(24)),
            at: (minute.rem_euclid(60), hour.rem_euclid(24)),
            depth,
            counts,
        }
    }
}

impl Call for WriteHistory<'_> {
    type Reply = ();

    fn script(&self) -> &'static Script {
        &WRITE
    }

    /// KEYS and ARGV: see `write.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let (m, h) = self.at;
        let mut keys = vec![self.minutes.clone(), self.hours.clone()];
        let (kind, extra) = match self.depth {
            Depth::List {
                waiting,
                processing,
            } => {
                keys.extend(processing.iter().cloned());
                keys.extend(waiting.iter().cloned());
                let extra = if processing.is_some() {
                    "processing"
                } else {
                    ""
                };
                ("list", extra.to_owned())
            }
            Depth::Stream { stream, group } => {
                keys.push(stream.clone());
                ("stream", group.clone())
            }
            Depth::None => ("none", String::new()),
        };
        let mut args: Vec<Value> = vec![
            m.into(),
            h.into(),
            lua::int(MINUTES_TTL_S as usize),
            lua::int(HOURS_TTL_S as usize),
            kind.into(),
            extra.into(),
        ];
        let c = self.counts;
        let named = [
            ("h", c.handled),
            ("f", c.failed),
            ("r", c.retried),
            ("d", c.dead),
            ("t", c.timed_out),
        ];
        for (name, n) in named.into_iter().filter(|(_, n)| *n > 0) {
            args.push(name.into());
            args.push(count(n));
        }
        for (i, n) in c.times.iter().enumerate().filter(|(_, n)| **n > 0) {
            args.push(format!("b{i}").into());
            args.push(count(*n));
        }
        (keys, args)
    }

    fn parse(&self, _reply: Value) {}
}

fn count(n: u64) -> Value {
    Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

/// One subscription's history in Redis, written by its worker.
pub(crate) struct Sink {
    conns: Arc<Connections>,
    base: String,
    depth: Depth,
    every: Duration,
}

impl Sink {
    /// The sink of the subscription on the user's key `key` reading `queues`.
    pub(crate) fn new(
        conns: Arc<Connections>,
        key: &str,
        queues: &[SourceKeys],
        every: Duration,
    ) -> Self {
        Self {
            base: base(&conns.keys, key, queues),
            depth: Depth::of(queues),
            conns,
            every,
        }
    }
}

impl HistorySink for Sink {
    fn every(&self) -> Duration {
        self.every
    }

    fn write(&self, at_ms: i64, counts: Counts) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            if counts.is_empty() && self.depth == Depth::None {
                return Ok(());
            }
            let minute = at_ms.div_euclid(MINUTE_MS);
            let call =
                WriteHistory::new(&self.conns.keys, &self.base, minute, &self.depth, &counts);
            let pool = self.conns.pool()?;
            call.call(pool.next()).await
        })
    }
}

/// The name of a counts field in a history hash.
fn field_counts(c: &mut Counts, name: &str, n: u64) {
    match name {
        "h" => c.handled += n,
        "f" => c.failed += n,
        "r" => c.retried += n,
        "d" => c.dead += n,
        "t" => c.timed_out += n,
        b => {
            let i = b.strip_prefix('b').and_then(|i| i.parse::<usize>().ok());
            if let Some(i) = i.filter(|i| *i < TIME_BUCKETS) {
                c.times[i] += n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_goes_to_its_hour_and_its_day() {
        // 2026-12-07 10:37 UTC.
        let minute = 1_796_639_820_000 / MINUTE_MS;
        let mut counts = Counts {
            handled: 3,
            ..Counts::default()
        };
        counts.times[4] = 3;
        let depth = Depth::List {
            waiting: vec!["q".into()],
            processing: Some("q.processing".into()),
        };
        let space = KeySpace::new(String::new(), false);
        let call = WriteHistory::new(&space, "q", minute, &depth, &counts);
        let (keys, args) = call.build();
        assert_eq!(
            keys[..2],
            [
                "q.history.m:499066".to_owned(),
                "q.history.h:20794".to_owned()
            ]
        );
        assert_eq!(
            (args[0].clone(), args[1].clone()),
            (Value::from(37), Value::from(10))
        );
        assert_eq!(keys[2..], ["q.processing".to_owned(), "q".to_owned()]);
        assert_eq!(args.len(), 6 + 4);
        assert_eq!(args[4], Value::from("list"));
        assert_eq!(args[8], Value::from("b4"));
    }

    #[test]
    fn fields_are_read_back_into_counts() {
        let mut c = Counts::default();
        field_counts(&mut c, "h", 4);
        field_counts(&mut c, "b7", 2);
        field_counts(&mut c, "b99", 2);
        field_counts(&mut c, "zz", 2);
        assert_eq!((c.handled, c.times[7]), (4, 2));
        assert_eq!(c.times.iter().sum::<u64>(), 2);
    }
}
