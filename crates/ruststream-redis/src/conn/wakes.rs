//! The Pub/Sub fan-out of wake-up and signal channels: one subscriber connection per broker,
//! each message waking the notifier of its channel's readers, or handed to its channel's
//! listeners (a cancel's signal). Sends nothing itself (the `SUBSCRIBE`s are
//! [`Connections::notifier`](super::Connections::notifier)'s and
//! [`Connections::signals`](super::Connections::signals)').

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

/// Messages a signal listener may fall behind by before the oldest are lost.
pub(crate) const SIGNAL_BUFFER: usize = 1024;

/// Hands each message on `channel` to its listeners, until the connection is gone.
pub(super) async fn forward_signals(
    mut messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
    channel: String,
    to: tokio::sync::broadcast::Sender<bytes::Bytes>,
) {
    loop {
        match messages.recv().await {
            Ok(m) if *m.channel == *channel => {
                if let Some(b) = crate::reply::value_bytes(m.value) {
                    // None listening now: the signal is for no handler of this process.
                    let _ = to.send(b);
                }
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(
                    channel,
                    lost = n,
                    "signals lost: the subscriber fell behind"
                );
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
        }
    }
}

/// On the in-memory server: hands each message of `messages` to its listeners.
pub(super) async fn forward_memory_signals(
    mut messages: tokio::sync::broadcast::Receiver<bytes::Bytes>,
    to: tokio::sync::broadcast::Sender<bytes::Bytes>,
) {
    loop {
        match messages.recv().await {
            Ok(b) => {
                let _ = to.send(b);
            }
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
        }
    }
}
