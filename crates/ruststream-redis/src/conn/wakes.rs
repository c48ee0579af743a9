//! The Pub/Sub fan-out of wake-up channels: one subscriber connection per broker, each message
//! waking the notifier of its channel's readers. Sends nothing itself (the `SUBSCRIBE`s are
//! [`Connections::notifier`](super::Connections::notifier)'s).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Wakes the notifier of each wake-up channel a message arrives on, until the connection or the
/// broker is gone.
pub(super) async fn forward_wakes(
    mut messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
    wakes: std::sync::Weak<Mutex<HashMap<String, Arc<Notify>>>>,
) {
    loop {
        let message = match messages.recv().await {
            Ok(m) => m,
            // A missed wake-up only delays a reader until its next poll.
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
        };
        let Some(wakes) = wakes.upgrade() else { break };
        let Ok(wakes) = wakes.lock() else { break };
        if let Some(n) = wakes.get(&*message.channel) {
            n.notify_one();
        }
    }
}
