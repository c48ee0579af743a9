//! What a broker and its subscriptions use when nothing sets its own: the mover's schedule, the
//! recovery's idle time, the job record's ttl, the flow repair's grace, the command timeout and the history's period. A
//! leaf module: the connection settings read these without reaching into the options or the
//! features that use them. Sends no command.

use std::time::Duration;

/// How often an idle reader looks for due delayed entries when no wake-up came, unless the
/// broker's or the source's `schedule_interval` says otherwise.
pub const DEFAULT_SCHEDULE_INTERVAL: Duration = Duration::from_secs(5);

/// Most due entries one mover call moves, unless `move_batch` says otherwise.
pub const DEFAULT_MOVE_BATCH: u32 = 128;

/// How long a dead worker's claims (a reliable list's, a stream group's pending entries) take to
/// come back to the other workers, unless the source's `min_idle` says otherwise. A live worker
/// keeps its claims alive, so this bounds only how late a crashed worker's work is picked up.
pub const DEFAULT_MIN_IDLE: Duration = Duration::from_secs(30);

/// How a subscription's mover is scheduled (see the `delayed` module's docs for what each trades).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Schedule {
    /// How often an idle reader looks for due entries when no wake-up came.
    pub(crate) interval: Duration,
    /// Most due entries one `move_due.lua` call moves.
    pub(crate) batch: u32,
}

impl Default for Schedule {
    /// [`DEFAULT_SCHEDULE_INTERVAL`], [`DEFAULT_MOVE_BATCH`].
    fn default() -> Self {
        Self {
            interval: DEFAULT_SCHEDULE_INTERVAL,
            batch: DEFAULT_MOVE_BATCH,
        }
    }
}

/// How long a flow may be publishing before the readers of its parent's queue publish the rest
/// of it themselves (a repair), unless the broker sets its own
/// ([`RedisBroker::flow_repair_grace`](crate::RedisBroker::flow_repair_grace)).
pub const DEFAULT_FLOW_REPAIR_GRACE: Duration = Duration::from_secs(30);

/// How long a job's record lives after its last write, unless the broker sets its own.
pub const DEFAULT_RESULT_TTL: Duration = Duration::from_secs(3600);

/// How long a command may go without a reply before it fails and its connection is replaced
/// (`RedisBroker::command_timeout`); a blocking read may take its wait on top of this.
pub(crate) const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a subscription writes its history unless told otherwise: once a minute.
pub const DEFAULT_HISTORY_EVERY: Duration = Duration::from_secs(60);
