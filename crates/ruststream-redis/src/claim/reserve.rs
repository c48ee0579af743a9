//! A whole-queue rate limit over a partitioned queue: the limiter lives in the logical queue's
//! slot and the partitions in their own, so no one script sees both. A reader reserves passes
//! from the limiter ([`Reserve`], `reserve.lua`), claims at most that many from its partitions
//! (their claims have no rate gate), and gives back what it did not take ([`Refund`],
//! `refund.lua`). See `docs/decisions.md`, "Rate limits: GCRA on the server's clock".
//!
//! Commands: `EVALSHA` of `reserve.lua` and `refund.lua` (`SCRIPT LOAD` on `NOSCRIPT`), on the
//! limiter's slot.

use std::sync::LazyLock;
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;

use crate::claim::limit::Limiter;
use crate::lua::{self, Call};

static RESERVE: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("reserve.lua")));
static REFUND: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("refund.lua")));

/// One call of `reserve.lua`: up to `want` passes of `limiter`.
#[derive(Debug, Clone)]
pub(crate) struct Reserve<'a> {
    /// The whole-queue limit.
    pub(crate) limiter: &'a Limiter,
    /// Most passes to take.
    pub(crate) want: usize,
}

impl Call for Reserve<'_> {
    /// The passes taken, and how long until the next may pass when none could.
    type Reply = (usize, Duration);

    fn script(&self) -> &'static Script {
        &RESERVE
    }

    /// KEYS and ARGV: see `reserve.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut args = vec![lua::int(self.want)];
        args.extend(self.limiter.args.iter().cloned());
        (vec![self.limiter.key.clone()], args)
    }

    fn parse(&self, reply: Value) -> (usize, Duration) {
        let int = |i: usize| match &reply {
            Value::Array(items) => items.get(i).map_or(0, lua::reply_u64),
            _ => 0,
        };
        (
            usize::try_from(int(0)).unwrap_or(0),
            Duration::from_millis(int(1)),
        )
    }
}

/// One call of `refund.lua`: gives `unused` passes back to `limiter`.
#[derive(Debug, Clone)]
pub(crate) struct Refund<'a> {
    /// The whole-queue limit.
    pub(crate) limiter: &'a Limiter,
    /// Passes reserved and not used.
    pub(crate) unused: usize,
}

impl Call for Refund<'_> {
    type Reply = ();

    fn script(&self) -> &'static Script {
        &REFUND
    }

    /// KEYS and ARGV: see `refund.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut args = vec![lua::int(self.unused)];
        args.extend(self.limiter.args.iter().cloned());
        (vec![self.limiter.key.clone()], args)
    }

    fn parse(&self, _: Value) {}
}
