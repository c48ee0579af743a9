//! Work queues on Redis lists: the [`RedisList`] source and the [`Publish`] policy.
//!
//! Producers `LPUSH`; consumers take from the right, so entries come out in the order they went
//! in. A simple list pops: at most once. A reliable list claims into a processing list and
//! settles with `LREM`: at least once. This folder holds all of it:
//!
//! | file | what | Redis |
//! |---|---|---|
//! | `source.rs` | [`RedisList`]: the source's options, its keys, the checks of its recovery options | none |
//! | `transport.rs` | the source as the broker sees it: checks, keys, description, route; opening the receiver | `LLEN processing` at start, to warn of entries a reliable list without recovery left there |
//! | `receive.rs` | reading | a simple list with no gate but the pause and cancels: `RPOP key n` in a watched `MULTI` (`crate::claim::native`); else `claim.lua` for both modes (see `crate::claim`: levels highest first, behind the pause, concurrency-cap and rate-limit gates; a simple list records nothing, a reliable one its processing list and claims), `BLMOVE key key RIGHT RIGHT t` to wait when empty |
//! | `reliable.rs` | reading a reliable list: its claims' sequence numbers, leases and sweep deadline | through `receive.rs`; `TIME` before a reader's first sweep, `lease.lua` after a reconnect |
//! | `settle.rs` | settling a reliable list | `settle.lua` (`LREM`, `LPUSH`, `ZADD`/`HSET`, `ZREM`; with recovery, a batch's marks `GET`/`SET`, `marks.lua`) |
//! | `publish.rs` | publishing | `LPUSH`, `push_ttl.lua` (and `PUBLISH` when a priority level gets its first entry) |
//! | `lease.rs` | a reliable list's claims kept alive while their handlers run | `lease.lua` |
//! | `groups.rs` | fair groups: their keys, the publish onto a group, the operator's group pause | `group_push.lua`, `HSET`/`HDEL`, `PUBLISH` |
//! | `levels.rs` | priority levels: their keys, a publish's level, the readers' wake-ups | `SUBSCRIBE`, `PUBLISH` |
//!
//! A simple list's settle only pushes dead letters (see `crate::dead`).

pub mod groups;
pub(crate) mod lease;
mod levels;
pub(crate) mod publish;
mod receive;
mod reliable;
pub(crate) mod settle;
mod source;
mod transport;

pub(crate) use self::levels::place;
pub(crate) use self::publish::{push, ttl_ms};
pub use self::source::{Mode, RedisList};
pub use crate::policy::ListPublish as Publish;
pub use crate::policy::MAX_PRIORITIES;

#[cfg(test)]
mod tests;
