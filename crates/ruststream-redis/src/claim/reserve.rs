//! A whole-queue rate limit over a partitioned queue: the limiter lives in the logical queue's
//! slot and the partitions in their own, so no one script sees both. A reader reserves passes
//! from the limiter ([`Reserve`], `reserve.lua`), claims at most that many from its partitions
//! (their claims have no rate gate), and gives back what it did not take ([`Refund`],
//! `refund.lua`). See `docs/decisions.md`, "One claim pipeline (issue 21)".
//!
//! Commands: `EVALSHA` of `reserve.lua` and `refund.lua` (`SCRIPT LOAD` on `NOSCRIPT`), on the
//! limiter's slot.

use std::sync::LazyLock;
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::Result;

use crate::error::core;
use crate::limit::Limiter;
use crate::lua;

fn script(main: &str) -> Script {
    lua::script(
        main,
        &[
            lua::GUARD,
            crate::frame::LUA,
            super::GATES,
            crate::limit::LUA,
        ],
    )
}

static RESERVE: LazyLock<Script> = LazyLock::new(|| script(include_str!("reserve.lua")));
static REFUND: LazyLock<Script> = LazyLock::new(|| script(include_str!("refund.lua")));

/// One call of `reserve.lua`: up to `want` passes of `limiter`.
#[derive(Debug, Clone)]
pub(crate) struct Reserve<'a> {
    /// The whole-queue limit.
    pub(crate) limiter: &'a Limiter,
    /// Most passes to take.
    pub(crate) want: usize,
}

impl Reserve<'_> {
    /// The script's KEYS and ARGV (see `reserve.lua`'s header).
    pub(crate) fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut args = vec![Value::Integer(i64::try_from(self.want).unwrap_or(i64::MAX))];
        args.extend(self.limiter.args.iter().cloned());
        (vec![self.limiter.key.clone()], args)
    }

    /// Reads the reply: the passes taken, and how long until the next may pass when none could.
    pub(crate) fn parse(reply: &Value) -> (usize, Duration) {
        let int = |i: usize| match reply {
            Value::Array(items) => match items.get(i) {
                Some(Value::Integer(n)) => u64::try_from(*n).unwrap_or(0),
                _ => 0,
            },
            _ => 0,
        };
        (
            usize::try_from(int(0)).unwrap_or(0),
            Duration::from_millis(int(1)),
        )
    }

    /// Runs the script on `client`.
    pub(crate) async fn call(&self, client: &Client) -> Result<(usize, Duration)> {
        let (keys, args) = self.build();
        let reply: Value = RESERVE
            .evalsha_with_reload(client, keys, args)
            .await
            .map_err(core)?;
        Ok(Self::parse(&reply))
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

impl Refund<'_> {
    /// The script's KEYS and ARGV (see `refund.lua`'s header).
    pub(crate) fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut args = vec![Value::Integer(
            i64::try_from(self.unused).unwrap_or(i64::MAX),
        )];
        args.extend(self.limiter.args.iter().cloned());
        (vec![self.limiter.key.clone()], args)
    }

    /// Runs the script on `client` (nothing to send when nothing is unused).
    pub(crate) async fn call(&self, client: &Client) -> Result<()> {
        if self.unused == 0 {
            return Ok(());
        }
        let (keys, args) = self.build();
        let _: Value = REFUND
            .evalsha_with_reload(client, keys, args)
            .await
            .map_err(core)?;
        Ok(())
    }
}
