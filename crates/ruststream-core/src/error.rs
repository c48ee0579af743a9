//! The one error type of the core: what went wrong, said so that the reader knows what to do,
//! and its [`ErrorKind`], to match on.

use crate::ConfigError;

/// The error of a client library a broker error came from, kept as its
/// [`source`](std::error::Error::source).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can fail in RustStream's core and in the brokers built on it.
///
/// Match on [`Error::kind`], not on the message: the message is for a person and may change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The application is configured in a way that cannot run: which option, on what, what is
    /// wrong and how to fix it. Made from a [`ConfigError`] with `.into()` or `?`.
    #[error("configuration: {0}")]
    Config(Box<ConfigError>),
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
    /// The broker could not connect, or a command failed. Made with [`Error::broker`] or
    /// [`Error::broker_from`].
    #[error("broker: {message}")]
    #[non_exhaustive]
    Broker {
        /// What kind of failure it is.
        kind: ErrorKind,
        /// What went wrong and what to do, for a person.
        message: String,
        /// The client library's error, when there was one.
        #[source]
        source: Option<BoxError>,
    },
    /// A job awaited with `await_result` failed: its message went to the dead-letter list.
    #[error("job {id} failed: {reason}")]
    JobFailed {
        /// The job's (message's) id.
        id: String,
        /// The dead letter's reason (`dropped`, `max-attempts`, `decode: ..`).
        reason: String,
    },
    /// A job awaited with `await_result` was cancelled (`publisher.cancel(..)`).
    #[error("job {id} was cancelled")]
    Cancelled {
        /// The job's (message's) id.
        id: String,
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

/// What kind of failure an [`Error`] is: what code (ours and our users') matches on.
///
/// A broker sorts its client's errors into these once, where it converts them (the Redis broker
/// by the client's own error kind and by the code word that starts a Redis error reply: `OOM`,
/// `WRONGTYPE`, `NOGROUP`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The application's configuration cannot run ([`Error::Config`], [`Error::NoDestination`],
    /// a client setting such as a malformed URL, or a publish its destination cannot take).
    Configuration,
    /// A payload could not be encoded ([`Error::Encode`]).
    Encode,
    /// A payload could not be decoded ([`Error::Decode`]).
    Decode,
    /// No running broker ([`Error::NotConnected`]).
    NotConnected,
    /// An awaited job failed ([`Error::JobFailed`]).
    JobFailed,
    /// An awaited job was cancelled ([`Error::Cancelled`]).
    Cancelled,
    /// Something did not answer in time: a command, or an awaited result
    /// ([`Error::ResultTimeout`]).
    Timeout,
    /// The server cannot be reached, or the connection was lost before the reply.
    Connection,
    /// The TLS handshake failed: the server's certificate was refused, or it speaks no TLS.
    Tls,
    /// The server refused the credentials, or the user may not run the command (Redis `NOAUTH`,
    /// `WRONGPASS`, `NOPERM`).
    Auth,
    /// The server is out of memory and refuses commands that may grow it (Redis `OOM`).
    OutOfMemory,
    /// A key holds another type than the one RustStream keeps there (Redis `WRONGTYPE`); the
    /// message names the key.
    WrongType,
    /// A script failed or was called wrongly (Redis `NOSCRIPT`; RustStream's own scripts'
    /// `RSARGS`, `RSBADENTRY`): a bug or processes of different versions.
    Script,
    /// The server is busy running a script (Redis `BUSY`).
    Busy,
    /// The server cannot serve now: loading its data, a read-only replica, its master down, the
    /// cluster down (Redis `LOADING`, `READONLY`, `MASTERDOWN`, `CLUSTERDOWN`, `TRYAGAIN`, ...).
    Unavailable,
    /// Keys of one command are in different cluster slots (Redis `CROSSSLOT`).
    CrossSlot,
    /// A stream's consumer group does not exist (Redis `NOGROUP`).
    NoGroup,
    /// A stream's consumer group exists already (Redis `BUSYGROUP`).
    GroupExists,
    /// A blocking command was interrupted on purpose (Redis `UNBLOCKED`).
    Interrupted,
    /// The server's reply was not what the command should answer.
    UnexpectedReply,
    /// A durable publish reached fewer replicas than asked within its timeout
    /// ([`Error::NotDurable`]).
    NotDurable,
    /// The server cannot run what RustStream needs: its version is older than the minimum, or
    /// it refuses to load or run one of RustStream's scripts (an unknown command or script
    /// flag). Retrying does not help; the message names the server or the script and says what
    /// to change.
    Unsupported,
    /// Anything else (e.g. a Redis `ERR` reply); the message says what.
    Other,
}

impl Error {
    /// A broker error of `kind` with the given message and no source.
    pub fn broker(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::Broker {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A broker error of `kind` with the given message, caused by `source` (the client
    /// library's error, kept for [`std::error::Error::source`]).
    pub fn broker_from(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Self::Broker {
            kind,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// The configuration error this is, to match on its option and subject.
    pub fn config_error(&self) -> Option<&ConfigError> {
        match self {
            Self::Config(e) => Some(e),
            _ => None,
        }
    }

    /// What kind of failure this is, to match on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Config(_) | Self::NoDestination { .. } => ErrorKind::Configuration,
            Self::Encode(_) => ErrorKind::Encode,
            Self::Decode(_) => ErrorKind::Decode,
            Self::Broker { kind, .. } => *kind,
            Self::JobFailed { .. } => ErrorKind::JobFailed,
            Self::Cancelled { .. } => ErrorKind::Cancelled,
            Self::ResultTimeout { .. } => ErrorKind::Timeout,
            Self::NotConnected => ErrorKind::NotConnected,
            Self::NotDurable { .. } => ErrorKind::NotDurable,
        }
    }
}

/// The result type of RustStream.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_broker_error_keeps_its_kind_and_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = Error::broker_from(ErrorKind::Connection, "cannot connect", io);
        assert_eq!(e.kind(), ErrorKind::Connection);
        assert_eq!(e.to_string(), "broker: cannot connect");
        assert_eq!(
            e.source().map(ToString::to_string).as_deref(),
            Some("refused")
        );
        assert!(Error::broker(ErrorKind::Other, "x").source().is_none());
        assert!(e.config_error().is_none());
    }
}
