//! Live rates of a dashboard served beside the app: the subscriptions' [`Tally`]s sampled once a
//! second, a rate being the change over the last ten seconds.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream_core::observe::Tally;

/// How many samples are kept (one a second).
const WINDOW: usize = 11;

/// One sample: when, and each tally's (handled, failed).
type Sample = (Instant, Vec<(u64, u64)>);

/// The sampled tallies of a running app.
pub(super) struct Rates {
    tallies: Vec<(String, Arc<Tally>)>,
    samples: Mutex<VecDeque<Sample>>,
}

/// Handled and failed deliveries a second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Rate {
    pub(super) handled: f64,
    pub(super) failed: f64,
}

impl Rates {
    pub(super) fn new(tallies: Vec<(String, Arc<Tally>)>) -> Self {
        let rates = Self {
            tallies,
            samples: Mutex::new(VecDeque::with_capacity(WINDOW)),
        };
        rates.sample();
        rates
    }

    /// Samples every second until dropped.
    pub(super) async fn run(&self) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            self.sample();
        }
    }

    fn sample(&self) {
        let now: Vec<(u64, u64)> = self
            .tallies
            .iter()
            .map(|(_, t)| (t.handled(), t.failed()))
            .collect();
        if let Ok(mut samples) = self.samples.lock() {
            if samples.len() == WINDOW {
                samples.pop_front();
            }
            samples.push_back((Instant::now(), now));
        }
    }

    /// The rates of the subscription `name` (every subscriber of its key: `key`, `key#2`, ...);
    /// `None` when no running subscription has that key or under a second was sampled.
    pub(super) fn of(&self, name: &str) -> Option<Rate> {
        let mine: Vec<usize> = (0..self.tallies.len())
            .filter(|&i| base_name(&self.tallies[i].0) == name)
            .collect();
        if mine.is_empty() {
            return None;
        }
        let samples = self.samples.lock().ok()?;
        let ((t0, first), (t1, last)) = (samples.front()?, samples.back()?);
        let secs = t1.duration_since(*t0).as_secs_f64();
        if secs < 0.5 {
            return Some(Rate::default());
        }
        let sum = |s: &Vec<(u64, u64)>, f: fn(&(u64, u64)) -> u64| -> f64 {
            mine.iter().map(|&i| s.get(i).map_or(0, f)).sum::<u64>() as f64
        };
        Some(Rate {
            handled: (sum(last, |c| c.0) - sum(first, |c| c.0)) / secs,
            failed: (sum(last, |c| c.1) - sum(first, |c| c.1)) / secs,
        })
    }
}

/// `key` of a subscription named `key#2` (a further subscriber of the same key).
fn base_name(name: &str) -> &str {
    match name.rsplit_once('#') {
        Some((key, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => key,
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn further_subscribers_count_under_their_key() {
        assert_eq!(base_name("jobs#2"), "jobs");
        assert_eq!(base_name("jobs"), "jobs");
        assert_eq!(base_name("a#b"), "a#b");
        let rates = Rates::new(vec![("jobs".into(), Arc::default())]);
        assert_eq!(rates.of("jobs"), Some(Rate::default()));
        assert_eq!(rates.of("other"), None);
    }
}
