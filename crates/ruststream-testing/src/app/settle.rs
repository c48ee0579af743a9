//! Moving a [`TestApp`]'s clock and waiting until it has settled: nothing left to do without
//! time passing, no command sent to the models and no handler called for `QUIET_ROUNDS`
//! scheduler rounds; and reporting what the models could not run.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ruststream_core::{Error, Result};

use super::test_app::TestApp;

/// Scheduler rounds in a row with no progress after which the app counts as settled.
const QUIET_ROUNDS: u32 = 64;
/// Most scheduler rounds one settle may take.
const MAX_ROUNDS: u32 = 200_000;

impl TestApp {
    /// Lets `d` of (virtual) time pass, every timer on the way firing in order, then waits until
    /// the app settles.
    ///
    /// # Errors
    /// When the model met a command or script it does not implement, or the app does not settle.
    pub async fn advance(&self, d: Duration) -> Result<()> {
        tokio::time::sleep(d).await;
        self.settle().await
    }

    /// Waits until the app has nothing left to do without time passing.
    ///
    /// # Errors
    /// When the model met a command or script it does not implement, or the app keeps working
    /// without time passing (a busy loop).
    pub async fn settle(&self) -> Result<()> {
        let mut last = self.progress();
        let mut quiet = 0;
        for _ in 0..MAX_ROUNDS {
            tokio::task::yield_now().await;
            let now = self.progress();
            if now == last {
                quiet += 1;
                if quiet >= QUIET_ROUNDS {
                    return self.check_model();
                }
            } else {
                quiet = 0;
                last = now;
            }
        }
        self.check_model()?;
        Err(Error::broker(
            ruststream_core::ErrorKind::Timeout,
            format!(
                "TestApp: the app did not settle within {MAX_ROUNDS} scheduler rounds: something keeps sending commands without time passing"
            ),
        ))
    }

    fn progress(&self) -> u64 {
        self.brokers
            .iter()
            .map(|(_, m)| m.commands_processed())
            .sum::<u64>()
            + self.recorder.events()
    }

    /// Errors the model reported since the last check.
    pub(super) fn check_model(&self) -> Result<()> {
        let errors: Vec<String> = self.brokers.iter().flat_map(|(_, m)| m.errors()).collect();
        let seen = self.reported.swap(errors.len(), Ordering::Relaxed);
        match errors.get(seen..) {
            Some(new) if !new.is_empty() => Err(Error::broker(
                ruststream_core::ErrorKind::Other,
                format!("in-memory Redis model: {}", new.join("; ")),
            )),
            _ => Ok(()),
        }
    }
}
