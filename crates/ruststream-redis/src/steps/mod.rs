//! Step records (the core's [`StepStore`](ruststream_core::StepStore)): one hash per message,
//! `K.steps:<id>` beside its queue `K` (in `K`'s slot, so the settle that acknowledges or
//! dead-letters the message removes it in the same script), step name → the step's JSON result,
//! or for a durable sleep (`sleep:<n>`) its wake-up time in ms on the server's clock.
//!
//! Bounds: the record expires [`STEPS_TTL`] after its last write (a sleep's, that long after its
//! wake-up); it holds at most [`MAX_STEP_FIELDS`] fields (`RSFULL` past them: [`MAX_STEPS`]
//! steps with their timing `t:<name>`) of at most `MAX_STEP_BYTES` each (checked by the core).
//! The settle that acknowledges or dead-letters the message deletes it, or with the source's
//! `keep_steps` sets its expiry to that.
//!
//! Commands: a handler's first step reads the record with `read.lua` (`TIME`, `HGETALL`); each
//! step it runs is one `write.lua` (`TIME`, `HSET` of its result and timing, `PEXPIRE` never
//! shortening the expiry); a wait for a
//! signal and a signal are one script each (`signal.rs`).

use std::collections::HashMap;
use std::sync::LazyLock;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::steps::{MAX_STEP_FIELDS, STEPS_TTL, timing_field};
use ruststream_core::{Result, StepRecord, StepWrite};

use crate::conn::Connections;
use crate::lua::{self, Call};

mod signal;

/// The typed calls of the wait and the signal (`crate::testing`).
pub use signal::{BeginWait, SendSignal};
pub(crate) use signal::{begin_wait, signal};

static WRITE: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("write.lua")));

static READ: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("read.lua")));

/// One call of `steps/write.lua`: records one step (or sleep) of one message.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteStep<'a> {
    /// The record (full name).
    pub key: &'a str,
    /// The step's name.
    pub name: &'a str,
    /// What it records.
    pub write: &'a StepWrite,
}

impl Call for WriteStep<'_> {
    /// The value stored.
    type Reply = Bytes;

    fn script(&self) -> &'static Script {
        &WRITE
    }

    /// KEYS and ARGV: see `steps/write.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let none = || Value::from_static_str("");
        let ms = |d: &std::time::Duration| {
            Value::Integer(i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2))
        };
        let (value, sleep, timing, took) = match self.write {
            StepWrite::Result(json) => (Value::Bytes(json.clone()), none(), none(), none()),
            StepWrite::Sleep(d) => (none(), ms(d), Value::from(timing_field(self.name)), none()),
            StepWrite::Timed { value, step, took } => (
                Value::Bytes(value.clone()),
                none(),
                Value::from(timing_field(step)),
                ms(took),
            ),
            _ => (none(), none(), none(), none()),
        };
        (
            vec![self.key.to_owned()],
            vec![
                Value::from(self.name),
                value,
                Value::Integer(crate::list::ttl_ms(STEPS_TTL)),
                Value::Integer(i64::from(MAX_STEP_FIELDS)),
                sleep,
                timing,
                took,
            ],
        )
    }

    fn parse(&self, reply: Value) -> Bytes {
        match reply {
            Value::Bytes(b) => b,
            Value::String(s) => s.inner().clone(),
            Value::Integer(n) => Bytes::from(n.to_string()),
            _ => Bytes::new(),
        }
    }
}

/// One call of `steps/read.lua`: a message's record and the server's time.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReadSteps<'a> {
    /// The record (full name).
    pub(crate) key: &'a str,
}

impl Call for ReadSteps<'_> {
    type Reply = StepRecord;

    fn script(&self) -> &'static Script {
        &READ
    }

    /// KEYS: the record; no ARGV.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        (vec![self.key.to_owned()], Vec::new())
    }

    fn parse(&self, reply: Value) -> StepRecord {
        let Value::Array(items) = reply else {
            return StepRecord::default();
        };
        let mut items = items.into_iter();
        let now_ms = items.next().as_ref().map_or(0, lua::reply_u64);
        let mut steps = HashMap::new();
        while let (Some(name), Some(value)) = (items.next(), items.next()) {
            if let (Some(name), Some(value)) = (name.as_string(), value.into_bytes()) {
                steps.insert(name, value);
            }
        }
        StepRecord::new(now_ms, steps)
    }
}

/// The full key of message `id`'s step record on the (unprefixed) key `source`.
pub(crate) fn record_key(conns: &Connections, source: &str, id: &str) -> String {
    let keys = &conns.keys;
    keys.steps(&keys.key(source), id)
}

/// `read.lua` on message `id`'s record on `source`.
pub(crate) async fn read_steps(conns: &Connections, source: &str, id: &str) -> Result<StepRecord> {
    conns.connect().await?;
    let pool = conns.pool()?;
    let key = record_key(conns, source, id);
    ReadSteps { key: &key }.call(pool.next()).await
}

/// `write.lua` of step `name` on message `id`'s record on `source`.
pub(crate) async fn write_step(
    conns: &Connections,
    source: &str,
    id: &str,
    name: &str,
    write: StepWrite,
) -> Result<Bytes> {
    conns.connect().await?;
    let pool = conns.pool()?;
    let key = record_key(conns, source, id);
    let call = WriteStep {
        key: &key,
        name,
        write: &write,
    };
    call.call(pool.next()).await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_sleep_sends_its_length_and_keeps_the_record_past_it() {
        let write = StepWrite::Sleep(Duration::from_secs(30 * 24 * 3600));
        let call = WriteStep {
            key: "{q}.steps:1",
            name: "sleep:1",
            write: &write,
        };
        let (keys, args) = call.build();
        assert_eq!(keys, ["{q}.steps:1"]);
        assert_eq!(args[4], Value::Integer(30 * 24 * 3600 * 1000));
        assert_eq!(args[2], Value::Integer(7 * 24 * 3600 * 1000), "the ttl");
    }
}
