//! Unique publishes (`.id(x).unique_for(window)`): a message whose id was published to the same
//! destination within the window is not enqueued, and the publish says so.
//!
//! Each such message marks its id with a key derived from the destination,
//! `K.unique:<id>` (in `K`'s slot), set with `SET .. NX PX <window>` by the script that enqueues
//! it, so the check and the push are one atomic step across every publishing process. The key
//! holds the publish's token: a publish sent again after its reply was lost finds its own token
//! and counts what its first run enqueued, rather than enqueueing twice or calling its own
//! message a duplicate.
//!
//! Sends `publish.lua` (`SET NX PX`, `GET`, `LPUSH` + `PEXPIRE` (+ the `PUBLISH` that wakes the
//! readers of a priority level) or `XADD` + `XTRIM`) for messages
//! due now; delayed ones go through `delayed/schedule.lua`, which takes the same keys.

use std::sync::LazyLock;
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::Result;

use crate::error::core;
use crate::keys::KeySpace;
use crate::lua;

/// The Lua of the unique check (`unique_claim`), prepended to the scripts that publish.
pub(crate) const LUA: &str = include_str!("claim.lua");

static PUBLISH: LazyLock<Script> =
    LazyLock::new(|| lua::script(include_str!("publish.lua"), &[lua::GUARD, lua::BOUND, LUA]));

/// The key that marks `id` as published to the full key `full` within a window.
pub(crate) fn key(keys: &KeySpace, full: &str, id: &str) -> String {
    keys.derived(full, &format!(".unique:{id}"))
}

/// A window as the scripts take it: whole milliseconds, at least one.
pub(crate) fn window_ms(window: Duration) -> i64 {
    i64::try_from(window.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// Where unique messages due now go.
pub(crate) enum Target {
    /// A list, with its ttl in ms (0: none), and whether it is a priority level above 0, whose
    /// readers are woken when it gets an entry while empty.
    List { ttl_ms: i64, level: bool },
    /// A stream, with its bound as `bound.lua` takes it (`""`: none).
    Stream { bound: String },
}

/// Messages due now with their unique keys and windows, for one destination.
#[derive(Default)]
pub(crate) struct Batch {
    keys: Vec<String>,
    /// Per message: its window, then the list frame, or the stream's field count and fields.
    args: Vec<Value>,
}

impl Batch {
    /// Adds a list frame.
    pub(crate) fn frame(&mut self, key: String, window: Duration, frame: Value) {
        self.keys.push(key);
        self.args.extend([Value::Integer(window_ms(window)), frame]);
    }

    /// Adds a stream entry's fields.
    pub(crate) fn entry(&mut self, key: String, window: Duration, fields: Vec<Value>) {
        self.keys.push(key);
        self.args.push(Value::Integer(window_ms(window)));
        self.args
            .push(Value::Integer(i64::try_from(fields.len()).unwrap_or(0)));
        self.args.extend(fields);
    }

    /// Whether no message was added.
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Enqueues the batch onto the full key `dest` with `publish.lua`; returns how many were
    /// enqueued.
    pub(crate) async fn send(
        self,
        client: &Client,
        dest: &str,
        token: &str,
        target: Target,
    ) -> Result<usize> {
        let mut keys = Vec::with_capacity(self.keys.len() + 1);
        keys.push(dest.to_owned());
        keys.extend(self.keys);
        let mut args = Vec::with_capacity(self.args.len() + 4);
        args.push(Value::from(token));
        match target {
            Target::List { ttl_ms, level } => args.extend([
                Value::from_static_str("list"),
                Value::Integer(ttl_ms),
                Value::Integer(i64::from(level)),
            ]),
            Target::Stream { bound } => args.extend([
                Value::from_static_str("stream"),
                Value::from(bound),
                Value::Integer(0),
            ]),
        }
        args.extend(self.args);
        let n: i64 = PUBLISH
            .evalsha_with_reload(client, keys, args)
            .await
            .map_err(core)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }
}
