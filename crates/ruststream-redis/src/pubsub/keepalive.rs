//! The keepalive of a Pub/Sub subscription's connection: `PING` every command timeout.
//!
//! A subscriber only listens, so a connection that went silent without closing (a frozen
//! peer, a network that drops everything) would look like a quiet channel for ever. A `PING`
//! (allowed while subscribed) is a command with a reply: when none comes, fred's unresponsive
//! check closes the connection, reconnects and subscribes again (`manage_subscriptions`).
//! Sharded subscriptions need none: their renewal ([`shard::keep`](super::shard)) does this.

use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::prelude::*;
use tokio::task::JoinHandle;

/// Sends `PING` on `client` every `every` until aborted.
pub(super) fn keep(client: SubscriberClient, every: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            // A failed PING needs nothing more: the connection it went on is being replaced.
            let _: Result<(), _> = tokio::time::timeout(every, client.ping(None))
                .await
                .unwrap_or(Ok(()));
        }
    })
}
