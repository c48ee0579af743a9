//! Cancelling a message of a stream by id: [`CancelStream`], the typed call of `stream.lua`
//! (the stream's cancel record, delayed set, and the PEL of each group reading it).
//!
//! Commands: `EVALSHA` of `stream.lua` (`HGET`, `EXISTS`, `XINFO GROUPS`, `XPENDING key group -
//! + n`, `XRANGE key id id`, `XREVRANGE key + - COUNT 1`, `ZSCORE`, `HLEN`, `ZREM`, `HDEL`,
//! `HSET`, `PEXPIRE`, `PUBLISH`).

use std::sync::LazyLock;

use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::CancelOutcome;

use crate::keys::KeySpace;
use crate::lua::{self, Call};

/// Most pending entries of one group the cancel looks through for the message (an operator's
/// call, rare: bounded so a group with a huge PEL costs a bounded scan).
pub(crate) const MOST_PENDING: usize = 10_000;

static CANCEL_STREAM: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("stream.lua")));

/// The keys a cancel of one stream (or partition) touches, all in the stream's slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCancelKeys {
    /// The cancel record (`K.cancels`).
    pub record: String,
    /// The Pub/Sub channel of the signal (`K.cancel`).
    pub channel: String,
    /// The delayed set.
    pub delayed: String,
    /// The delayed payload hash.
    pub payloads: String,
    /// The stream.
    pub stream: String,
    /// What a message's step record is named, but for its id (`K.steps:`, `crate::steps`).
    pub steps: String,
}

impl StreamCancelKeys {
    /// The keys of the full stream key `stream`.
    pub(crate) fn of(space: &KeySpace, stream: &str) -> Self {
        let delayed = space.delayed(stream);
        Self {
            record: space.cancels(stream),
            channel: space.cancel_channel(stream),
            delayed: delayed.set,
            payloads: delayed.payloads,
            stream: stream.to_owned(),
            steps: space.steps(stream, ""),
        }
    }
}

/// One call of `cancel/stream.lua`: cancels message `id` of one stream, for every group.
#[derive(Debug, Clone, PartialEq)]
pub struct CancelStream<'a> {
    /// The stream's keys.
    pub keys: &'a StreamCancelKeys,
    /// The message id (an entry's `rs.id` field).
    pub id: &'a str,
}

impl Call for CancelStream<'_> {
    /// What the cancel did (`missing` is [`CancelOutcome::NotFound`]); `None` for a reply the
    /// script does not give.
    type Reply = Option<CancelOutcome>;

    fn script(&self) -> &'static Script {
        &CANCEL_STREAM
    }

    /// KEYS and ARGV: see `cancel/stream.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let k = self.keys;
        let keys = vec![
            k.record.clone(),
            k.delayed.clone(),
            k.payloads.clone(),
            k.stream.clone(),
        ];
        let args = vec![
            Value::from(self.id),
            Value::from(k.channel.as_str()),
            lua::int(super::MOST),
            lua::int(usize::try_from(super::TTL.as_millis()).unwrap_or(usize::MAX)),
            lua::int(MOST_PENDING),
            Value::from(format!("{}{}", k.steps, self.id)),
        ];
        (keys, args)
    }

    fn parse(&self, reply: Value) -> Option<CancelOutcome> {
        super::outcome(reply)
    }
}
