//! Broker-agnostic core of RustStream.
//!
//! Users depend on the `ruststream` crate; this crate holds what every broker shares: the
//! [`Handle`] trait and [`HandlerOutcome`], batch handlers ([`HandleBatch`]), the per-message
//! [`Context`] (with job progress and results, see [`job`]; cancellation, see [`cancel`]), message types ([`MessageType`]), the [`Publisher`], the [`Broker`] contract, the
//! dispatch loop (concurrency, panics, retries, snoozes, deadlines, cancellation, graceful shutdown), [`RustStream`] apps and the
//! AsyncAPI document.
//! It sends no command to any server itself.
//!
//! With the feature `otel`, publishes and handled messages are OpenTelemetry spans of one trace
//! across services, carried in a W3C `traceparent` header: see the `otel` module.

// The library's API: every item reachable from outside is `pub`, every other one `pub(crate)`;
// every public type can be printed.
#![warn(unreachable_pub, missing_debug_implementations)]

pub mod app;
pub mod asyncapi;
pub mod batch;
pub mod broker;
pub mod cancel;
mod config_error;
pub mod context;
mod dispatch;
pub mod durable;
mod erased;
pub mod error;
pub mod flow;
pub mod handler;
pub mod health;
pub mod history;
pub mod job;
pub mod message;
pub mod observe;
#[cfg(feature = "otel")]
pub mod otel;
pub mod outcome;
pub mod periodic;
pub mod publish;
pub mod retry;
pub mod running;
pub mod steps;
pub mod subscriber;

pub use app::{App, AppInfo, Mount, RunningApp, RustStream};
pub use batch::{BatchBuilder, BatchContext, BatchOutcome, HandleBatch, IntoBatchOutcome};
pub use broker::{
    Broker, BrokerSource, ChannelDoc, DEFAULT_MAX_SNOOZES, Delivery, Receiver, Retries, Settler,
    Source, SubscribeOptions,
};
pub use cancel::CancelOutcome;
pub use config_error::ConfigError;
pub use context::{Context, DeliveryInfo};
pub use durable::Durability;
pub use error::{Error, ErrorKind, Result};
pub use flow::{ChildFailure, ChildOutcome, FlowBuilder, FlowChild, FlowState};
pub use handler::{Handle, IntoHandlerResult};
pub use health::{Health, Probe, SubscriptionState};
pub use job::{JobRecord, JobStore, JobWrite};
pub use message::{Headers, MessageType};
pub use outcome::{HandlerOutcome, Settlement, Why};
pub use periodic::{CatchUp, IntoPeriodic, Periodic};
pub use publish::{
    Due, Enqueued, GROUP_HEADER, OutMessage, PublishBackend, PublishBuilder, Publisher, Publishing,
};
pub use retry::Backoff;
pub use steps::{
    Signalled, StepError, StepRecord, StepStore, StepWrite, StepsNote, WaitTimedOut, Waited,
};
pub use subscriber::{
    IntoSubscriber, MessageDoc, ReplyBuilder, Subscriber, SubscriberBuilder, subscriber,
};

/// The OpenTelemetry API this crate makes its spans with (feature `otel`): install a tracer
/// provider through this very crate (`opentelemetry::global::set_tracer_provider`), so that both
/// sides use one version of it.
#[cfg(feature = "otel")]
pub use opentelemetry;

/// Re-exports used by the macros; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use bytes::Bytes;
    pub use schemars;
    pub use serde_json;
}
