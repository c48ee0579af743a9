//! [`Routes`], each destination's policy at run time, and the round robin over a destination's
//! partitions. Sends no command.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::AtomicUsize;

use super::publish_policy::PublishPolicy;

/// Each destination's default policy (keys as the user names them), and the round robin of
/// messages without a partition key over a destination's partitions.
#[derive(Debug, Default)]
pub(crate) struct Routes(RwLock<HashMap<String, PublishPolicy>>, AtomicUsize);

impl Routes {
    /// Sets `destination`'s policy.
    pub(crate) fn set(&self, destination: String, policy: PublishPolicy) {
        if let Ok(mut routes) = self.0.write() {
            routes.insert(destination, policy);
        }
    }

    /// Sets `destination`'s policy unless one is set.
    pub(crate) fn learn(&self, destination: &str, policy: PublishPolicy) {
        if let Ok(mut routes) = self.0.write() {
            routes.entry(destination.to_owned()).or_insert(policy);
        }
    }

    /// `destination`'s policy, if one is set.
    pub(crate) fn get(&self, destination: &str) -> Option<PublishPolicy> {
        self.0.read().ok()?.get(destination).copied()
    }

    /// The partition of `n` the next message without a partition key goes to.
    pub(crate) fn round_robin(&self) -> &AtomicUsize {
        &self.1
    }

    /// Checks every route's policy; the error names the destination and what to fix.
    pub(crate) fn check(&self) -> ruststream_core::Result<()> {
        let routes = self.0.read().map_err(|_| {
            ruststream_core::Error::broker(
                ruststream_core::ErrorKind::Other,
                "routes lock poisoned",
            )
        })?;
        Ok(routes.iter().try_for_each(|(k, p)| p.check(k))?)
    }

    /// Whether any route asks for durable publishes.
    pub(crate) fn any_durable(&self) -> bool {
        self.0
            .read()
            .is_ok_and(|r| r.values().any(|p| p.durable().is_some()))
    }

    /// A copy, for a reconfigured broker.
    pub(crate) fn copy(&self) -> Self {
        Self(
            RwLock::new(self.0.read().map(|r| r.clone()).unwrap_or_default()),
            AtomicUsize::new(0),
        )
    }
}
