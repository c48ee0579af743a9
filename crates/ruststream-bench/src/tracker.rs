//! The consumer's id tracker: which ids were handled, how often, and each one's latency; and the
//! nearest-rank quantile its percentiles are read with.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::common::{Msg, now_ns};

/// What a latency is measured from, per message.
#[derive(Debug, Clone, Copy)]
pub enum LatencyFrom {
    /// Not measured.
    None,
    /// The stamp in the message body (publish time, or due time).
    Stamp,
    /// One instant for every message (the common due time), wall-clock ns.
    Fixed(u64),
}

/// Records which ids were handled, how often, and (optionally) each one's latency.
pub struct Tracker {
    n: u64,
    seen: Vec<AtomicU8>,
    distinct: AtomicU64,
    dups: AtomicU64,
    strays: AtomicU64,
    from: LatencyFrom,
    lat_us: Vec<AtomicU32>,
    done_at: OnceLock<Instant>,
    done: Notify,
    /// Whether the first and last record times are kept (pubsub: the run ends when it goes quiet).
    span: bool,
    /// Wall-clock ns of the first and the latest new id (0: none yet).
    first_ns: AtomicU64,
    last_ns: AtomicU64,
}

impl Tracker {
    pub fn new(n: u64, from: LatencyFrom) -> Self {
        let len = usize::try_from(n).expect("n fits in memory");
        let lat_len = if matches!(from, LatencyFrom::None) {
            0
        } else {
            len
        };
        Self {
            n,
            seen: (0..len).map(|_| AtomicU8::new(0)).collect(),
            distinct: AtomicU64::new(0),
            dups: AtomicU64::new(0),
            strays: AtomicU64::new(0),
            from,
            lat_us: (0..lat_len).map(|_| AtomicU32::new(0)).collect(),
            done_at: OnceLock::new(),
            done: Notify::new(),
            span: false,
            first_ns: AtomicU64::new(0),
            last_ns: AtomicU64::new(0),
        }
    }

    /// Keeps when the first and the latest new id were recorded (one clock read per message).
    #[must_use]
    pub fn with_span(mut self) -> Self {
        self.span = true;
        self
    }

    /// Records one handled message.
    pub fn record(&self, m: &Msg) {
        let Some(slot) = usize::try_from(m.id).ok().and_then(|i| self.seen.get(i)) else {
            self.strays.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let prev = slot
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(1))
            })
            .unwrap_or(u8::MAX);
        if prev > 0 {
            self.dups.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let from = match self.from {
            LatencyFrom::None => None,
            LatencyFrom::Stamp => m.stamp(),
            LatencyFrom::Fixed(t) => Some(t),
        };
        if self.span {
            let t = now_ns();
            let _ = self
                .first_ns
                .compare_exchange(0, t, Ordering::Relaxed, Ordering::Relaxed);
            self.last_ns.fetch_max(t, Ordering::Relaxed);
        }
        if let Some(from) = from {
            let us = now_ns().saturating_sub(from) / 1000;
            self.lat_us[usize::try_from(m.id).unwrap_or(0)]
                .store(u32::try_from(us).unwrap_or(u32::MAX), Ordering::Relaxed);
        }
        if self.distinct.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            let _ = self.done_at.set(Instant::now());
            self.done.notify_one();
        }
    }

    /// Waits until every id was handled, or `timeout`; returns when the last one was.
    pub async fn wait(&self, timeout: Duration) -> Option<Instant> {
        if self.distinct() < self.n {
            let _ = tokio::time::timeout(timeout, self.done.notified()).await;
        }
        self.done_at.get().copied()
    }

    /// Waits until every id was handled, or no new id came for `quiet` (once one came, or
    /// after `first` without any), or `limit` passed.
    pub async fn wait_quiet(&self, first: Duration, quiet: Duration, limit: Duration) {
        let t0 = Instant::now();
        let mut last = self.distinct();
        while self.distinct() < self.n && t0.elapsed() < limit {
            let _ = tokio::time::timeout(quiet, self.done.notified()).await;
            let now = self.distinct();
            let idle = now == last && (now > 0 || t0.elapsed() >= first);
            if idle {
                break;
            }
            last = now;
        }
    }

    /// Time from the first to the latest new id, when [`with_span`](Self::with_span) is on and
    /// two came.
    pub fn span(&self) -> Option<Duration> {
        let (a, b) = (
            self.first_ns.load(Ordering::Relaxed),
            self.last_ns.load(Ordering::Relaxed),
        );
        (a > 0 && b > a).then(|| Duration::from_nanos(b - a))
    }

    pub fn distinct(&self) -> u64 {
        self.distinct.load(Ordering::Acquire)
    }

    pub fn dups(&self) -> u64 {
        self.dups.load(Ordering::Relaxed)
    }

    pub fn strays(&self) -> u64 {
        self.strays.load(Ordering::Relaxed)
    }

    /// The latencies of the handled ids, sorted, in µs.
    pub fn latencies(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .lat_us
            .iter()
            .zip(&self.seen)
            .filter(|(_, s)| s.load(Ordering::Relaxed) > 0)
            .map(|(l, _)| l.load(Ordering::Relaxed))
            .collect();
        v.sort_unstable();
        v
    }
}

/// The `q` quantile of sorted values (nearest rank), `None` when empty.
pub fn quantile(sorted: &[u32], q: f64) -> Option<u32> {
    if sorted.is_empty() {
        return None;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracker_counts_distinct_and_duplicates() {
        let t = Tracker::new(3, LatencyFrom::None);
        for id in [0, 1, 1, 2, 9] {
            t.record(&Msg::new(id, 0));
        }
        assert_eq!((t.distinct(), t.dups(), t.strays()), (3, 1, 1));
    }

    #[test]
    fn quantiles_use_nearest_rank() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&v, 1.0), Some(100));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
