//! Redis errors, converted into the core's error with credentials removed, and sorted into an
//! [`ErrorKind`] once, here: by fred's error kind and by the code word that starts a Redis error
//! reply (`OOM`, `WRONGTYPE`, `NOGROUP`, ...; RustStream's scripts answer with codes of their own,
//! `RSARGS` and `RSBADENTRY`). Nothing else reads an error's text: where fred gives a reply no
//! kind of its own (`NOSCRIPT`, `is_noscript`; a reply read on the pub/sub sessions' own
//! connections, which fred does not read, `reply_error`), the code is read here too.

use ruststream_core::{Error as CoreError, ErrorKind};

/// What kind of failure the fred error `e` is.
pub fn kind_of(e: &fred::error::Error) -> ErrorKind {
    use fred::error::ErrorKind as Fred;
    match e.kind() {
        Fred::IO if is_certificate(e.details()) => ErrorKind::Tls,
        Fred::IO | Fred::Canceled | Fred::Routing | Fred::Sentinel => ErrorKind::Connection,
        Fred::Tls => ErrorKind::Tls,
        Fred::Auth => ErrorKind::Auth,
        Fred::Config | Fred::Url => ErrorKind::Configuration,
        Fred::Timeout => ErrorKind::Timeout,
        Fred::Protocol | Fred::Parse | Fred::NotFound => ErrorKind::UnexpectedReply,
        Fred::Backpressure => ErrorKind::Unavailable,
        Fred::Cluster => code_kind(e.details()).unwrap_or(ErrorKind::Connection),
        _ => code_kind(e.details())
            .or_else(|| script_refused(e.details()).then_some(ErrorKind::Unsupported))
            .unwrap_or(ErrorKind::Other),
    }
}

/// Whether `reply` is `NOSCRIPT`: the server does not hold the script (load it, then run it
/// again). fred gives this reply no kind of its own (`Unknown`; its own reload reads the word
/// too), so it is read here.
pub(crate) fn is_noscript(reply: &str) -> bool {
    reply.split_ascii_whitespace().next() == Some("NOSCRIPT")
}

/// A Redis error reply read on one of RustStream's own connections (the pub/sub sessions'
/// wire, which fred does not read), as a fred error of the kind fred gives the same reply on
/// its own: `Cluster` for a redirection (`MOVED`, `ASK`: [`fred::error::Error::is_moved`]
/// then holds), `Auth` for a refused login or command (`NOAUTH`, `WRONGPASS`, `NOPERM`), else
/// `Unknown`, which [`kind_of`] sorts by the reply's code.
pub(crate) fn reply_error(reply: &str) -> fred::error::Error {
    use fred::error::ErrorKind as Fred;
    let kind = match reply.split_ascii_whitespace().next() {
        Some("MOVED" | "ASK") => Fred::Cluster,
        _ if code_kind(reply) == Some(ErrorKind::Auth) => Fred::Auth,
        _ => Fred::Unknown,
    };
    fred::error::Error::new(kind, reply.to_owned())
}

/// Whether an `ERR` reply says the server will not load or run a script as written: it cannot
/// compile it, knows none of its shebang's flags, or lacks a command it calls. Redis gives
/// these no code of their own, so this is the one place that reads an `ERR` reply's words.
/// Retrying such a script never helps.
fn script_refused(reply: &str) -> bool {
    const REFUSALS: [&str; 4] = [
        "Error compiling script",
        "flag in script shebang",
        "Unknown lua shebang",
        "Unknown Redis command called from",
    ];
    reply.starts_with("ERR") && REFUSALS.iter().any(|r| reply.contains(r))
}

/// The kind a Redis error reply's code (its first word) says, when it starts with a code of
/// its own kind (`ERR` and codes not listed are not).
fn code_kind(reply: &str) -> Option<ErrorKind> {
    let code = reply.split_ascii_whitespace().next()?;
    if code.len() < 2 || !code.bytes().all(|b| b.is_ascii_uppercase()) {
        return None;
    }
    Some(match code {
        "OOM" => ErrorKind::OutOfMemory,
        "WRONGTYPE" => ErrorKind::WrongType,
        "NOSCRIPT" | "RSARGS" | "RSBADENTRY" => ErrorKind::Script,
        "BUSY" => ErrorKind::Busy,
        "LOADING" | "READONLY" | "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN" | "NOREPLICAS"
        | "MISCONF" => ErrorKind::Unavailable,
        "NOAUTH" | "WRONGPASS" | "NOPERM" => ErrorKind::Auth,
        "CROSSSLOT" => ErrorKind::CrossSlot,
        "NOGROUP" => ErrorKind::NoGroup,
        "BUSYGROUP" => ErrorKind::GroupExists,
        "UNBLOCKED" => ErrorKind::Interrupted,
        _ => return None,
    })
}

/// Whether an I/O error is rustls refusing the server's certificate: fred keeps an I/O error
/// only as the `Debug` text of its `std::io::Error`, whose custom error is then
/// `InvalidCertificate(..)`.
fn is_certificate(debug: &str) -> bool {
    debug.contains("Certificate")
}

/// Converts a fred error into the core's: of its [`kind_of`], with its message free of passwords,
/// and the fred error kept as its [`source`](std::error::Error::source). For code that calls
/// fred itself (e.g. on `TestApp`'s client) and returns RustStream's errors.
pub fn core(e: fred::error::Error) -> CoreError {
    let message = match e.kind() {
        fred::error::ErrorKind::IO => in_words(&e),
        kind => redact(&format!("{kind:?}: {}", e.details())),
    };
    core_as(e, message)
}

/// The core's error for `e`, of its [`kind_of`], with `message` (already free of passwords); the
/// source is `e` with passwords removed from its details too.
pub(crate) fn core_as(e: fred::error::Error, message: String) -> CoreError {
    let kind = kind_of(&e);
    let source = fred::error::Error::new(e.kind().clone(), redact(e.details()));
    CoreError::broker_from(kind, message, source)
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

/// A broker error of kind [`ErrorKind::Configuration`] (the publish asks what the channel
/// cannot do; trying again does not help), with the [`PubSubError`] as its source.
impl From<PubSubError> for CoreError {
    fn from(e: PubSubError) -> Self {
        CoreError::broker_from(ErrorKind::Configuration, e.to_string(), e)
    }
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
    use fred::error::{Error as Fred, ErrorKind as FredKind};
    use ruststream_core::ErrorKind;

    use super::{core, io_words, is_noscript, kind_of, redact, reply_error};

    #[test]
    fn replies_fred_gives_no_kind_are_sorted_here() {
        assert!(is_noscript("NOSCRIPT No matching script. Please use EVAL."));
        assert!(!is_noscript("ERR NOSCRIPT is not a code here"));
        let moved = reply_error("MOVED 3999 127.0.0.1:6381");
        assert!(moved.is_moved());
        assert_eq!(*moved.kind(), FredKind::Cluster);
        for refused in [
            "NOAUTH Authentication required.",
            "NOPERM this user has no permissions to access one of the channels",
            "WRONGPASS invalid username-password pair",
        ] {
            assert_eq!(*reply_error(refused).kind(), FredKind::Auth, "{refused}");
            assert_eq!(kind_of(&reply_error(refused)), ErrorKind::Auth, "{refused}");
        }
        let other = reply_error("ERR unknown command 'SSUBSCRIBE'");
        assert_eq!(*other.kind(), FredKind::Unknown);
        assert!(!other.is_moved());
    }

    #[test]
    fn errors_are_sorted_by_fred_kind_and_reply_code() {
        let reply = |text: &str| kind_of(&Fred::new(FredKind::Unknown, text.to_owned()));
        let oom = "OOM command not allowed when used memory > 'maxmemory'.";
        assert_eq!(reply(oom), ErrorKind::OutOfMemory);
        let wrong = Fred::new(
            FredKind::InvalidArgument,
            "WRONGTYPE Operation against a key",
        );
        assert_eq!(kind_of(&wrong), ErrorKind::WrongType);
        assert_eq!(
            reply("NOGROUP No such key 's' or consumer group 'g'"),
            ErrorKind::NoGroup
        );
        assert_eq!(
            reply("BUSYGROUP Consumer Group name already exists"),
            ErrorKind::GroupExists
        );
        assert_eq!(
            reply("UNBLOCKED client unblocked via CLIENT UNBLOCK"),
            ErrorKind::Interrupted
        );
        assert_eq!(
            reply("LOADING Redis is loading the dataset in memory"),
            ErrorKind::Unavailable
        );
        assert_eq!(
            reply("RSARGS settle.lua: malformed entry at argument 2"),
            ErrorKind::Script
        );
        assert_eq!(reply("ERR unknown command"), ErrorKind::Other);
        // A script the server will not load or run: Redis 6.2 reading a 7.0 shebang, an
        // unknown flag, a command the server lacks.
        for refused in [
            "ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'",
            "ERR Unexpected flag in script shebang: bogus",
            "ERR Error running script (call to f_f9f1): @user_script:1: @user_script: 1: Unknown Redis command called from Lua script",
            "ERR Unknown Redis command called from script script: 1996, on @user_script:1.",
        ] {
            assert_eq!(reply(refused), ErrorKind::Unsupported, "{refused}");
        }
        assert_eq!(
            reply("ERR Error running script: user_script:3: attempt to index a nil value"),
            ErrorKind::Other
        );
        // A message of fred's own is not a reply code.
        assert_eq!(reply("Expected OK, found 1"), ErrorKind::Other);
        let io = Fred::new(FredKind::IO, "Os { code: 111, kind: ConnectionRefused }");
        assert_eq!(kind_of(&io), ErrorKind::Connection);
        assert_eq!(
            kind_of(&Fred::new(FredKind::Timeout, "")),
            ErrorKind::Timeout
        );
    }

    #[test]
    fn the_core_error_keeps_the_redis_error_as_its_source() {
        let e = core(Fred::new(FredKind::Unknown, "OOM command not allowed"));
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        let source = std::error::Error::source(&e).expect("a source");
        assert!(source.downcast_ref::<Fred>().is_some(), "{source:?}");
        let url = core(Fred::new(FredKind::Url, "bad redis://u:s3cret@h:6379"));
        let source = std::error::Error::source(&url).expect("a source");
        assert!(!source.to_string().contains("s3cret"), "{source}");
    }

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
