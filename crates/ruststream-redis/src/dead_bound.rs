//! A dead-letter list's bound, an option of every subscription: how many dead letters it keeps
//! and for how long. A leaf module, so the options read it without reaching into the dead-letter
//! scripts. Sends no command.

use std::time::Duration;

use fred::prelude::*;
use ruststream_core::{ConfigError, Result};

/// Most dead letters a dead-letter list keeps, unless `.dead_letter_max_len(..)` says otherwise.
pub const DEFAULT_DEAD_LETTER_MAX_LEN: u64 = 10_000;

/// How long a dead letter is kept, unless `.dead_letter_max_age(..)` says otherwise: 30 days.
pub const DEFAULT_DEAD_LETTER_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// A dead-letter list's bound: the script that pushes a dead letter then trims the oldest past
/// `max_len` (exactly) and those that died more than `max_age` ago (a few a call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadBound {
    /// Most dead letters kept.
    pub max_len: u64,
    /// How long one is kept.
    pub max_age: Duration,
}

impl Default for DeadBound {
    /// [`DEFAULT_DEAD_LETTER_MAX_LEN`], [`DEFAULT_DEAD_LETTER_MAX_AGE`].
    fn default() -> Self {
        Self {
            max_len: DEFAULT_DEAD_LETTER_MAX_LEN,
            max_age: DEFAULT_DEAD_LETTER_MAX_AGE,
        }
    }
}

impl DeadBound {
    /// The bound as `trim.lua` takes it: `<max_len>:<max_age_ms>`.
    pub(crate) fn arg(&self) -> Value {
        Value::from(format!("{}:{}", self.max_len, self.max_age.as_millis()))
    }

    /// Refuses a zero bound; `key` names the subscription.
    pub(crate) fn validate(&self, key: &str) -> Result<()> {
        if self.max_len == 0 {
            return Err(ConfigError::new(
                "dead_letter_max_len",
                "must be at least 1 (0 would keep no dead letter)",
                "the default is 10,000; for a larger bound give it, e.g. `.dead_letter_max_len(1_000_000)`, \
                 or `.no_dead_letter()` to keep none",
            )
            .on(key)
            .into());
        }
        if self.max_age.as_millis() == 0 {
            return Err(ConfigError::new(
                "dead_letter_max_age",
                "must be at least 1 ms (zero would drop every dead letter at once)",
                "the default is 30 days; for a longer one give it, e.g. \
                 `.dead_letter_max_age(Duration::from_secs(365 * 24 * 3600))`",
            )
            .on(key)
            .into());
        }
        Ok(())
    }
}
