//! The operator's command line: each subcommand of `inspect`, `dead`, `delayed`, `pause`,
//! `resume`, `cancel`, `flow`, `job` and `periodic`, and their arguments, as clap parses them. Sends
//! nothing to Redis: `mod.rs` runs what is parsed here.

use clap::{Args, Subcommand};
use ruststream_redis::operate::Select;

/// The operator's commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Operate {
    /// Per subscription: transport and keys; ready, in flight, delayed, dead; paused.
    Inspect {
        /// Only this subscription (its key or channel).
        subscription: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// A running instance's metrics endpoint (`run --metrics-addr`), e.g.
        /// http://127.0.0.1:9000/metrics: adds its handled and failed messages per second.
        #[cfg(feature = "prometheus")]
        #[arg(long, value_name = "URL")]
        metrics_url: Option<String>,
    },
    /// Dead letters: list, show, requeue, purge. A dead-letter list keeps at most 10,000, each
    /// at most 30 days (the subscription's `dead_letter_max_len`/`dead_letter_max_age`); the
    /// oldest go first; each carries its `reason` and `dead-at` (ms since the epoch) headers.
    #[command(subcommand)]
    Dead(Dead),
    /// Delayed entries: list, promote, cancel.
    #[command(subcommand)]
    Delayed(Delayed),
    /// Every worker of the subscription stops claiming (in-flight work finishes) until `resume`;
    /// with `--group`, only that group of a list with fair groups is passed over.
    Pause {
        /// The subscription.
        subscription: String,
        /// Pause only this group (a list with fair groups); the others are served.
        #[arg(long)]
        group: Option<String>,
        /// Kept with the pause: who and why.
        #[arg(long, default_value = "paused from the command line")]
        note: String,
    },
    /// The subscription's workers claim again (with `--group`: that group's messages).
    Resume {
        /// The subscription.
        subscription: String,
        /// Resume only this group (a list with fair groups).
        #[arg(long)]
        group: Option<String>,
    },
    /// Cancels one message by id wherever it is: delayed → removed; running → its handler is
    /// told, and dropped after the grace; queued → dropped when claimed. Exit code 3: not found.
    Cancel {
        /// The subscription (a list).
        subscription: String,
        /// The message id.
        #[arg(long)]
        id: String,
    },
    /// Flows: a flow's state and each child's.
    #[command(subcommand)]
    Flow(Flow),
    /// Jobs of the app's list queues: one by id, or a state's list, a page at a time.
    #[command(subcommand)]
    Job(JobCommand),
    /// Periodic jobs every instance registered: schedule, zone, destination, last and next tick.
    Periodic {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `flow ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum Flow {
    /// A flow's state (pending, enqueued, failed), policy, and each child's outcome and result.
    /// Exit code 3: no such flow (never published, or expired).
    Show {
        /// The flow's id (its parent's message id).
        id: String,
        /// The subscription its parent goes to; without it, every list and stream of the app
        /// is looked in.
        #[arg(long)]
        subscription: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `job ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum JobCommand {
    /// Every job with this id (queued, running, delayed, retrying, dead), with its headers,
    /// payload, reason, steps, the flow it is a child of and the flow it parents, and the
    /// record its handler left (progress, result, error). Exit code 3: none.
    Show {
        /// The message id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The jobs in one state: queued, running, delayed, retrying, dead or completed.
    List {
        /// queued, running, delayed, retrying, dead or completed (the app's, where results
        /// are kept).
        state: String,
        /// Only this subscription; without it, every list queue and stream of the app.
        #[arg(long)]
        subscription: Option<String>,
        /// Skip this many first.
        #[arg(long, default_value_t = 0)]
        offset: usize,
        /// Most jobs shown per subscription.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `dead ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum Dead {
    /// The oldest dead letters, decoded.
    List(ListArgs),
    /// One dead letter, decoded.
    Show(ShowArgs),
    /// Move dead letters back to their queue, attempt count reset, reason kept in `dead-history`.
    Requeue(ChangeArgs),
    /// Delete dead letters (asks for confirmation unless --yes).
    Purge(ChangeArgs),
}

/// `delayed ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum Delayed {
    /// The earliest delayed entries.
    List(ListArgs),
    /// Make delayed entries due now.
    Promote(ChangeArgs),
    /// Remove delayed entries (asks for confirmation unless --yes).
    Cancel(ChangeArgs),
}

/// A listing.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// The subscription.
    pub(super) subscription: String,
    /// Most entries shown.
    #[arg(long, default_value_t = 20)]
    pub(super) limit: usize,
    /// Print JSON.
    #[arg(long)]
    pub(super) json: bool,
}

/// One entry.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The subscription.
    pub(super) subscription: String,
    /// The message id (or `#N`, the N-th oldest, for an entry without one).
    #[arg(long)]
    pub(super) id: String,
    /// Print JSON.
    #[arg(long)]
    pub(super) json: bool,
}

/// A change to one entry or to all.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "all"])))]
pub(crate) struct ChangeArgs {
    /// The subscription.
    pub(super) subscription: String,
    /// The message id (or `#N`).
    #[arg(long)]
    pub(super) id: Option<String>,
    /// Every entry, oldest first.
    #[arg(long)]
    pub(super) all: bool,
    /// With --all: at most this many.
    #[arg(long, requires = "all")]
    pub(super) limit: Option<usize>,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub(super) yes: bool,
    /// Print JSON.
    #[arg(long)]
    pub(super) json: bool,
}

impl ChangeArgs {
    pub(super) fn select(&self) -> Select {
        match &self.id {
            Some(id) => Select::Id(id.clone()),
            None => Select::All { limit: self.limit },
        }
    }
}
