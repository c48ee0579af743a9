//! Waits for signals (`ctx.wait_for`, `publisher.signal`): `wait.lua` begins a message's wait,
//! `signal.lua` records a signal and makes the parked message due now. Both write the message's
//! step record `K.steps:<id>` (fields `wait:<name>`, its deadline, and `signal:<name>`, the
//! payload); the signal also the queue's delayed set `K.delayed`, where a parked message waits.
//! The park itself is the settle's retry later (`crate::settle::Op::later`), which looks the
//! signal up, so a signal sent while the handler runs is not lost to the park.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::steps::{MAX_STEP_FIELDS, STEPS_TTL, signal_field, wait_field};
use ruststream_core::{ConfigError, Error, ErrorKind, Result, Signalled, Waited};

use crate::conn::Connections;
use crate::lua::{self, Call};

static WAIT: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("wait.lua")));

static SIGNAL: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("signal.lua")));

/// One call of `steps/wait.lua`: begins message's wait for a signal.
#[derive(Debug, Clone, PartialEq)]
pub struct BeginWait<'a> {
    /// The record (full name).
    pub key: &'a str,
    /// The signal's name.
    pub name: &'a str,
    /// The wait's longest.
    pub timeout: Duration,
}

impl Call for BeginWait<'_> {
    type Reply = Option<Waited>;

    fn script(&self) -> &'static Script {
        &WAIT
    }

    /// KEYS and ARGV: see `steps/wait.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        (
            vec![self.key.to_owned()],
            vec![
                Value::from(wait_field(self.name)),
                Value::from(signal_field(self.name)),
                Value::Integer(crate::list::ttl_ms(self.timeout)),
                Value::Integer(crate::list::ttl_ms(STEPS_TTL)),
                Value::Integer(i64::from(MAX_STEP_FIELDS)),
            ],
        )
    }

    fn parse(&self, reply: Value) -> Option<Waited> {
        let Value::Array(items) = reply else {
            return None;
        };
        let mut items = items.into_iter();
        let kind = items.next().as_ref().map(lua::reply_i64)?;
        let value = items.next()?;
        match kind {
            1 => value.into_bytes().map(Waited::Signalled),
            _ => Some(Waited::Parked(lua::reply_u64(&value))),
        }
    }
}

/// One call of `steps/signal.lua`: sends one signal to one message.
#[derive(Debug, Clone, PartialEq)]
pub struct SendSignal<'a> {
    /// The record (full name).
    pub key: &'a str,
    /// The queue's delayed set and its payload hash (full names).
    pub delayed: (&'a str, &'a str),
    /// The message's id.
    pub id: &'a str,
    /// The signal's name.
    pub name: &'a str,
    /// Its payload (JSON).
    pub payload: Bytes,
}

impl Call for SendSignal<'_> {
    type Reply = Option<Signalled>;

    fn script(&self) -> &'static Script {
        &SIGNAL
    }

    /// KEYS and ARGV: see `steps/signal.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        (
            vec![
                self.key.to_owned(),
                self.delayed.0.to_owned(),
                self.delayed.1.to_owned(),
            ],
            vec![
                Value::from(self.id),
                Value::from(signal_field(self.name)),
                Value::from(wait_field(self.name)),
                Value::Bytes(self.payload.clone()),
                Value::Integer(crate::list::ttl_ms(STEPS_TTL)),
                Value::Integer(i64::from(MAX_STEP_FIELDS)),
            ],
        )
    }

    fn parse(&self, reply: Value) -> Option<Signalled> {
        match reply.as_string()?.as_str() {
            "woken" => Some(Signalled::Woken),
            "kept" => Some(Signalled::Kept),
            "late" => Some(Signalled::Late),
            "already" => Some(Signalled::Already),
            _ => None,
        }
    }
}

/// The error of a script that answered something it does not answer.
fn unexpected(script: &str) -> Error {
    Error::broker(
        ErrorKind::UnexpectedReply,
        format!("steps/{script} answered something it does not answer"),
    )
}

/// `wait.lua` on message `id`'s record.
pub(crate) fn begin_wait<'a>(
    conns: &'a Connections,
    key: String,
    name: &'a str,
    timeout: Duration,
) -> BoxFuture<'a, Result<Waited>> {
    Box::pin(async move {
        conns.connect().await?;
        let pool = conns.pool()?;
        let call = BeginWait {
            key: &key,
            name,
            timeout,
        };
        call.call(pool.next())
            .await?
            .ok_or_else(|| unexpected("wait.lua"))
    })
}

/// `signal.lua` on message `id` of `destination`, a list queue or a stream without partitions.
pub(crate) async fn signal(
    conns: &Connections,
    destination: &str,
    id: &str,
    name: &str,
    payload: Bytes,
) -> Result<Signalled> {
    conns.connect().await?;
    let route = conns.routes.get(destination).unwrap_or_default();
    let partitioned = match &route {
        crate::PublishPolicy::List(l) => l.layout.partitions.is_some(),
        crate::PublishPolicy::Stream(s) => s.partitions.is_some(),
        crate::PublishPolicy::PubSub(_) => {
            return Err(ConfigError::new(
                "signal",
                format!(
                    "signal `{name}`: the destination is published on Pub/Sub, which keeps no step records"
                ),
                "signal a list queue or a stream",
            )
            .on(destination)
            .into());
        }
    };
    if partitioned {
        return Err(ConfigError::new(
            "signal",
            format!("signal `{name}`: a destination with partitions cannot be signalled"),
            "signal a queue without partitions",
        )
        .on(destination)
        .into());
    }
    let pool = conns.pool()?;
    let keys = &conns.keys;
    let full = keys.key(destination);
    let record = keys.steps(&full, id);
    let delayed = keys.delayed(&full);
    let call = SendSignal {
        key: &record,
        delayed: (&delayed.set, &delayed.payloads),
        id,
        name,
        payload,
    };
    call.call(pool.next())
        .await?
        .ok_or_else(|| unexpected("signal.lua"))
}
