//! Durable publishes: a publish that returns `Ok` only once `replicas` replicas of the server
//! hold its messages ([`Durability`], set with
//! [`PublishBuilder::durable`](crate::PublishBuilder::durable) or on a destination's policy).
//! Fewer acknowledgements within the timeout is [`Error::NotDurable`](crate::Error::NotDurable).
//! Sends nothing itself: the broker carries it out (Redis: `WAIT`, and `WAITAOF` where the
//! server has it).

use std::time::Duration;

/// How many replicas must hold a publish before it returns `Ok`, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Durability {
    replicas: u32,
    timeout: Duration,
}

impl Durability {
    /// `replicas` acknowledgements within `timeout` (at least a millisecond: a zero timeout is
    /// taken as one millisecond, never as "wait forever").
    pub fn new(replicas: u32, timeout: Duration) -> Self {
        Self { replicas, timeout }
    }

    /// How many replicas must acknowledge.
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// How long the publish waits for them.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The timeout in whole milliseconds, at least one.
    pub fn timeout_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::Durability;
    use std::time::Duration;

    #[test]
    fn a_zero_timeout_waits_a_millisecond_not_forever() {
        assert_eq!(Durability::new(1, Duration::ZERO).timeout_ms(), 1);
        assert_eq!(
            Durability::new(1, Duration::from_secs(2)).timeout_ms(),
            2000
        );
    }
}
