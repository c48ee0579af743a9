//! Publishing to a list: `LPUSH key v1 v2 ..` (one command for a batch), or with a ttl
//! `push_ttl.lua` (`LPUSH` then `PEXPIRE`, atomically). A push onto a priority level above 0
//! that finds it empty then `PUBLISH`es on the level's name (see `levels.rs`).

use std::sync::LazyLock;
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::Result;

use crate::error::core;
use crate::lua::{self, Call};
use crate::policy::ListPublish;

static PUSH_TTL: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("push_ttl.lua")));

/// One call of `push_ttl.lua`: pushes values onto a list and sets its ttl, atomically.
#[derive(Debug, Clone, PartialEq)]
pub struct PushTtl<'a> {
    /// The list (full name).
    pub list: &'a str,
    /// The list's ttl (whole milliseconds, at least one).
    pub ttl: Duration,
    /// The values, pushed in order onto the list's left.
    pub values: &'a [Value],
}

impl Call for PushTtl<'_> {
    /// The list's length after the push.
    type Reply = i64;

    fn script(&self) -> &'static Script {
        &PUSH_TTL
    }

    /// KEYS and ARGV: see `push_ttl.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut args = Vec::with_capacity(self.values.len() + 1);
        args.push(Value::Integer(ttl_ms(self.ttl)));
        args.extend(self.values.iter().cloned());
        (vec![self.list.to_owned()], args)
    }

    fn parse(&self, reply: Value) -> i64 {
        i64::try_from(lua::reply_u64(&reply)).unwrap_or(i64::MAX)
    }
}

/// A list's ttl as the scripts take it: whole milliseconds, at least one.
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// Pushes `frames` onto the full key `key` (a priority level's, when `policy.level` is above
/// 0) as `policy` says.
pub(crate) async fn push(
    client: &Client,
    key: &str,
    policy: ListPublish,
    frames: Vec<Value>,
) -> Result<()> {
    let pushed = frames.len();
    let len: i64 = match policy.ttl {
        Some(ttl) => {
            let push = PushTtl {
                list: key,
                ttl,
                values: &frames,
            };
            push.call(client).await?
        }
        None => client.lpush(key, frames).await.map_err(core)?,
    };
    if policy.level > 0 {
        super::levels::announce(client, key, pushed, len).await?;
    }
    Ok(())
}
