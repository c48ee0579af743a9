//! The typed calls of the Lua scripts, for the tests of the scripts in `ruststream-testing`,
//! which run each script on Redis and on the in-memory model and compare what they did.
//!
//! Not part of the API: these types follow the scripts' keys and arguments and change with
//! them, in any release. Hidden from the documentation for that reason. An application never
//! needs them: the broker runs every script itself.

pub use crate::back::Dest;
pub use crate::cancel::{CancelKeys, CancelList, CancelStream, StreamCancelKeys};
pub use crate::claim::limit::Held;
pub use crate::claim::{Claim, Claimed, Gate, Record, StreamClaimed, StreamRead};
pub use crate::dead::push::PushDead;
pub use crate::delayed::{Later, MoveDue, Moved, ScheduleLater};
pub use crate::flow::{ChildDone, MarkSent, StartFlow};
pub use crate::list::settle::{SettleKeys, SettleList};
pub use crate::list::{lease::Lease, publish::PushTtl};
pub use crate::lua::Call;
pub use crate::memory::BlockingRead;
pub use crate::operate::dead::{Purge, Requeue, Taken};
pub use crate::operate::delayed::{ChangeDelayed, DelayedChange, DelayedPick};
pub use crate::operate::inspect::OldestClaim;
pub use crate::periodic::{PERIODIC_KEEP, PeriodicFired, RegisterPeriodic, keep_of};
pub use crate::results::{JobKind, WriteJob};
pub use crate::settle::{Op, Settled};
pub use crate::steps::{BeginWait, SendSignal, WriteStep};
pub use crate::stream::consumers::ForgetConsumers;
pub use crate::stream::settle::SettleStream;
pub use crate::stream::trim::TrimAcked;
pub use crate::transport::InBatch;
pub use crate::unique::{Batch as UniqueBatch, PublishUnique};
