//! What a settle does with one entry, as the settle scripts take it (`list/settle.lua`,
//! `stream/settle.lua`): [`Op`], written once for both, and the Lua parts both are built
//! with. Sends no command.

use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;

use crate::lua;

/// The Lua both settle scripts are prepended with: the guard, the delayed retry's part, and the
/// way back to the queue with what it needs.
pub(crate) const PARTS: [&str; 5] = [
    lua::GUARD,
    crate::delayed::SCHEDULE_RETRY,
    crate::frame::LUA,
    lua::BOUND,
    lua::BACK,
];

/// What a settle does with one claimed entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Acknowledge it.
    Ack,
    /// Put `frame` back onto its queue now (`back.lua`).
    Retry {
        /// The entry as it goes back (its attempt raised).
        frame: Bytes,
    },
    /// Schedule `frame` in the delayed set, due `after` from the server's now, as message `id`.
    Later {
        /// The entry as it comes back.
        frame: Bytes,
        /// How long from now.
        after: Duration,
        /// The message's id, its field in the delayed hash.
        id: String,
    },
    /// Push `frame` onto the dead letters.
    Dead {
        /// The dead letter (with its `reason` header).
        frame: Bytes,
    },
}

impl Op {
    /// Appends the op's `op new arg` to a settle script's ARGV.
    pub(crate) fn push(&self, args: &mut Vec<Value>) {
        let empty = || Value::from_static_str("");
        let (op, new, arg) = match self {
            Self::Ack => ("a", empty(), empty()),
            Self::Retry { frame } => ("r", Value::Bytes(frame.clone()), empty()),
            Self::Later { frame, after, id } => (
                "d",
                Value::Bytes(frame.clone()),
                crate::delayed::retry_arg(*after, id),
            ),
            Self::Dead { frame } => ("x", Value::Bytes(frame.clone()), empty()),
        };
        args.extend([Value::from_static_str(op), new, arg]);
    }
}
