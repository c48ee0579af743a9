//! Publishing to a list: `LPUSH key v1 v2 ..` (one command for a batch), or with a ttl
//! `push_ttl.lua` (`LPUSH` then `PEXPIRE`, atomically). A push onto a priority level above 0
//! that finds it empty then `PUBLISH`es on the level's name (see `levels.rs`).

use std::sync::LazyLock;
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::Result;

use crate::error::core;
use crate::lua;
use crate::policy::ListPublish;

static PUSH_TTL: LazyLock<Script> =
    LazyLock::new(|| lua::script(include_str!("push_ttl.lua"), &[lua::GUARD]));

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
            let mut args = Vec::with_capacity(frames.len() + 1);
            args.push(Value::Integer(ttl_ms(ttl)));
            args.extend(frames);
            PUSH_TTL
                .evalsha_with_reload(client, vec![key.to_owned()], args)
                .await
                .map_err(core)?
        }
        None => client.lpush(key, frames).await.map_err(core)?,
    };
    if policy.level > 0 {
        super::levels::announce(client, key, pushed, len).await?;
    }
    Ok(())
}
