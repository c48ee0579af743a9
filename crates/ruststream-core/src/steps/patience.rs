//! A step's record write, tried again while the server refuses it for a passing reason.
//!
//! When a record is written, the step's effect has already happened. A record that never lands
//! makes the step run again at the next delivery, so a write the server refuses for a reason
//! that passes (out of memory until the queues drain, a failover, a dropped connection) is tried
//! again for up to [`PATIENCE`], with a growing pause, before the step fails. Any other error
//! fails the step at once.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, ErrorKind, Result};

/// How long a refused record write is tried again.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

/// The first pause between two tries; each next pause doubles, up to [`MOST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MOST_PAUSE: Duration = Duration::from_secs(1);

/// Whether `e` is a refusal that passes.
fn passing(e: &Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::OutOfMemory
            | ErrorKind::Unavailable
            | ErrorKind::Connection
            | ErrorKind::Timeout
            | ErrorKind::Busy
    )
}

/// Runs `write` until it succeeds, fails for a reason that does not pass, or [`PATIENCE`] ends;
/// `step` names the step in the warning logged at the first refusal.
pub(crate) async fn write_patiently<T, F, Fut>(step: &str, mut write: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let started = Instant::now();
    let mut pause = FIRST_PAUSE;
    let mut warned = false;
    loop {
        match write().await {
            Ok(done) => return Ok(done),
            Err(e) if passing(&e) && started.elapsed() + pause < PATIENCE => {
                if !warned {
                    tracing::warn!(step, error = %e, "a step's record was refused; trying again for up to {PATIENCE:?}");
                    warned = true;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MOST_PAUSE);
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn refused(kind: ErrorKind) -> Error {
        Error::broker(kind, "refused")
    }

    #[tokio::test(start_paused = true)]
    async fn a_passing_refusal_is_tried_again_until_the_write_lands() {
        let tries = AtomicU32::new(0);
        let written = write_patiently("charge", || async {
            if tries.fetch_add(1, Ordering::SeqCst) < 3 {
                Err(refused(ErrorKind::OutOfMemory))
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(written.ok(), Some(7));
        assert_eq!(tries.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lasting_refusal_fails_the_step_after_the_patience() {
        let started = Instant::now();
        let tries = AtomicU32::new(0);
        let written: Result<()> = write_patiently("charge", || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(refused(ErrorKind::OutOfMemory))
        })
        .await;
        assert_eq!(written.map_err(|e| e.kind()), Err(ErrorKind::OutOfMemory));
        assert!(started.elapsed() <= PATIENCE, "{:?}", started.elapsed());
        assert!(tries.load(Ordering::SeqCst) > 5, "tried again");
    }

    #[tokio::test(start_paused = true)]
    async fn any_other_error_fails_at_once() {
        let tries = AtomicU32::new(0);
        let written: Result<()> = write_patiently("charge", || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(refused(ErrorKind::WrongType))
        })
        .await;
        assert!(written.is_err());
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }
}
