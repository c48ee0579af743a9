//! Sharded Pub/Sub (`SSUBSCRIBE`): the startup checks of a sharded channel (its subscription is
//! kept on the slot's owner by [`session`](super::session)). Sends no command.

use ruststream_core::{ConfigError, Result};

use crate::keys::{DeadLetter, KeySpace};

/// The characters that make a channel name a glob pattern.
const GLOB: [char; 3] = ['*', '?', '['];

/// Checks the sharded channel `name`: not a pattern, and on a cluster a named dead-letter list
/// in the channel's slot (requeueing `SPUBLISH`es from a script on the list's node).
pub(super) fn validate(name: &str, space: &KeySpace, dead: &DeadLetter) -> Result<()> {
    if name.contains(GLOB) {
        return Err(ConfigError::new(
            "sharded channel",
            "it contains a glob character (`*`, `?` or `[`), but Redis has no sharded pattern subscription",
            "subscribe to each channel with RedisChannel::sharded, or use RedisChannel::pattern (not sharded)",
        )
        .on(name)
        .into());
    }
    let Some(list) = space.dead(name, dead) else {
        return Ok(());
    };
    let channel = space.key(name);
    let (a, b) = (slot(&channel), slot(&list));
    if space.is_cluster() && a != b {
        return Err(ConfigError::new(
            "dead_letter",
            format!(
                "the sharded channel (slot {a}) and its dead-letter list `{list}` (slot {b}) fall in different hash slots of the cluster, and a requeue SPUBLISHes from a script on the list's node"
            ),
            format!(
                "drop `.dead_letter(..)` for the default `{{{channel}}}.dead`, or give both names the same hash tag"
            ),
        )
        .on(name)
        .into());
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
            let e = validate(name, &space, &DeadLetter::Default).unwrap_err();
            let config = e.config_error().expect("a configuration error");
            assert_eq!(config.option, "sharded channel");
            assert_eq!(config.subject.as_deref(), Some(name));
            assert!(config.problem.contains("no sharded pattern"), "{e}");
        }
        assert!(validate("orders", &space, &DeadLetter::Default).is_ok());
    }

    #[test]
    fn on_a_cluster_a_named_dead_letter_list_shares_the_channel_slot() {
        let cluster = KeySpace::new("app:".into(), true);
        assert!(validate("orders", &cluster, &DeadLetter::Default).is_ok());
        assert!(validate("orders", &cluster, &DeadLetter::Off).is_ok());
        let named = |n: &str| DeadLetter::Named(n.to_owned());
        let e = validate("orders", &cluster, &named("failed")).unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "dead_letter");
        assert_eq!(config.subject.as_deref(), Some("orders"));
        assert!(config.problem.contains("different hash slots"), "{e}");
        assert!(config.fix.contains("{app:orders}.dead"), "{e}");
        assert!(validate("{o}.orders", &cluster, &named("{o}.failed")).is_ok());
        let standalone = KeySpace::new("app:".into(), false);
        assert!(validate("orders", &standalone, &named("failed")).is_ok());
    }
}
