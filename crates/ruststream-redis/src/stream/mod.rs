//! Redis Streams read by a consumer group: the [`RedisStream`] source and the [`Publish`] policy.
//!
//! An entry's body is its `payload` field; other fields are headers, except the reserved `rs.id`
//! and `rs.attempt`. This folder holds all of it:
//!
//! | file | what | Redis |
//! |---|---|---|
//! | `source.rs` | [`RedisStream`]: the source's options and keys | none |
//! | `transport.rs` | the source as the broker sees it: checks, keys, description; creating the group; opening the receiver | `XGROUP CREATE key group 0 MKSTREAM` (an existing group is kept), `XINFO GROUPS key` |
//! | `receive.rs` | reading, with one reader (a consumer of the group, on a connection of its own) per [`RedisStream::readers`] | `read.lua` (see `crate::claim`: the pause, concurrency-cap and rate-limit gates, `XREADGROUP` without `BLOCK`, `XACK` of entries of cancelled messages, `XINFO GROUPS` for what they held back) and `XREAD BLOCK ms STREAMS key <last id>` to wait; `XGROUP CREATE` again after its connection came back; `SUBSCRIBE key.cancel` (cancel signals, on the broker's wake-up connection) |
//! | `native.rs` | a group with no cap and no rate limit reads without `read.lua`, while no pause or cancel is pending (`crate::claim::native`) | `XREADGROUP` and `XREVRANGE key + - COUNT 1` in a watched `MULTI` |
//! | `recover.rs` | crash recovery: its own pending entries at start, sweeps of a dead consumer's, lease renewal | `XPENDING key group [IDLE ms] - + n [consumer]`, `XCLAIM key group consumer ms id.. [JUSTID]` |
//! | `consumers.rs` | forgetting the consumers of gone instances (no pending entry, idle past a bound), from the sweep | `forget_consumers.lua`: `XINFO CONSUMERS key group`, `XGROUP DELCONSUMER` |
//! | `entries.rs` | the reserved fields; `XREADGROUP` and `XCLAIM` replies read into entries | none |
//! | `settle.rs` | settling | `XACK key group id..` for acks; `settle.lua` (`XACK`, then `XADD` / delayed set / `LPUSH` dead letters, none for a cancelled message) for the rest |
//! | `publish.rs` | publishing | `XADD key [MAXLEN ~ n \| MINID ~ id] * ..`, pipelined |
//! | `bound.lua` | a route's bound, for the scripts that re-add entries | `XTRIM key MAXLEN ~ n` or `MINID ~ <TIME - age>` |
//! | `trim.rs` | [`trim_acked`](RedisStream::trim_acked) | `trim.lua`: `XINFO GROUPS`, `XPENDING key group`, `XTRIM key MINID ~ id` |

pub(crate) mod consumers;
pub(crate) mod entries;
mod native;
mod publish;
mod receive;
mod recover;
pub(crate) mod settle;
mod source;
mod transport;
pub(crate) mod trim;

pub use self::entries::{ATTEMPT_FIELD, ID_FIELD, PAYLOAD_FIELD};
pub(crate) use self::publish::{add, fields, xadds};
pub use self::source::{RedisStream, TWO_READERS_FROM};
pub(crate) use self::transport::pairs;
pub use crate::policy::StreamPublish as Publish;
