//! Startup checks of a subscription's configuration: each error names the key and says what to set.

use ruststream_core::{Error, Result};

use crate::list::{Mode, derived};
use crate::pubsub::{MAX_BUFFER, RedisChannel};
use crate::{RedisList, RedisSource};

/// Checks one source.
pub(crate) fn source(s: &RedisSource) -> Result<()> {
    match s {
        RedisSource::List(l) => {
            let key = &l.key;
            if key.is_empty() {
                return Err(Error::config("a RedisList has an empty key: name the list"));
            }
            if l.opts.concurrency == 0 {
                return Err(Error::config(format!(
                    "list `{key}`: concurrency must be at least 1"
                )));
            }
            if l.opts.max_attempts == 0 {
                return Err(Error::config(format!(
                    "list `{key}`: max_attempts must be at least 1"
                )));
            }
            if l.block.is_zero() {
                return Err(Error::config(format!(
                    "list `{key}`: block must be longer than zero (it would block forever)"
                )));
            }
            if l.mode == Mode::Simple && (l.processing.is_some() || l.recovery_zset.is_some()) {
                return Err(Error::config(format!(
                    "list `{key}`: processing and recovery_zset need a reliable list; add `.reliable()`"
                )));
            }
            recovery(l)?;
            if l.mode == Mode::Reliable && l.processing_key() == *key {
                return Err(Error::config(format!(
                    "list `{key}`: the processing list must differ from the queue"
                )));
            }
            Ok(())
        }
        RedisSource::Stream(st) => {
            let key = &st.key;
            if st.group.as_deref().is_none_or(str::is_empty) {
                return Err(Error::config(format!(
                    "stream `{key}` has no consumer group: add `.group(\"name\")`"
                )));
            }
            if st.opts.concurrency == 0 || st.opts.max_attempts == 0 {
                return Err(Error::config(format!(
                    "stream `{key}`: concurrency and max_attempts must be at least 1"
                )));
            }
            if st.block.is_zero() {
                return Err(Error::config(format!(
                    "stream `{key}`: block must be longer than zero"
                )));
            }
            Ok(())
        }
        RedisSource::Channel(c) => channel(c),
    }
}

/// Checks a Pub/Sub subscription.
fn channel(c: &RedisChannel) -> Result<()> {
    let what = if c.pattern { "pattern" } else { "channel" };
    let name = &c.name;
    if name.is_empty() {
        return Err(Error::config(format!(
            "a RedisChannel has an empty {what}: name it"
        )));
    }
    if c.opts.concurrency == 0 {
        return Err(Error::config(format!(
            "{what} `{name}`: concurrency must be at least 1"
        )));
    }
    if c.block.is_zero() {
        return Err(Error::config(format!(
            "{what} `{name}`: block must be longer than zero"
        )));
    }
    if c.buffer == 0 || c.buffer > MAX_BUFFER {
        return Err(Error::config(format!(
            "{what} `{name}`: buffer must be between 1 and {MAX_BUFFER} messages (it is {})",
            c.buffer
        )));
    }
    Ok(())
}

/// The recovery set needs `min_idle`, and its ttl must outlive `min_idle`.
fn recovery(l: &RedisList) -> Result<()> {
    let key = &l.key;
    match (&l.recovery_zset, l.min_idle, l.recovery_ttl) {
        (Some(z), None, _) => Err(Error::config(format!(
            "list `{key}`: recovery_zset `{z}` needs min_idle: add `.min_idle(Duration::from_secs(60))`, longer than the slowest handler ever takes"
        ))),
        (Some(z), Some(idle), Some(ttl)) if ttl <= idle => Err(Error::config(format!(
            "list `{key}`: recovery_ttl ({ttl:?}) of `{z}` must be longer than min_idle ({idle:?}), or the set expires under live claims"
        ))),
        (Some(_), Some(idle), _) if idle.is_zero() => Err(Error::config(format!(
            "list `{key}`: min_idle must be longer than zero, or every claim is recovered at once"
        ))),
        (None, Some(_), _) | (None, _, Some(_)) => Err(Error::config(format!(
            "list `{key}`: min_idle and recovery_ttl need a recovery set: add `.recovery_zset(\"{key}.claims\")`"
        ))),
        _ => Ok(()),
    }
}

/// The keys a source uses together in one script on a cluster, prefixed: they must share a slot.
/// Default derived names (delayed set, dead letters) follow [`derived`]; the processing list and
/// named keys do not, so an untagged reliable queue is refused with the tag to use.
pub(crate) fn keys_used_together(s: &RedisSource, prefix: &str) -> Vec<String> {
    let p = |k: &str| format!("{prefix}{k}");
    let (key, dead) = match s {
        RedisSource::List(l) => (p(&l.key), &l.dead_letter),
        RedisSource::Stream(st) => (p(&st.key), &st.dead_letter),
        // Its one key, the dead-letter list, is used alone (`LPUSH`).
        RedisSource::Channel(_) => return Vec::new(),
    };
    let mut keys = vec![
        key.clone(),
        derived(&key, ".delayed", true),
        derived(&key, ".delayed.payloads", true),
    ];
    match dead {
        None => keys.push(derived(&key, ".dead", true)),
        Some(named) => keys.extend(named.as_deref().map(p)),
    }
    if let RedisSource::List(l) = s
        && l.mode == Mode::Reliable
    {
        keys.insert(1, p(&l.processing_key()));
        keys.extend(l.recovery_zset.as_deref().map(p));
    }
    keys
}

/// Checks that keys used together hash to one slot; the error names the keys, their slots and
/// the hash tag to use.
pub(crate) fn same_slot(source_key: &str, keys: &[String]) -> Result<()> {
    let Some(first) = keys.first() else {
        return Ok(());
    };
    let slot = fred::util::redis_keyslot(first.as_bytes());
    for k in &keys[1..] {
        let other = fred::util::redis_keyslot(k.as_bytes());
        if other != slot {
            let tag = suggested_tag(source_key);
            return Err(Error::config(format!(
                "subscription `{source_key}`: keys `{first}` (slot {slot}) and `{k}` (slot {other}) are used together in one script but fall in different hash slots of the cluster; put the queue in a hash tag: `{tag}` (derived names such as `{tag}.processing` inherit it), and name any custom processing, dead-letter or recovery key with the same tag"
            )));
        }
    }
    Ok(())
}

/// The key with its hash-tag part in braces: `jobs` -> `{jobs}`, `{jobs}` stays.
fn suggested_tag(key: &str) -> String {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return key.to_owned();
    }
    format!("{{{key}}}")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::RedisList;

    fn err(l: RedisList) -> String {
        source(&RedisSource::List(l)).unwrap_err().to_string()
    }

    #[test]
    fn recovery_needs_min_idle_and_a_longer_ttl() {
        let l = RedisList::new("{t}").reliable().recovery_zset("{t}.claims");
        assert!(err(l.clone()).contains("needs min_idle"));
        let l = l.min_idle(Duration::from_secs(60));
        assert!(source(&RedisSource::List(l.clone())).is_ok());
        assert!(
            err(l.recovery_ttl(Duration::from_secs(60))).contains("must be longer than min_idle")
        );
        assert!(
            err(RedisList::new("q")
                .reliable()
                .min_idle(Duration::from_secs(1)))
            .contains("recovery_zset")
        );
    }

    #[test]
    fn untagged_simple_lists_and_streams_keep_derived_keys_in_their_slot() {
        let simple = RedisSource::List(RedisList::new("cache.warmups"));
        let keys = keys_used_together(&simple, "app:");
        assert!(
            keys.contains(&"{app:cache.warmups}.delayed".to_owned()),
            "{keys:?}"
        );
        assert!(
            keys.contains(&"{app:cache.warmups}.dead".to_owned()),
            "{keys:?}"
        );
        assert!(same_slot("cache.warmups", &keys).is_ok());
        let stream = RedisSource::Stream(crate::RedisStream::new("uploads").group("g"));
        assert!(same_slot("uploads", &keys_used_together(&stream, "")).is_ok());
        let named = RedisSource::Stream(
            crate::RedisStream::new("uploads")
                .group("g")
                .dead_letter("failed"),
        );
        assert!(same_slot("uploads", &keys_used_together(&named, "")).is_err());
        assert_eq!(derived("{t}", ".dead", true), "{t}.dead");
        assert_eq!(derived("q", ".dead", false), "q.dead");
    }

    #[test]
    fn channels_need_a_name_and_a_usable_buffer() {
        let check = |c: RedisChannel| source(&RedisSource::Channel(c));
        assert!(check(RedisChannel::new("events")).is_ok());
        assert!(check(RedisChannel::pattern("events.*")).is_ok());
        let e = check(RedisChannel::new("")).unwrap_err().to_string();
        assert!(e.contains("empty channel"), "{e}");
        let e = check(RedisChannel::new("e").buffer(0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("buffer must be between 1 and"), "{e}");
        assert!(check(RedisChannel::new("e").buffer(MAX_BUFFER + 1)).is_err());
        assert!(check(RedisChannel::pattern("e.*").concurrency(0)).is_err());
        assert!(check(RedisChannel::new("e").block(Duration::ZERO)).is_err());
        let untagged = RedisSource::Channel(RedisChannel::new("events").dead_letter("other"));
        assert!(same_slot("events", &keys_used_together(&untagged, "")).is_ok());
    }

    #[test]
    fn slot_rule_names_keys_slots_and_tag() {
        let untagged = RedisSource::List(RedisList::new("jobs").reliable());
        let e = same_slot("jobs", &keys_used_together(&untagged, ""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`jobs` (slot ") && e.contains("`jobs.processing` (slot "),
            "{e}"
        );
        assert!(e.contains("hash tag: `{jobs}`"), "{e}");
        let tagged = RedisSource::List(
            RedisList::new("{thumbnails}")
                .reliable()
                .recovery_zset("{thumbnails}.claims")
                .min_idle(Duration::from_secs(1)),
        );
        assert!(same_slot("{thumbnails}", &keys_used_together(&tagged, "app:")).is_ok());
        let stray = RedisSource::List(
            RedisList::new("{t}")
                .reliable()
                .recovery_zset("claims")
                .min_idle(Duration::from_secs(1)),
        );
        assert!(same_slot("{t}", &keys_used_together(&stray, "")).is_err());
    }
}
