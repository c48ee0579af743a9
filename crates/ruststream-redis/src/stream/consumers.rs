//! Forgetting the consumers of gone instances: each instance reads a group under a name of its
//! own, so without this every restart would leave one more name in `XINFO CONSUMERS`. The
//! recovery sweep, when it finds nothing stale, calls `forget_consumers.lua`
//! ([`ForgetConsumers`]: `XINFO CONSUMERS`, then `XGROUP DELCONSUMER` of those with no pending
//! entry idle longer than [`forget_after`], at most [`FORGET_BATCH`] a call).

use std::sync::LazyLock;
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;

use crate::lua::{self, Call};

/// Most consumers one call removes.
pub(crate) const FORGET_BATCH: usize = 16;

static FORGET: LazyLock<Script> =
    LazyLock::new(|| lua::script(include_str!("forget_consumers.lua")));

/// How long a consumer with no pending entry may be idle before it is forgotten: twice the
/// longer of `min_idle` and the blocking read's wait, so a live consumer (which reads again at
/// least every `block`) is not removed while it waits.
pub(crate) fn forget_after(min_idle: Duration, block: Duration) -> Duration {
    min_idle.max(block) * 2
}

/// One call of `forget_consumers.lua`: removes idle consumers of `group` that hold nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct ForgetConsumers<'a> {
    /// The stream.
    pub stream: &'a str,
    /// The group.
    pub group: &'a str,
    /// The calling consumer, never removed.
    pub consumer: &'a str,
    /// The caller's readers: `consumer-2` … `consumer-<readers>` are its too, never removed.
    pub readers: usize,
    /// How long one must have been idle.
    pub idle: Duration,
    /// Most to remove.
    pub most: usize,
}

impl Call for ForgetConsumers<'_> {
    /// How many were removed.
    type Reply = u64;

    fn script(&self) -> &'static Script {
        &FORGET
    }

    /// KEYS and ARGV: see `forget_consumers.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        (
            vec![self.stream.to_owned()],
            vec![
                self.group.into(),
                self.consumer.into(),
                Value::from(self.idle.as_millis().to_string()),
                lua::int(self.most),
                lua::int(self.readers),
            ],
        )
    }

    fn parse(&self, reply: Value) -> u64 {
        lua::reply_u64(&reply)
    }
}
