//! Sharded Pub/Sub (`SSUBSCRIBE`): the startup checks of a sharded channel (its subscription is
//! kept on the slot's owner by [`session`](super::session)). Sends no command.

use ruststream_core::{Error, Result};

use crate::keys::{DeadLetter, KeySpace};

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
