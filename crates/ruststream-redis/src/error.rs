//! Redis errors, converted into the core's error with credentials removed.

use ruststream_core::Error as CoreError;

/// A failed Redis command.
#[derive(Debug, thiserror::Error)]
#[error("redis: {0}")]
pub struct RedisError(String);

impl From<fred::error::Error> for RedisError {
    fn from(e: fred::error::Error) -> Self {
        match e.kind() {
            fred::error::ErrorKind::IO => Self(in_words(&e)),
            kind => Self(redact(&format!("{kind:?}: {}", e.details()))),
        }
    }
}

/// The details of `e` for a person: an I/O error, which fred keeps as the `Debug` text of
/// `std::io::Error` (`Os { code: 111, kind: ConnectionRefused, .. }`), becomes words
/// (`connection refused`); passwords are removed.
pub(crate) fn in_words(e: &fred::error::Error) -> String {
    let details = redact(e.details());
    if *e.kind() != fred::error::ErrorKind::IO {
        return details;
    }
    io_words(&details).unwrap_or(details)
}

/// Words for the `Debug` text of a `std::io::Error`, when it can be read.
fn io_words(debug: &str) -> Option<String> {
    let after = |field: &str| debug.find(field).map(|i| &debug[i + field.len()..]);
    let kind = after("kind: ").map(|k| {
        let end = k.find([',', ' ', '}', ')']).unwrap_or(k.len());
        &k[..end]
    });
    let words = match kind? {
        "ConnectionRefused" => "connection refused",
        "ConnectionReset" => "connection reset by the server",
        "ConnectionAborted" | "BrokenPipe" | "UnexpectedEof" => "connection closed",
        "TimedOut" => "timed out",
        "HostUnreachable" => "host unreachable",
        "NetworkUnreachable" => "network unreachable",
        "AddrNotAvailable" => "address not available",
        "PermissionDenied" => "permission denied",
        _ => {
            // `message: "..."` (an OS error) or `error: "..."` (a custom one, e.g. DNS).
            let quoted = after("message: \"").or_else(|| after("error: \""))?;
            return quoted.find('"').map(|end| quoted[..end].to_lowercase());
        }
    };
    Some(words.to_owned())
}

impl From<RedisError> for CoreError {
    fn from(e: RedisError) -> Self {
        CoreError::Broker(e.0)
    }
}

/// What Pub/Sub cannot do, said with what to do instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PubSubError {
    /// A delayed publish (`.delay(..)`, `.at(..)`) to a Pub/Sub channel: nothing is stored.
    #[error(
        "channel `{channel}`: pub/sub cannot delay a message, it stores nothing; publish it without .delay/.at, or to a list or stream"
    )]
    CannotDelay {
        /// The channel, as the publisher named it.
        channel: String,
    },
    /// A publish with `.unique_for(..)` to a channel.
    #[error(
        "channel `{channel}`: pub/sub cannot hold a message unique within a window, it stores nothing; publish it without .unique_for, or to a list or stream"
    )]
    CannotBeUnique {
        /// The channel, as the publisher named it.
        channel: String,
    },
    /// A durable publish (`.durable(..)`) to a channel: nothing is stored to replicate.
    #[error(
        "channel `{channel}`: pub/sub cannot make a message durable, it stores nothing; publish it without .durable, or to a list or stream"
    )]
    CannotBeDurable {
        /// The channel, as the publisher named it.
        channel: String,
    },
}

impl From<PubSubError> for CoreError {
    fn from(e: PubSubError) -> Self {
        CoreError::config(e.to_string())
    }
}

/// Converts a fred error into the core's.
pub(crate) fn core(e: fred::error::Error) -> CoreError {
    RedisError::from(e).into()
}

/// Replaces the password of any `scheme://user:password@host` in `text` with `***`.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail.find(['/', ' ', '"', '\'']).unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                if let Some(colon) = authority[..at].find(':') {
                    out.push_str(&authority[..colon]);
                    out.push_str(":***");
                } else {
                    out.push_str("***");
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::{io_words, redact};

    #[test]
    fn io_errors_are_said_in_words() {
        let refused = r#"Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }"#;
        assert_eq!(io_words(refused).as_deref(), Some("connection refused"));
        let dns = r#"Custom { kind: Uncategorized, error: "failed to lookup address information: Name or service not known" }"#;
        assert_eq!(
            io_words(dns).as_deref(),
            Some("failed to lookup address information: name or service not known")
        );
        assert_eq!(io_words("something else"), None);
    }

    #[test]
    fn passwords_are_removed() {
        assert_eq!(
            redact("redis://u:s3cret@h:6379/0"),
            "redis://u:***@h:6379/0"
        );
        assert_eq!(redact("redis://s3cret@h:6379"), "redis://***@h:6379");
        assert_eq!(redact("x redis://h:6379 y"), "x redis://h:6379 y");
        assert!(!redact("failed: rediss://a:b@c and redis://d:e@f").contains('b'));
    }
}
