//! [`TestBroker`], one broker of a [`TestApp`]: publish to it, assert on its subscribers and on
//! what was published to its keys; and [`InMemoryBroker`], the broker types `TestApp` runs in
//! memory.

use std::fmt;

use ruststream_core::{Broker, MessageType, Publisher, Result};
use ruststream_redis::RedisBroker;
use ruststream_redis::frame::Frame;

use super::publish::TestPublish;
use super::test_app::TestApp;
use crate::MemoryRedis;
use crate::model::Pushed;
use crate::published::{Message, Published};
use crate::record::Calls;

impl TestApp {
    /// The first broker of type `B` (`RedisBroker`), to publish to and assert on.
    pub fn broker<B: InMemoryBroker>(&self) -> TestBroker<'_> {
        self.test_broker(&self.first.0, &self.first.1)
    }

    /// The `n`-th (0-based) broker of type `B`, in the order the app mounted them.
    pub fn nth_broker<B: InMemoryBroker>(&self, n: usize) -> Option<TestBroker<'_>> {
        self.brokers
            .get(n)
            .map(|(broker, model)| self.test_broker(broker, model))
    }

    fn test_broker(&self, broker: &RedisBroker, model: &MemoryRedis) -> TestBroker<'_> {
        TestBroker {
            app: self,
            broker: broker.clone(),
            model: model.clone(),
            publisher: broker.publisher(),
        }
    }
}

/// A broker type `TestApp` runs in memory: `RedisBroker`.
pub trait InMemoryBroker: Broker + sealed::Sealed {}

impl InMemoryBroker for RedisBroker {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for ruststream_redis::RedisBroker {}
}

/// One broker of a [`TestApp`]: publish to it, and assert on its subscribers and keys.
pub struct TestBroker<'a> {
    app: &'a TestApp,
    broker: RedisBroker,
    model: MemoryRedis,
    publisher: Publisher,
}

impl fmt::Debug for TestBroker<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestBroker")
            .field("broker", &self.broker)
            .finish_non_exhaustive()
    }
}

impl<'a> TestBroker<'a> {
    /// Starts a publish of `value`, to its type's outgoing name unless `.to("key")` says
    /// otherwise; `.publish().await` returns once the app has settled.
    pub fn message<'b, T: MessageType>(&'b self, value: &'b T) -> TestPublish<'b, T> {
        TestPublish {
            inner: self.publisher.message(value),
            app: self.app,
        }
    }

    /// Starts a publish of many values in one round trip.
    pub fn messages<'b, T: MessageType>(&'b self, values: &'b [T]) -> TestPublish<'b, T> {
        TestPublish {
            inner: self.publisher.messages(values),
            app: self.app,
        }
    }

    /// Sends the signal `name` with `payload` to message `id` of `destination`
    /// ([`Publisher::signal`]); returns once the app has settled.
    ///
    /// # Errors
    /// As [`Publisher::signal`].
    pub async fn signal<T: serde::Serialize>(
        &self,
        destination: &str,
        id: &str,
        name: &str,
        payload: &T,
    ) -> Result<ruststream_core::Signalled> {
        let sent = self
            .publisher
            .signal(destination, id, name, payload)
            .await?;
        self.app.settle().await?;
        Ok(sent)
    }

    /// The calls so far of the subscriber of `name`: its source key (every subscriber of that
    /// key), or a subscription name such as `key#2`.
    pub fn subscriber(&self, name: &str) -> Calls {
        Calls::new(
            name,
            self.app.recorder.calls(name),
            self.app.recorder.names(),
        )
    }

    /// What publishes put on `key` so far (lists, streams, delayed sets, channels, and a
    /// list's priority levels after level 0's), decoded as `T` on assertion. Entries that claims and settles move between keys (retries, recovery,
    /// dead letters of reliable lists) are not publishes; read those keys with
    /// [`client`](Self::client).
    pub fn published<T: MessageType + PartialEq + fmt::Debug>(&self, key: &str) -> Published<T> {
        let full = format!("{}{key}", self.broker.key_prefix());
        let delayed = self.broker.delayed_set_key(key);
        // A list's priority levels hold its messages too (their `PUBLISH`ed wake-ups are not).
        let levels = self.broker.level_keys(key);
        let levels: Vec<&str> = levels.iter().map(String::as_str).collect();
        let on_levels = self
            .model
            .pushes(&levels)
            .into_iter()
            .filter(|p| matches!(p, Pushed::List(_)));
        let messages = self
            .model
            .pushes(&[&full, &delayed])
            .into_iter()
            .chain(on_levels)
            .map(|p| match p {
                Pushed::List(v) => Message::of_frame(Frame::decode(v), false),
                Pushed::Scheduled(v) => Message::of_frame(Frame::decode(v), true),
                Pushed::Channel(v) => Message::of_frame(Frame::decode(v), false),
                Pushed::Stream(fields) => Message::of_stream_entry(fields),
            })
            .collect();
        Published::new(key, messages)
    }

    /// The broker, e.g. to publish from a task of the test.
    pub fn broker(&self) -> &RedisBroker {
        &self.broker
    }

    /// The in-memory server this broker runs on.
    pub fn model(&self) -> &MemoryRedis {
        &self.model
    }

    /// A fred client on this broker's in-memory server, for any command (`LLEN`, `ZCARD`,
    /// `XPENDING`, ...); keys are full keys, with the broker's prefix. Already initialized.
    ///
    /// # Errors
    /// When fred cannot build the client.
    pub async fn client(&self) -> Result<fred::clients::Client> {
        use fred::interfaces::ClientLike;
        let client = self.model.client().map_err(ruststream_redis::error::core)?;
        client.init().await.map_err(ruststream_redis::error::core)?;
        Ok(client)
    }
}
