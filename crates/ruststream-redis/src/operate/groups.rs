//! A grouped list's groups for the operator (`crate::list::groups`): `inspect`'s listing of the
//! largest groups ([`GroupsTop`], `groups.lua`: a read-only `LRANGE` of the ring's first
//! [`GROUPS_READ`] groups, `LLEN` of each, `HLEN`/`HEXISTS` of the paused groups), and
//! pausing and resuming one group (`HSET`/`HDEL` of `K.groups.paused`, with a `PUBLISH`).

use std::sync::LazyLock;

use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::{ConfigError, Result};
use serde::Serialize;

use super::Operator;
use crate::keys::SourceKeys;
use crate::lua::{self, Call};

/// Most groups `inspect` reads from a ring (non-empty groups; this bounds the reply and the
/// script's work).
pub const GROUPS_READ: usize = 10_000;

/// How many of the largest groups `inspect` lists.
pub const GROUPS_SHOWN: usize = 10;

static GROUPS_TOP: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("groups.lua")));

/// One group as `inspect` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct GroupLen {
    /// Its name ('' for messages published without a group).
    pub name: String,
    /// Entries waiting in its sub-queue.
    pub waiting: u64,
    /// Whether an operator paused it.
    pub paused: bool,
}

/// A grouped list's groups, as `inspect` reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Groups {
    /// Entries in the inbox (the queue's key), not sorted onto their groups yet.
    pub inbox: u64,
    /// Non-empty groups read (at most [`GROUPS_READ`]).
    pub groups: u64,
    /// Entries waiting in the groups read.
    pub waiting: u64,
    /// Groups an operator paused.
    pub paused: u64,
    /// The largest groups read, largest first (at most [`GROUPS_SHOWN`]).
    pub largest: Vec<GroupLen>,
}

/// One call of `groups.lua`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GroupsTop<'a> {
    /// The queue (full name).
    pub queue: &'a str,
    /// Its ring (full name).
    pub ring: &'a str,
    /// Most groups to read.
    pub most: usize,
    /// How many of the largest to return.
    pub top: usize,
}

impl Call for GroupsTop<'_> {
    type Reply = Groups;

    fn script(&self) -> &'static Script {
        &GROUPS_TOP
    }

    /// KEYS and ARGV: see `groups.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let keys = vec![
            self.queue.to_owned(),
            self.ring.to_owned(),
            crate::list::groups::paused(self.ring),
        ];
        (keys, vec![lua::int(self.most), lua::int(self.top)])
    }

    fn parse(&self, reply: Value) -> Groups {
        let Value::Array(items) = reply else {
            return Groups::default();
        };
        let n = |i: usize| items.get(i).map_or(0, lua::reply_u64);
        let largest = items
            .get(4..)
            .unwrap_or_default()
            .chunks_exact(3)
            .map(|g| GroupLen {
                name: g[0]
                    .as_bytes()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default(),
                waiting: lua::reply_u64(&g[1]),
                paused: lua::reply_u64(&g[2]) == 1,
            })
            .collect();
        Groups {
            inbox: n(0),
            groups: n(1),
            waiting: n(2),
            paused: n(3),
            largest,
        }
    }
}

impl Operator {
    /// Pauses the group `group` of the grouped list `name` (every partition's, when it has
    /// partitions): its readers pass it over in their round robin and serve the other groups,
    /// until [`resume_group`](Self::resume_group); handlers already running finish.
    ///
    /// # Errors
    /// `name` is not a list with fair groups, or the server's.
    pub async fn pause_group(&self, name: &str, group: &str) -> Result<()> {
        self.group_pause(name, group, true).await
    }

    /// Lets the readers of the grouped list `name` serve the group `group` again.
    ///
    /// # Errors
    /// `name` is not a list with fair groups, or the server's.
    pub async fn resume_group(&self, name: &str, group: &str) -> Result<()> {
        self.group_pause(name, group, false).await
    }

    async fn group_pause(&self, name: &str, group: &str, paused: bool) -> Result<()> {
        let client = self.conns.pool()?.next().clone();
        for ring in self.rings(name)? {
            crate::list::groups::pause_group(&client, &ring, group, paused).await?;
        }
        Ok(())
    }

    /// The rings of the grouped list `name` (one a partition).
    fn rings(&self, name: &str) -> Result<Vec<String>> {
        let parts = self.partitions_of(name);
        let queues: Vec<&SourceKeys> = if parts.is_empty() {
            vec![self.queue(name)?]
        } else {
            parts
        };
        queues
            .iter()
            .map(|q| {
                q.groups.clone().ok_or_else(|| {
                    ConfigError::new(
                        "pause group",
                        "it has no fair groups (`RedisList::new(k).groups()`)",
                        "pause the whole subscription instead",
                    )
                    .on(name)
                    .into()
                })
            })
            .collect()
    }
}
