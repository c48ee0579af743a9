//! [`TestPublish`], a publish through a [`TestBroker`](super::TestBroker) that returns once the
//! app has settled.

use std::time::{Duration, SystemTime};

use ruststream_core::{Enqueued, MessageType, PublishBuilder, Result};

use super::test_app::TestApp;

/// A publish through a [`TestBroker`](super::TestBroker); `.publish().await` returns once the
/// app has settled.
#[must_use = "a publish does nothing until `.publish().await`"]
pub struct TestPublish<'a, T> {
    pub(super) inner: PublishBuilder<'a, T>,
    pub(super) app: &'a TestApp,
}

impl<T> std::fmt::Debug for TestPublish<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPublish")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<T: MessageType> TestPublish<'_, T> {
    /// The destination key; without it the type's outgoing name is used.
    pub fn to(mut self, destination: impl Into<String>) -> Self {
        self.inner = self.inner.to(destination);
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.inner = self.inner.header(name, value);
        self
    }

    /// Sets the message id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.inner = self.inner.id(id);
        self
    }

    /// Delivers the message once `delay` has passed (on the model's clock).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.inner = self.inner.delay(delay);
        self
    }

    /// Enqueues the message only when no publish of its id to the destination holds a window
    /// (`PublishBuilder::unique_for`; the window runs on the model's clock). Needs `.id(..)`.
    pub fn unique_for(mut self, window: Duration) -> Self {
        self.inner = self.inner.unique_for(window);
        self
    }

    /// Makes the publish durable (`PublishBuilder::durable`). The model has no replicas and
    /// acknowledges at once, as a server with `replicas` replicas would: the publish returns
    /// `Ok` and never `Error::NotDurable`.
    pub fn durable(mut self, replicas: u32, timeout: Duration) -> Self {
        self.inner = self.inner.durable(replicas, timeout);
        self
    }

    /// On a destination spread over partitions, the key that picks the partition.
    pub fn partition_key(mut self, key: impl Into<String>) -> Self {
        self.inner = self.inner.partition_key(key);
        self
    }

    /// On a queue with priority levels, the level (see
    /// [`PublishBuilder::priority`](ruststream_core::PublishBuilder::priority)).
    pub fn priority(mut self, level: u8) -> Self {
        self.inner = self.inner.priority(level);
        self
    }

    /// On a queue with fair groups, the message's group (see
    /// [`PublishBuilder::group`](ruststream_core::PublishBuilder::group)).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.inner = self.inner.group(group);
        self
    }

    /// Delivers the message at `when`, on the model's clock: compute it from
    /// [`TestApp::now`] (`tb.now() + d`), which follows the virtual clock.
    pub fn at(mut self, when: SystemTime) -> Self {
        self.inner = self.inner.at(when);
        self
    }

    /// Publishes, then waits until the app has settled (the handlers it triggers have run);
    /// returns what was [`Enqueued`].
    ///
    /// # Errors
    /// When the publish fails (no destination, an encoding error), or the app does not settle.
    pub async fn publish(self) -> Result<Enqueued> {
        let enqueued = self.inner.publish().await?;
        self.app.settle().await?;
        Ok(enqueued)
    }
}
