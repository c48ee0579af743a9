//! The Redis broker of RustStream, on [`fred`].
//!
//! - [`RedisList`]: work queues on lists, simple (popped, at most once) or reliable (claimed
//!   into a processing list, settled with `LREM`, at least once).
//! - [`RedisStream`]: streams read with a consumer group, optionally trimmed to what every group
//!   has acknowledged ([`RedisStream::trim_acked`]).
//! - [`RedisChannel`]: Pub/Sub channels, patterns and sharded channels
//!   (`SUBSCRIBE`/`PSUBSCRIBE`/`SSUBSCRIBE`, at most once).
//! - [`list::Publish`]: how replies and publishes are pushed (`LPUSH`, optional expiry);
//!   [`stream::Publish`] (`XADD`, optionally bounded with `MAXLEN`/`MINID ~`) and
//!   [`pubsub::Publish`] (`PUBLISH`, `SPUBLISH`) for the other transports.
//! - [`RateLimit`]: `.rate_limit(n, per)` on a list or stream (`.rate_limit_by(header, n, per)`
//!   per key on a list), shared by every worker of every instance through a limiter in Redis.
//! - `.max_in_flight(n)` on a reliable list or a stream group ([`RedisList::max_in_flight`],
//!   [`RedisStream::max_in_flight`]): at most `n` of the queue's messages handled at once across
//!   every instance, a gate of the claim that counts what the queue records in flight.
//! - [`RedisBroker`]: connections, key prefix, credentials.
//! - Cancelling a message by id (`publisher.cancel(destination, id)`): removed when delayed,
//!   its handler told (and dropped after a grace) when running, dropped at its claim when
//!   queued, through a cancel record per list queue or stream (`cancel/`).
//! - Job progress and results (`Context::set_result`, `publish().await_result(..)`): one hash
//!   per job with a ttl ([`RedisBroker::result_ttl`]), written by `job.lua` (`results.rs`).
//!
//! Data model (key `K`): `K` the queue, `K.processing` claimed entries, `K.delayed` +
//! `K.delayed.payloads` retries waiting for their time, `K.dead` dead letters with a `reason`
//! header; a Pub/Sub channel `C` stores nothing but its dead letters, `C.dead`. On a cluster,
//! the default derived names of an untagged key go in its slot by tagging the whole key
//! (`{app:uploads}.delayed`); a reliable queue needs a hash tag. Every state change is one Lua
//! script, so a crash between two commands never loses or duplicates an entry.
//!
//! # Where things are
//!
//! One folder per transport, each with its options, receive path, settle path and Lua scripts
//! (`*.lua`, read with `include_str!`): `list/`, `stream/`, `pubsub/`; `delayed/` schedules and
//! moves delayed entries. Around them: `keys` names every key and checks the cluster's slot
//! rule, `options` holds what every source can set and `queue_options` what a list or stream
//! can set too, `limit` the rate limiter, `transport` is the contract a transport fulfils,
//! `conn` builds connections, `policy` holds each destination's publish policy (its route) and
//! the shape of a list a subscription shares with its route, `publish` routes outgoing
//! messages, `frame` is the byte layout of a list value, `broker` ties them to the core.
//!
//! # One message, from `LPUSH` to `LREM`
//!
//! A reliable list `RedisList::new("{jobs}").reliable()`:
//!
//! 1. A producer publishes: `publish.rs` encodes the message as a [`frame`] (id, attempt 1,
//!    headers, payload) and `list/publish.rs` sends `LPUSH {jobs} <frame>`.
//! 2. The app starts the subscription: the core's dispatch loop (`ruststream-core`,
//!    `dispatch.rs`) asks the broker for a receiver, which `list/mod.rs` opens
//!    (`list/receive.rs` `open`): the keys are named once (`{jobs}`, `{jobs}.processing`, the
//!    delayed set, `{jobs}.dead`), a connection of its own is opened for blocking reads, and a
//!    settler is built on the same keys.
//! 3. The dispatch loop calls `receive(n)` with the permits it has free: `list/receive.rs` runs
//!    `list/claim.lua`, which moves up to `n` entries from the right of `{jobs}` to the left of
//!    `{jobs}.processing` and returns them; when there are none it waits with
//!    `BLMOVE {jobs} {jobs} RIGHT RIGHT t` and claims again.
//! 4. The dispatch loop decodes each payload and runs the handler; its outcome becomes a
//!    `Settlement` (ack, retry, retry later, dead) sent to the settle task.
//! 5. The settle task sends a batch to `list/settle.rs`, which runs `list/settle.lua` once:
//!    for an ack, `LREM {jobs}.processing -1 <frame>`. The entry is gone from Redis only now.

// The library's API: every item reachable from outside is `pub`, every other one `pub(crate)`;
// every public type can be printed. The scripts' typed calls are reached through `testing`.
#![warn(unreachable_pub, missing_debug_implementations)]

mod back;
mod broker;
mod cancel;
mod claim;
mod conn;
mod dead;
mod dead_bound;
mod defaults;
mod delayed;
mod durable;
pub mod error;
mod flow;
pub mod frame;
mod gauges;
pub mod history;
mod keys;
pub mod list;
mod lua;
#[cfg(feature = "testing")]
pub mod memory;
#[cfg(not(feature = "testing"))]
mod memory;
pub mod operate;
mod options;
mod partition;
mod pause;
mod periodic;
mod policy;
mod publish;
mod publisher;
pub mod pubsub;
mod queue_options;
mod rejoin;
mod reply;
mod results;
mod settle;
mod setup;
mod steps;
pub mod stream;
mod sweep_clock;
#[doc(hidden)]
pub mod testing;
pub mod timeline;
mod tls;
mod transport;
mod unique;
mod version;

pub use broker::RedisBroker;
pub use claim::limit::RateLimit;
pub use dead::{
    DEAD_AT_HEADER, DEFAULT_DEAD_LETTER_MAX_AGE, DEFAULT_DEAD_LETTER_MAX_LEN, DeadBound,
};
pub use frame::REASON_HEADER;
pub use keys::{RateKeys, SourceKeys};
pub use list::RedisList;
pub use options::DEFAULT_FLOW_REPAIR_GRACE;
pub use options::DEFAULT_MIN_IDLE;
pub use options::DEFAULT_RESULT_TTL;
pub use options::{DEFAULT_MOVE_BATCH, DEFAULT_SCHEDULE_INTERVAL, MAX_MOVE_BATCH};
pub use policy::PublishPolicy;
pub use pubsub::RedisChannel;
pub use stream::{RedisStream, TWO_READERS_FROM};
pub use transport::RedisSource;
