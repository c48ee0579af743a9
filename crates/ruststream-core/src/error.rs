//! The one error type of the core: what went wrong, said so that the reader knows what to do.

use std::borrow::Cow;

/// Everything that can fail in RustStream's core and in the brokers built on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The application is configured in a way that cannot run; the message says how to fix it.
    #[error("configuration: {0}")]
    Config(Cow<'static, str>),
    /// A payload could not be encoded for publishing.
    #[error("encode: {0}")]
    Encode(String),
    /// A payload could not be decoded into the handler's type.
    #[error("decode: {0}")]
    Decode(String),
    /// A publish had no destination: neither `.to(..)` nor an outgoing name on the type.
    #[error(
        "publish: no destination for {type_name}; call `.to(\"key\")` or give the type a name with `#[outgoing(name = \"...\")]`"
    )]
    NoDestination {
        /// The Rust type that was published.
        type_name: &'static str,
    },
    /// The broker could not connect, or a command failed.
    #[error("broker: {0}")]
    Broker(String),
    /// A job awaited with `await_result` failed: its message went to the dead-letter list.
    #[error("job {id} failed: {reason}")]
    JobFailed {
        /// The job's (message's) id.
        id: String,
        /// The dead letter's reason (`dropped`, `max-attempts`, `decode: ..`).
        reason: String,
    },
    /// No result came within the time given to `await_result`.
    #[error(
        "no result for job {id} within {waited:?}: it may still run; read it later with `publisher.job_state(\"{id}\")`"
    )]
    ResultTimeout {
        /// The job's (message's) id, to read its state later.
        id: String,
        /// How long it was awaited.
        waited: std::time::Duration,
    },
    /// A durable publish ([`Durability`](crate::Durability)) reached fewer replicas than asked
    /// within its timeout. Its messages are on the primary and may be lost in a failover; they
    /// are not known to be lost. Publish again (with an id and `.unique_for(..)` the retry is a
    /// no-op for a message that did land).
    #[error(
        "publish not durable: {acked} of {asked} replica(s) acknowledged it within the timeout; it is on the primary only and may be lost in a failover: publish again (with `.id(..)` and `.unique_for(..)` a retry enqueues nothing twice)"
    )]
    NotDurable {
        /// The replicas asked for.
        asked: u32,
        /// The replicas that acknowledged the write (with `WAITAOF`, that wrote it to disk).
        acked: u32,
    },
    /// The operation needs a running broker, and it is closed or was never started.
    #[error("broker is not connected: start the app (or the broker) before publishing")]
    NotConnected,
}

impl Error {
    /// A configuration error with the given message.
    pub fn config(msg: impl Into<Cow<'static, str>>) -> Self {
        Self::Config(msg.into())
    }
}

/// The result type of RustStream.
pub type Result<T, E = Error> = std::result::Result<T, E>;
