//! Fair groups of a list queue ([`RedisList::groups`](super::RedisList::groups)): one sub-queue
//! per group (a tenant, a customer), readers taking round robin over the groups with waiting
//! entries, so one group's backlog does not delay another's.
//!
//! Keys, all in the queue `K`'s slot: the ring `K.groups` (a list holding the name of each
//! non-empty group once), each group's sub-queue `K.groups:<group>`, and the operator's paused
//! groups `K.groups.paused` (a hash, group → when paused). The queue `K` itself is the inbox:
//! a raw `LPUSH K`, and every way back to the queue (a retry, the recovery sweep, a due delayed
//! message, a requeued dead letter, a unique publish), lands there, and each claim sorts up to
//! 1,000 of its entries onto their groups first (`groups.lua`). A publish through a grouped
//! route goes straight onto its group's sub-queue (`group_push.lua`). A message's group is its
//! `rs.group` header ([`PublishBuilder::group`](ruststream_core::PublishBuilder::group)), ''
//! without one.
//!
//! Waiting: a reader blocks on `K` (`BLMOVE K K`), and a group that joins the ring announces it
//! with a `PUBLISH` on the ring's name, which readers are subscribed to (as priority levels
//! announce their first entry, `levels.rs`).
//!
//! Commands: `EVALSHA` of `group_push.lua` (the publish) and `HSET`/`HDEL` + `PUBLISH` (an
//! operator's group pause and resume, [`pause_group`]).

use std::sync::LazyLock;
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::{ConfigError, Result};

use crate::claim;
use crate::error::core;
use crate::keys::KeySpace;
use crate::lua::{self, Call};

pub use ruststream_core::GROUP_HEADER as HEADER;

/// The longest group name, in bytes: a group's name is part of its sub-queue's key.
pub const MAX_GROUP_LEN: usize = 256;

/// The name of the groups part in a claim's gates (`GATES.groups`).
const GATE: &str = "groups";

static GROUP_PUSH: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("group_push.lua")));

/// The ring of the full queue key `queue`: the list of its non-empty groups.
pub(crate) fn ring(space: &KeySpace, queue: &str) -> String {
    space.derived(queue, ".groups")
}

/// The hash of the paused groups of the ring `ring`.
pub(crate) fn paused(ring: &str) -> String {
    format!("{ring}.paused")
}

/// The sub-queue of the group `group` of the ring `ring`.
pub fn sub_queue(ring: &str, group: &str) -> String {
    format!("{ring}:{group}")
}

/// The claim's source part of the grouped queue `queue` with its ring `ring` (full names), and
/// with a per-group cap `cap`: its processing list (full name) and the most entries of one group
/// in it.
pub(crate) fn gate(queue: String, ring: String, cap: Option<(String, u32)>) -> claim::Gate {
    let paused = paused(&ring);
    let mut keys = vec![queue, ring, paused];
    let mut args = Vec::new();
    if let Some((processing, n)) = cap {
        keys.push(processing);
        args.push(Value::Integer(i64::from(n)));
    }
    claim::Gate::new(GATE, keys, args)
}

/// Checks a message's group name: at most [`MAX_GROUP_LEN`] bytes.
///
/// # Errors
/// A longer name, naming the destination.
pub(crate) fn check(dest: &str, group: &str) -> Result<()> {
    if group.len() > MAX_GROUP_LEN {
        return Err(ConfigError::new(
            ".group(..)",
            format!(
                "the group name is {} bytes, more than {MAX_GROUP_LEN}",
                group.len()
            ),
            "use a shorter id for the tenant",
        )
        .on(dest)
        .into());
    }
    Ok(())
}

/// One call of `group_push.lua`: frames onto their groups' sub-queues.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupPush<'a> {
    /// The queue (full name), the inbox.
    pub queue: &'a str,
    /// Its ring (full name).
    pub ring: &'a str,
    /// The sub-queues' ttl, if any.
    pub ttl: Option<Duration>,
    /// The frames.
    pub values: &'a [Value],
}

impl Call for GroupPush<'_> {
    /// How many were pushed.
    type Reply = u64;

    fn script(&self) -> &'static Script {
        &GROUP_PUSH
    }

    /// KEYS and ARGV: see `group_push.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut args = Vec::with_capacity(self.values.len() + 1);
        args.push(Value::Integer(self.ttl.map_or(0, super::ttl_ms)));
        args.extend(self.values.iter().cloned());
        (vec![self.queue.to_owned(), self.ring.to_owned()], args)
    }

    fn parse(&self, reply: Value) -> u64 {
        lua::reply_u64(&reply)
    }
}

/// Pauses (`paused`) or resumes the group `group` of the grouped queue whose ring is `ring`
/// (full name): `HSET ring.paused group <ms since epoch>` or `HDEL`, then a `PUBLISH` on the
/// ring so waiting readers look again. The claim passes a paused group over; the others are
/// served.
///
/// # Errors
/// The server's.
pub async fn pause_group(client: &Client, ring: &str, group: &str, paused: bool) -> Result<()> {
    let key = self::paused(ring);
    if paused {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let _: i64 = client
            .hset(&key, (group, now.to_string()))
            .await
            .map_err(core)?;
    } else {
        let _: i64 = client.hdel(&key, group).await.map_err(core)?;
    }
    let _: i64 = client.publish(ring, "").await.map_err(core)?;
    Ok(())
}
