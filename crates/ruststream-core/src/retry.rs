//! Retry policy: how long a failed message waits before its next attempt, and how many attempts
//! it gets. Pure computation; the broker carries the delay out (a delayed set on Redis).

use std::time::Duration;

/// Delay before the next attempt, growing with the attempt number.
///
/// ```
/// use std::time::Duration;
/// use ruststream_core::Backoff;
///
/// let b = Backoff::exponential(Duration::from_millis(100)).max(Duration::from_secs(5)).jitter(0.0);
/// assert_eq!(b.delay(1), Duration::from_millis(100)); // after the first attempt failed
/// assert_eq!(b.delay(3), Duration::from_millis(400));
/// assert_eq!(b.delay(30), Duration::from_secs(5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    base: Duration,
    factor: f64,
    max: Duration,
    jitter: f64,
}

impl Backoff {
    /// `base`, `2·base`, `4·base`, ... capped at `1024·base` (see [`max`](Self::max)), with
    /// ±20 % jitter (see [`jitter`](Self::jitter)).
    #[must_use]
    pub const fn exponential(base: Duration) -> Self {
        Self {
            base,
            factor: 2.0,
            max: base.saturating_mul(1024),
            jitter: 0.2,
        }
    }

    /// The same delay every time, no jitter.
    #[must_use]
    pub const fn fixed(delay: Duration) -> Self {
        Self {
            base: delay,
            factor: 1.0,
            max: delay,
            jitter: 0.0,
        }
    }

    /// No delay: a retried message goes straight back on the queue.
    #[must_use]
    pub const fn immediate() -> Self {
        Self::fixed(Duration::ZERO)
    }

    /// Caps the delay.
    #[must_use]
    pub const fn max(mut self, cap: Duration) -> Self {
        self.max = cap;
        self
    }

    /// Spreads each delay uniformly by ±`fraction` (clamped to 0..=1), so that messages that
    /// failed together do not all come back at the same instant.
    #[must_use]
    pub const fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction.clamp(0.0, 1.0);
        self
    }

    /// The delay after attempt number `attempt` (1-based) failed.
    #[must_use]
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let raw = self.base.as_secs_f64() * self.factor.powi(exp);
        let capped = raw.min(self.max.as_secs_f64());
        let spread = if self.jitter > 0.0 {
            capped * self.jitter * (fastrand::f64() * 2.0 - 1.0)
        } else {
            0.0
        };
        Duration::try_from_secs_f64((capped + spread).max(0.0)).unwrap_or(self.max)
    }
}

impl Default for Backoff {
    /// Exponential from 1 s, capped at 1024 s (about 17 minutes), ±20 % jitter.
    fn default() -> Self {
        Self::exponential(Duration::from_secs(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_bounds() {
        let b = Backoff::exponential(Duration::from_secs(1)).jitter(0.5);
        for _ in 0..1000 {
            let d = b.delay(2).as_secs_f64();
            assert!((1.0..=3.0).contains(&d), "{d}");
        }
    }

    #[test]
    fn the_default_cap_lets_a_long_base_grow() {
        let b = Backoff::exponential(Duration::from_secs(600)).jitter(0.0);
        assert_eq!(b.delay(3), Duration::from_secs(2400));
        assert_eq!(
            Backoff::default().jitter(0.0).delay(40),
            Duration::from_secs(1024)
        );
    }

    #[test]
    fn fixed_and_immediate() {
        assert_eq!(
            Backoff::fixed(Duration::from_secs(3)).delay(9),
            Duration::from_secs(3)
        );
        assert_eq!(Backoff::immediate().delay(4), Duration::ZERO);
    }
}
