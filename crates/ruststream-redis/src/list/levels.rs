//! Priority levels of a list queue ([`RedisList::priorities`](super::RedisList::priorities)).
//!
//! Level 0 is the queue's key `K` itself, so raw `LPUSH K` producers and publishes without a
//! priority land on the lowest level; level `i > 0` is `K.p<i>` in `K`'s slot. A publish with
//! `.priority(i)` goes onto level `i`, its frame carrying the level in the header `rs.priority`.
//! Readers take from the highest non-empty level first, in one script run (`claim.lua`, for
//! simple and reliable lists), so many readers in many processes agree without any state of their own: the
//! priority is strict, and lower levels wait while a higher one has entries. Every script that
//! puts an entry back (the recovery sweep, a retry, a due delayed entry) puts it onto the level
//! its header names (`back.lua`, the one way back to a queue).
//!
//! Waiting: a reader blocks on level 0 (`BLMOVE K K`, which takes nothing), and a level above 0 announces its first entry with a `PUBLISH` on its own key's name
//! (the publisher, after an `LPUSH` that found it empty, and the scripts likewise), which each
//! reader is subscribed to. This module sends `SUBSCRIBE` (through
//! [`Connections::notifier`]) and the publisher's `PUBLISH`.

use std::sync::Arc;

use fred::prelude::*;
use futures::future::select_all;
use ruststream_core::{ConfigError, OutMessage, Result};
use tokio::sync::Notify;

use crate::conn::Connections;
use crate::keys::KeySpace;
use crate::policy::{MAX_PRIORITIES, PublishPolicy};

/// The frame header that carries a message's level.
pub(crate) const HEADER: &str = "rs.priority";

/// Checks the number of levels `n` of the list `key`.
pub(super) fn check(key: &str, n: Option<u8>) -> Result<()> {
    match n {
        Some(n) if !(2..=MAX_PRIORITIES).contains(&n) => Err(ConfigError::new(
            "priorities",
            format!(
                "priorities({n}) must be between 2 and {MAX_PRIORITIES} levels (level 0 is the lowest, n-1 the highest)"
            ),
            "give 2 or more levels; for one level leave priorities out",
        )
        .on(key)
        .into()),
        _ => Ok(()),
    }
}

/// The full keys of levels 1 … n-1 of the full list key `queue` (none without levels).
pub(super) fn keys(space: &KeySpace, queue: &str, n: Option<u8>) -> Vec<String> {
    (1..n.unwrap_or(0)).map(|i| space.level(queue, i)).collect()
}

/// The key and policy of message `m` on the full key `key` with the destination's `policy`:
/// with a priority above 0, its level's key, and the level in its `rs.priority` header. A
/// delayed message waits in level 0's delayed set; the mover puts it onto its level when due.
///
/// # Errors
/// A priority on a destination without priority levels, or above its highest level.
pub(crate) fn place(
    space: &KeySpace,
    key: String,
    policy: PublishPolicy,
    m: &mut OutMessage,
) -> Result<(String, PublishPolicy)> {
    let level = m.priority;
    if level == 0 {
        return Ok((key, policy));
    }
    let dest = &m.destination;
    let PublishPolicy::List(mut list) = policy else {
        return Err(ConfigError::new(
            ".priority(..)",
            format!(
                "priority {level} needs a list with priority levels, and `{dest}` is a {}",
                policy.transport()
            ),
            "publish it without `.priority(..)`",
        )
        .on(dest)
        .into());
    };
    let Some(n) = list.layout.priorities else {
        return Err(ConfigError::new(
            ".priority(..)",
            format!("priority {level} needs a list with priority levels"),
            format!(
                "read it with `RedisList::new(\"{dest}\").priorities(n)`, or in a producer-only process `RedisBroker::route(\"{dest}\", list::Publish::new().priorities(n))`"
            ),
        )
        .on(dest)
        .into());
    };
    if level >= n {
        return Err(ConfigError::new(
            ".priority(..)",
            format!(
                "priority {level} is above its highest level {} (priorities({n}) has levels 0 … {})",
                n - 1,
                n - 1
            ),
            format!("give a priority from 0 to {}", n - 1),
        )
        .on(dest)
        .into());
    }
    m.headers.insert(HEADER.to_owned(), level.to_string());
    if m.due.is_some() {
        return Ok((key, policy));
    }
    list.level = level;
    Ok((space.level(&key, level), PublishPolicy::List(list)))
}

/// What wakes a reader blocked on level 0 when a level above it gets an entry: one notifier
/// per level, each subscribed to the `PUBLISH`es on that level's name.
#[derive(Default)]
pub(super) struct Wakes(Vec<Arc<Notify>>);

impl Wakes {
    /// Subscribes to the wake-ups of `levels` (full keys of levels 1 … n-1).
    pub(super) async fn open(conns: &Connections, levels: &[String]) -> Result<Self> {
        let mut wakes = Vec::with_capacity(levels.len());
        for level in levels {
            wakes.push(conns.notifier(level).await?);
        }
        Ok(Self(wakes))
    }

    /// Resolves when a level above 0 got its first entry; never without levels.
    pub(super) async fn any(&self) {
        if self.0.is_empty() {
            return std::future::pending().await;
        }
        select_all(self.0.iter().map(|n| Box::pin(n.notified()))).await;
    }
}

/// After an `LPUSH` of `pushed` values onto the level key `key` left it `len` long: when the
/// level was empty, `PUBLISH` on its name so readers blocked on level 0 look again.
pub(super) async fn announce(client: &Client, key: &str, pushed: usize, len: i64) -> Result<()> {
    if usize::try_from(len).is_ok_and(|len| len == pushed) {
        let _: i64 = client.publish(key, "").await.map_err(crate::error::core)?;
    }
    Ok(())
}
