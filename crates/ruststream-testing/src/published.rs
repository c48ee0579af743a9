//! What publishes put on keys, as a test reads them: [`Message`] (one decoded frame or stream
//! entry) and [`Published`] (a key's messages, with assertions).

use std::fmt::{self, Write as _};
use std::marker::PhantomData;

use bytes::Bytes;
use ruststream_core::{Headers, MessageType};

/// One message a publish put on a key, decoded from the frame or stream entry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Message {
    /// The message id (empty for a raw value pushed by a non-RustStream producer).
    pub id: String,
    /// The headers the publisher set.
    pub headers: Headers,
    /// The encoded payload.
    pub payload: Bytes,
    /// Whether it went to the key's delayed set (a delayed publish) rather than the key.
    pub delayed: bool,
}

impl Message {
    /// The message a list value, delayed entry or channel message holds.
    pub(crate) fn of_frame(f: ruststream_redis::frame::Frame, delayed: bool) -> Self {
        Self {
            id: f.id,
            headers: f.headers,
            payload: f.payload,
            delayed,
        }
    }

    /// The message a stream entry's fields hold.
    pub(crate) fn of_stream_entry(fields: Vec<(bytes::Bytes, bytes::Bytes)>) -> Self {
        let mut m = Self {
            id: String::new(),
            headers: ruststream_core::Headers::new(),
            payload: bytes::Bytes::new(),
            delayed: false,
        };
        for (k, v) in fields {
            match &k[..] {
                b"payload" => m.payload = v,
                b"rs.id" => m.id = String::from_utf8_lossy(&v).into_owned(),
                b"rs.attempt" => {}
                _ => {
                    m.headers.insert(
                        String::from_utf8_lossy(&k).into_owned(),
                        String::from_utf8_lossy(&v).into_owned(),
                    );
                }
            }
        }
        m
    }
}

/// The messages published to one key so far: `tb.broker::<RedisBroker>().published::<T>("key")`.
#[derive(Debug, Clone)]
#[must_use = "a snapshot asserts nothing until one of its assert_ methods is called"]
pub struct Published<T> {
    key: String,
    messages: Vec<Message>,
    _type: PhantomData<fn() -> T>,
}

impl<T: MessageType + PartialEq + fmt::Debug> Published<T> {
    pub(crate) fn new(key: &str, messages: Vec<Message>) -> Self {
        Self {
            key: key.to_owned(),
            messages,
            _type: PhantomData,
        }
    }

    /// Every message, oldest first.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The payloads decoded as `T` (those that are not a `T` are left out).
    pub fn values(&self) -> Vec<T> {
        self.messages
            .iter()
            .filter_map(|m| T::decode(&m.payload).ok())
            .collect()
    }

    fn seen(&self) -> String {
        if self.messages.is_empty() {
            return format!("nothing was published to `{}`", self.key);
        }
        let mut out = format!("published to `{}`:", self.key);
        for (i, m) in self.messages.iter().enumerate() {
            let shown = match T::decode(&m.payload) {
                Ok(v) => format!("{v:?}"),
                Err(_) => crate::record::text(&m.payload),
            };
            let _ = write!(
                out,
                "\n  #{} id {} {shown}{}",
                i + 1,
                m.id,
                if m.delayed { " (delayed)" } else { "" }
            );
        }
        out
    }

    /// Asserts exactly one message was published.
    ///
    /// # Panics
    /// Otherwise; the message lists what was published.
    #[track_caller]
    pub fn assert_called_once(&self) -> &Self {
        self.assert_called(1)
    }

    /// Asserts exactly `n` messages were published.
    ///
    /// # Panics
    /// Otherwise; the message lists what was published.
    #[track_caller]
    pub fn assert_called(&self, n: usize) -> &Self {
        assert!(
            self.messages.len() == n,
            "expected {n} message(s) published to `{}`, there were {}; {}",
            self.key,
            self.messages.len(),
            self.seen()
        );
        self
    }

    /// Asserts nothing was published.
    ///
    /// # Panics
    /// Otherwise; the message lists what was published.
    #[track_caller]
    pub fn assert_not_called(&self) -> &Self {
        self.assert_called(0)
    }

    /// Asserts the most recent message decodes to `expected`.
    ///
    /// # Panics
    /// When nothing was published, or the last message is something else.
    #[track_caller]
    pub fn with(&self, expected: &T) -> &Self {
        let last = self.messages.last().map(|m| T::decode(&m.payload));
        match last {
            Some(Ok(got)) if got == *expected => self,
            _ => panic!(
                "expected the last message published to `{}` to be {expected:?}; {}",
                self.key,
                self.seen()
            ),
        }
    }
}
