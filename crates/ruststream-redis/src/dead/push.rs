//! The settle of transports that have nothing to acknowledge (a simple list popped its entries
//! already; Pub/Sub stores nothing): only dead letters are written, one `push.lua` call
//! ([`PushDead`]: `LPUSH` of the batch's dead letters, then `LTRIM`/`RPOP` to the list's bound).
//! Without a dead-letter list they are discarded with an error log.

use std::sync::LazyLock;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::{Result, Settlement};

use super::{DeadBound, Trims, discarded, logged};
use crate::lua::{self, Call};
use crate::transport::{Settle, Token};

static PUSH: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("push.lua")));

/// One call of `push.lua`: pushes dead letters onto `dead` and trims it to `bound`.
#[derive(Debug, Clone, PartialEq)]
pub struct PushDead<'a> {
    /// The dead-letter list.
    pub dead: &'a str,
    /// Its bound.
    pub bound: DeadBound,
    /// The dead letters, oldest first.
    pub frames: &'a [Bytes],
}

impl Call for PushDead<'_> {
    /// How many dead letters the bound trimmed.
    type Reply = u64;

    fn script(&self) -> &'static Script {
        &PUSH
    }

    /// KEYS and ARGV: see `push.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut args = Vec::with_capacity(1 + self.frames.len());
        args.push(self.bound.arg());
        args.extend(self.frames.iter().cloned().map(Value::Bytes));
        (vec![self.dead.to_owned()], args)
    }

    fn parse(&self, reply: Value) -> u64 {
        lua::reply_u64(&reply)
    }
}

/// Pushes a batch's dead letters; acknowledges nothing.
pub(crate) struct PushDeadLetters {
    pub(crate) pool: Pool,
    /// The full dead-letter list, its bound and its trims; `None` when the subscription has none.
    pub(crate) dead: Option<(String, DeadBound, Trims)>,
}

impl PushDeadLetters {
    /// The settle of a subscription of `queue` (its full name, the metric's label) whose
    /// dead-letter list is `dead`.
    pub(crate) fn new(pool: Pool, queue: &str, dead: Option<String>, bound: DeadBound) -> Self {
        Self {
            pool,
            dead: dead.map(|d| {
                let trims = Trims::new(queue, &d);
                (d, bound, trims)
            }),
        }
    }
}

impl Settle for PushDeadLetters {
    fn settle<'a>(&'a self, batch: &'a [(Token, Settlement)]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let frames: Vec<Bytes> = batch
                .iter()
                .filter_map(|(t, s)| match s {
                    Settlement::Dead { reason } => Some(t.dead_frame(reason)),
                    _ => None,
                })
                .collect();
            match &self.dead {
                _ if frames.is_empty() => {}
                Some((dead, bound, trims)) => {
                    let call = PushDead {
                        dead,
                        bound: *bound,
                        frames: &frames,
                    };
                    trims.record(call.call(self.pool.next()).await?);
                    logged(batch, dead);
                }
                None => {
                    for (t, s) in batch {
                        if let Settlement::Dead { reason } = s {
                            discarded(t, reason);
                        }
                    }
                }
            }
            Ok(())
        })
    }

    fn unsettled(&self) -> String {
        // The entries were popped when claimed: only their dead letters were left to write.
        match &self.dead {
            Some((dead, ..)) => format!("nowhere: their dead letters for `{dead}` are not written"),
            None => "nowhere: they were popped when claimed".to_owned(),
        }
    }
}
