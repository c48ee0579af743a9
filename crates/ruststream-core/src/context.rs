//! The per-message [`Context`] a handler receives: who the message is, and a way to publish.

use std::sync::Arc;

use crate::{Headers, Publisher};

/// What a broker knows about one delivered message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryInfo {
    /// The message id (made by the publisher; for a raw value, made on first delivery).
    pub message_id: String,
    /// 1 on the first delivery, 2 on the first retry, and so on.
    pub attempt: u32,
    /// The key the message was read from, without the broker's prefix.
    pub source: Arc<str>,
    /// The headers the publisher set.
    pub headers: Headers,
}

impl DeliveryInfo {
    /// Info for a message with an id and attempt number, read from `source`.
    pub fn new(message_id: String, attempt: u32, source: Arc<str>, headers: Headers) -> Self {
        Self {
            message_id,
            attempt,
            source,
            headers,
        }
    }
}

/// Per-message context passed to a handler.
#[derive(Debug)]
pub struct Context<'a> {
    info: &'a DeliveryInfo,
    publisher: &'a Publisher,
}

impl<'a> Context<'a> {
    /// A context over a delivery, publishing through `publisher`.
    pub fn new(info: &'a DeliveryInfo, publisher: &'a Publisher) -> Self {
        Self { info, publisher }
    }

    /// The message id.
    pub fn message_id(&self) -> &str {
        &self.info.message_id
    }

    /// The delivery attempt: 1 the first time, 2 on the first retry, ...
    pub fn attempt(&self) -> u32 {
        self.info.attempt
    }

    /// The key the message was read from.
    pub fn source(&self) -> &str {
        &self.info.source
    }

    /// All headers set by the publisher.
    pub fn headers(&self) -> &Headers {
        &self.info.headers
    }

    /// One header, when set.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.info.headers.get(name).map(String::as_str)
    }

    /// A publisher on the broker the message came from:
    /// `ctx.publisher().message(&v).to("k").publish().await?`.
    pub fn publisher(&self) -> &'a Publisher {
        self.publisher
    }
}
