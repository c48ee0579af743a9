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
//! Sends `publish.lua` ([`PublishUnique`]: `SET NX PX`, `GET`, then through `back.lua` `LPUSH` +
//! `PEXPIRE` (+ the `PUBLISH` that wakes the readers of a priority level) or `XADD` + `XTRIM`)
//! for messages
//! due now; delayed ones go through `delayed/schedule.lua`, which takes the same keys.

use std::sync::LazyLock;
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;

use crate::back::Dest;
use crate::keys::KeySpace;
use crate::lua::{self, Call};

static PUBLISH: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("publish.lua")));

/// The key that marks `id` as published to the full key `full` within a window.
pub(crate) fn key(keys: &KeySpace, full: &str, id: &str) -> String {
    keys.derived(full, &format!(".unique:{id}"))
}

/// A window as the scripts take it: whole milliseconds, at least one.
pub(crate) fn window_ms(window: Duration) -> i64 {
    i64::try_from(window.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// Messages due now with their unique keys and windows, for one destination.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Batch {
    keys: Vec<String>,
    /// Per message: its window, then its frame.
    args: Vec<Value>,
}

impl Batch {
    /// Adds a message's frame, its unique key and its window.
    pub fn frame(&mut self, key: String, window: Duration, frame: Value) {
        self.keys.push(key);
        self.args.extend([Value::Integer(window_ms(window)), frame]);
    }

    /// Whether no message was added.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// One call of `publish.lua`: enqueues onto `dest` the messages of `batch` whose id no other
/// publish holds a window for.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishUnique<'a> {
    /// Where they go: a list (its levels up to the messages' own, and its ttl) or a stream.
    pub dest: &'a Dest,
    /// The publish's token: a publish sent again finds its own windows.
    pub token: &'a str,
    /// The messages.
    pub batch: &'a Batch,
}

impl Call for PublishUnique<'_> {
    /// How many were enqueued.
    type Reply = usize;

    fn script(&self) -> &'static Script {
        &PUBLISH
    }

    /// KEYS and ARGV: see `publish.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut keys = Vec::with_capacity(self.batch.keys.len() + 2);
        let mut args = Vec::with_capacity(self.batch.args.len() + 4);
        args.push(Value::from(self.token));
        self.dest.push(&mut keys, &mut args);
        keys.extend(self.batch.keys.iter().cloned());
        args.extend(self.batch.args.iter().cloned());
        (keys, args)
    }

    fn parse(&self, reply: Value) -> usize {
        usize::try_from(lua::reply_u64(&reply)).unwrap_or(0)
    }
}
