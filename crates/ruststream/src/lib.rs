#![doc = include_str!("../README.md")]
// The library's API: every item reachable from outside is `pub`, every other one `pub(crate)`;
// every public type can be printed.
#![warn(unreachable_pub, missing_debug_implementations)]

pub mod cli;
#[cfg(feature = "dashboard")]
pub mod dashboard;
#[cfg(feature = "http")]
pub mod http;
mod logs;
pub mod operate;

pub use cli::{run_main, run_main_from};
/// Flows: a parent after its children (`publisher.flow(&parent)`, `ctx.children()`).
pub use ruststream_core::flow;
/// Job progress and results: `Context::set_result`, `publish().await_result(..)`.
pub use ruststream_core::job;
/// The OpenTelemetry API RustStream makes its spans with (feature `otel`): install your tracer
/// provider through it, so that it is the version RustStream reads.
#[cfg(feature = "otel")]
pub use ruststream_core::opentelemetry;
/// Periodic jobs: `Periodic`, `CatchUp`, `#[periodic(..)]`.
pub use ruststream_core::periodic;
/// Durable steps, sleeps, waits for signals and checkpoints: `ctx.step(..)`, `ctx.sleep(..)`,
/// `ctx.wait_for(..)`, `ctx.checkpoint(..)`.
pub use ruststream_core::steps;
pub use ruststream_core::{
    App, AppInfo, Backoff, BatchContext, BatchOutcome, CancelOutcome, ConfigError, Context,
    DeliveryInfo, Due, Durability, Enqueued, Error, ErrorKind, Handle, HandleBatch, HandlerOutcome,
    Headers, Health, IntoBatchOutcome, IntoHandlerResult, IntoSubscriber, MessageType, Mount,
    OutMessage, PublishBuilder, Publisher, Publishing, Result, RunningApp, RustStream, Settlement,
    Source, Subscriber, SubscriptionState, asyncapi, outgoing, subscriber,
};
pub use ruststream_macros::{Outgoing, app, periodic, subscriber};
/// The Redis broker crate, for what the prelude does not bring (scripts, frames).
pub use ruststream_redis as redis;
pub use ruststream_redis::{
    PublishPolicy, RedisBroker, RedisChannel, RedisList, RedisSource, RedisStream, list, pubsub,
    stream,
};
pub use schemars;

/// Test a service with no server, on a virtual clock: [`TestApp`](testing::TestApp) runs an app
/// with every `RedisBroker` on an in-memory Redis model (feature `testing`).
#[cfg(feature = "testing")]
pub mod testing {
    pub use ruststream_testing::*;
}

/// Everything an application needs: `use ruststream::prelude::*;`.
pub mod prelude {
    pub use crate::flow::{ChildFailure, ChildOutcome};
    pub use crate::periodic::{CatchUp, Periodic};
    pub use crate::{
        App, AppInfo, Backoff, BatchContext, BatchOutcome, Context, Handle, HandleBatch,
        HandlerOutcome, MessageType, Outgoing, Publisher, RedisBroker, RedisChannel, RedisList,
        RedisStream, RustStream, list, outgoing, periodic, pubsub, run_main, stream, subscriber,
    };
    pub use schemars::JsonSchema;
    pub use serde::{Deserialize, Serialize};
}

/// Re-exports used by the macros; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use ruststream_core::__private::*;
    pub use ruststream_core::{IntoBatchOutcome, IntoHandlerResult, Source, message};
}
