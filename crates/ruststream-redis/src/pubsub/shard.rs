//! Sharded Pub/Sub (`SSUBSCRIBE`): the startup checks of a sharded channel, and the task that
//! keeps its subscription on the node owning the channel's slot by sending `SSUBSCRIBE channel`
//! again every [`RESUBSCRIBE_EVERY`] (see the [module docs](super) for why).

use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::prelude::*;
use ruststream_core::{Error, Result};
use tokio::task::JoinHandle;

use crate::keys::{DeadLetter, KeySpace};

/// How often a sharded subscription sends its `SSUBSCRIBE` again: after a failover or a slot
/// migration ends it, messages published within this time may be lost.
pub const RESUBSCRIBE_EVERY: Duration = Duration::from_secs(1);

/// How long one renewed `SSUBSCRIBE` may take before the next attempt.
const RESUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The characters that make a channel name a glob pattern.
const GLOB: [char; 3] = ['*', '?', '['];

/// Checks the sharded channel `name`: not a pattern, and on a cluster a named dead-letter list
/// in the channel's slot (requeueing `SPUBLISH`es from a script on the list's node).
pub(super) fn validate(name: &str, space: &KeySpace, dead: &DeadLetter) -> Result<()> {
    if name.contains(GLOB) {
        return Err(Error::config(format!(
            "sharded channel `{name}` contains a glob character (`*`, `?` or `[`), but Redis has no sharded pattern subscription: subscribe to each channel with RedisChannel::sharded, or use RedisChannel::pattern (not sharded)"
        )));
    }
    let Some(list) = space.dead(name, dead) else {
        return Ok(());
    };
    let channel = space.key(name);
    let (a, b) = (slot(&channel), slot(&list));
    if space.is_cluster() && a != b {
        return Err(Error::config(format!(
            "sharded channel `{name}` (slot {a}) and its dead-letter list `{list}` (slot {b}) fall in different hash slots of the cluster, and a requeue SPUBLISHes from a script on the list's node: drop `.dead_letter(..)` for the default `{{{channel}}}.dead`, or give both names the same hash tag"
        )));
    }
    Ok(())
}

fn slot(key: &str) -> u16 {
    fred::util::redis_keyslot(key.as_bytes())
}

/// Sends `SSUBSCRIBE channel` on `client` every [`RESUBSCRIBE_EVERY`] until aborted. `label` is
/// the channel as the user named it, for the logs.
pub(super) fn keep(client: SubscriberClient, channel: String, label: String) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(RESUBSCRIBE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        let mut failing = false;
        loop {
            every.tick().await;
            let sent =
                tokio::time::timeout(RESUBSCRIBE_TIMEOUT, client.ssubscribe(channel.as_str()))
                    .await;
            match sent {
                Ok(Ok(())) if failing => {
                    failing = false;
                    tracing::info!(subscription = %label, "sharded subscription renewed");
                }
                Ok(Ok(())) => {}
                Ok(Err(e)) if !failing => {
                    failing = true;
                    tracing::warn!(subscription = %label, error = %crate::error::redact(e.details()),
                        "cannot renew the sharded subscription (SSUBSCRIBE): messages are lost until it is; retrying");
                }
                Err(_) if !failing => {
                    failing = true;
                    tracing::warn!(subscription = %label, timeout = ?RESUBSCRIBE_TIMEOUT,
                        "renewing the sharded subscription (SSUBSCRIBE) timed out: messages are lost until it is renewed; retrying");
                }
                Ok(Err(_)) | Err(_) => {}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sharded_channel_is_no_pattern() {
        let space = KeySpace::default();
        for name in ["orders.*", "order?", "orders[12]"] {
            let e = validate(name, &space, &DeadLetter::Default)
                .unwrap_err()
                .to_string();
            assert!(e.contains("no sharded pattern subscription"), "{e}");
        }
        assert!(validate("orders", &space, &DeadLetter::Default).is_ok());
    }

    #[test]
    fn on_a_cluster_a_named_dead_letter_list_shares_the_channel_slot() {
        let cluster = KeySpace::new("app:".into(), true);
        assert!(validate("orders", &cluster, &DeadLetter::Default).is_ok());
        assert!(validate("orders", &cluster, &DeadLetter::Off).is_ok());
        let named = |n: &str| DeadLetter::Named(n.to_owned());
        let e = validate("orders", &cluster, &named("failed"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("different hash slots"), "{e}");
        assert!(e.contains("{app:orders}.dead"), "{e}");
        assert!(validate("{o}.orders", &cluster, &named("{o}.failed")).is_ok());
        let standalone = KeySpace::new("app:".into(), false);
        assert!(validate("orders", &standalone, &named("failed")).is_ok());
    }
}
