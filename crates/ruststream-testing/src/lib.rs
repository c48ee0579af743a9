//! Test RustStream services with no server, on a virtual clock: the way FastStream users test
//! their handlers, and fast enough that retries and crash recovery taking hours in production
//! take milliseconds.
//!
//! Users reach it as `ruststream::testing` (feature `testing` of the `ruststream` crate):
//!
//! - [`TestApp::start`] runs an app with every `RedisBroker` on a [`MemoryRedis`]: an in-memory
//!   model of the Redis behaviour the broker relies on (lists and processing lists, recovery and
//!   delayed sets, streams with groups and pending entries, pub/sub, key expiry, the cluster slot
//!   rule). The broker code above the connection is the production code: fred's mocking layer
//!   hands every command to the model, and the broker's real Lua scripts, as fred sends them,
//!   run on an embedded Lua 5.1 (the version Redis embeds) with Redis's scripting environment.
//! - Under `#[tokio::test(start_paused = true)]`, [`TestApp::advance`] moves the clock that claim
//!   scores, `min_idle`, delays, retry backoff, snoozes, handler deadlines (`.timeout(d)`) and
//!   TTLs read, then lets the app settle.
//! - `tb.broker::<RedisBroker>()` publishes ([`TestBroker::message`]) and asserts on subscribers
//!   ([`TestBroker::subscriber`]) and on what was published ([`TestBroker::published`]).
//!
//! A durable publish (`.durable(replicas, timeout)`, or a route's) is accepted: the model has no
//! replicas and answers `WAIT n` with `n`, as a server whose asked replicas all hold the write,
//! so it returns `Ok` at once and never [`NotDurable`](ruststream_core::Error::NotDurable). Test
//! the handling of `NotDurable` against a real Redis (asking for more replicas than it has).
//!
//! The conformance suite of the `ruststream` crate (`tests/integration/conformance.rs`) runs the
//! same scenarios on the model and on a real Redis, so the model cannot drift from Redis.

// The library's API: every item reachable from outside is `pub`, every other one `pub(crate)`;
// every public type can be printed.
#![warn(unreachable_pub, missing_debug_implementations)]

mod app;
mod model;
mod published;
mod record;

pub use app::{InMemoryBroker, TestApp, TestBroker, TestPublish};
pub use model::{MemoryRedis, Pushed};
pub use published::{Message, Published};
pub use record::{Call, Calls, Expected};
