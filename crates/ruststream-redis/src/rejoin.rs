//! Leases after a reconnect: an outage longer than `min_idle` (a Redis restart, a network cut)
//! leaves every live claim scored as if its worker were gone, so the first sweep after the
//! connection comes back would redeliver the work of live workers. A reader's [`Rejoin`] is
//! marked when its connection comes back (fred reconnected it: `ReadConn::came_back`, asked
//! before each sweep, and `ReadConn::on_reconnect`; or the reader replaced it) or a lease
//! renewal fails; the
//! reader then renews its own claims' leases on its reading connection before its next sweep,
//! and holds its sweeps back for a grace (two renewal periods), so that the other live readers,
//! which renew when they reconnect or at their next renewal, do so before anyone sweeps.
//!
//! A sweep sent before an outage must not run after it either: a claim that may sweep (a list's
//! `claim.lua` with recovery, a stream's sweeping `XCLAIM`) is sent with `lua::once`, so fred
//! fails it rather than sending it again after the reconnect.
//!
//! Sends no command itself (the list's `lease.lua`, the stream's `XCLAIM .. JUSTID` renew).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::conn::ReadConn;

/// Whether a reader must renew its leases before it sweeps, and until when it must not sweep.
#[derive(Debug)]
pub(crate) struct Rejoin {
    stale: AtomicBool,
    no_sweep_until: Mutex<Option<Instant>>,
    grace: Duration,
}

impl Rejoin {
    /// A reader whose leases are renewed every `every`.
    pub(crate) fn new(every: Duration) -> Arc<Self> {
        Arc::new(Self {
            stale: AtomicBool::new(false),
            no_sweep_until: Mutex::new(None),
            grace: every * 2,
        })
    }

    /// Marks this reader whenever `conn` comes back.
    pub(crate) fn watch(self: &Arc<Self>, conn: &mut ReadConn) {
        let me = Arc::downgrade(self);
        conn.on_reconnect(move || {
            if let Some(me) = me.upgrade() {
                me.mark();
            }
        });
    }

    /// Marks this reader if fred reconnected `conn` since the last look (`ReadConn::came_back`);
    /// whether it did. Asked before a sweep.
    pub(crate) fn mark_if_back(&self, conn: &ReadConn) -> bool {
        let back = conn.came_back();
        if back {
            self.mark();
        }
        back
    }

    /// The leases may have aged past `min_idle`: renew before the next sweep.
    pub(crate) fn mark(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// Whether to renew the leases now (once per mark); starts the grace without sweeps.
    pub(crate) fn take(&self) -> bool {
        if !self.stale.swap(false, Ordering::AcqRel) {
            return false;
        }
        if let Ok(mut until) = self.no_sweep_until.lock() {
            *until = Some(Instant::now() + self.grace);
        }
        true
    }

    /// Whether the reader may sweep (not within the grace after a reconnect).
    pub(crate) fn may_sweep(&self) -> bool {
        self.no_sweep_until
            .lock()
            .map_or(true, |until| until.is_none_or(|t| Instant::now() >= t))
    }
}

#[cfg(test)]
mod tests {
    use super::Rejoin;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_reconnect_renews_once_then_holds_sweeps_for_the_grace() {
        let r = Rejoin::new(Duration::from_secs(1));
        assert!(!r.take() && r.may_sweep());
        r.mark();
        assert!(r.take(), "renew after the mark");
        assert!(!r.take(), "once");
        assert!(!r.may_sweep());
        tokio::time::advance(Duration::from_millis(2001)).await;
        assert!(r.may_sweep());
    }
}
