//! Dead letters: read (`LRANGE`, `LINDEX`), requeue (`requeue.lua`) and purge (`purge.lua`).
//!
//! A dead-letter list grows at its head (`LPUSH`), so its oldest entry is its last. Entries are
//! shown oldest first; one without a message id (a raw value that was never a frame) is named
//! `#N`, the N-th oldest.

use std::sync::LazyLock;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::{ConfigError, Headers, Result};
use serde::Serialize;

use super::{BATCH, Operator, Select, in_batches};
use crate::back::Dest;
use crate::error::core;
use crate::frame::{Frame, REASON_HEADER};
use crate::keys::SourceKeys;
use crate::lua::{self, Call};

static REQUEUE: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("requeue.lua")));

static PURGE: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("purge.lua")));

/// Which dead letters one requeue or purge call takes.
#[derive(Debug, Clone, PartialEq)]
pub enum Taken {
    /// The oldest `n` (a requeue takes at most 1,000 a call).
    Oldest(usize),
    /// The one with exactly these bytes, if it is still there.
    Value(Bytes),
}

impl Taken {
    fn push(&self, args: &mut Vec<Value>) {
        match self {
            Self::Oldest(n) => args.extend([Value::from_static_str("oldest"), lua::int(*n)]),
            Self::Value(v) => {
                args.extend([Value::from_static_str("values"), Value::Bytes(v.clone())])
            }
        }
    }
}

/// One call of `requeue.lua`: moves dead letters of `dead` back onto `dest`.
#[derive(Debug, Clone, PartialEq)]
pub struct Requeue<'a> {
    /// The dead-letter list.
    pub dead: &'a str,
    /// Their queue.
    pub dest: &'a Dest,
    /// Which.
    pub take: Taken,
}

impl Call for Requeue<'_> {
    /// How many were moved.
    type Reply = i64;

    fn script(&self) -> &'static Script {
        &REQUEUE
    }

    /// KEYS and ARGV: see `requeue.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut keys = vec![self.dead.to_owned()];
        let mut args = Vec::with_capacity(5);
        self.dest.push(&mut keys, &mut args);
        self.take.push(&mut args);
        (keys, args)
    }

    fn parse(&self, reply: Value) -> i64 {
        lua::reply_i64(&reply)
    }
}

/// One call of `purge.lua`: deletes dead letters of `dead`.
#[derive(Debug, Clone, PartialEq)]
pub struct Purge<'a> {
    /// The dead-letter list.
    pub dead: &'a str,
    /// Which.
    pub take: Taken,
}

impl Call for Purge<'_> {
    /// How many were deleted.
    type Reply = i64;

    fn script(&self) -> &'static Script {
        &PURGE
    }

    /// KEYS and ARGV: see `purge.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut args = Vec::with_capacity(2);
        self.take.push(&mut args);
        (vec![self.dead.to_owned()], args)
    }

    fn parse(&self, reply: Value) -> i64 {
        lua::reply_i64(&reply)
    }
}

/// One dead letter, decoded.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The message id, or `#N` (the N-th oldest) for an entry without one.
    pub id: String,
    /// The deliveries it had.
    pub attempt: u32,
    /// Why it is here (`max-attempts`, `dropped`, `decode: ...`).
    pub reason: Option<String>,
    /// Its headers, without the reason (`dead-history` holds the reasons of earlier requeues,
    /// `dead-at` when it died, in ms since the epoch on the server's clock).
    pub headers: Headers,
    /// The payload: JSON when it parses as JSON, else its text, else a note of its size.
    pub payload: serde_json::Value,
    /// The stored value's size in bytes.
    pub size: usize,
    /// The payload's size in bytes.
    pub payload_size: usize,
}

impl DeadLetter {
    fn of(raw: &Bytes, position: usize) -> Self {
        let frame = Frame::decode(raw.clone());
        let mut headers = frame.headers;
        let reason = headers.remove(REASON_HEADER);
        Self {
            id: if frame.id.is_empty() {
                format!("#{position}")
            } else {
                frame.id
            },
            attempt: frame.attempt,
            reason,
            headers,
            payload: payload_view(&frame.payload),
            size: raw.len(),
            payload_size: frame.payload.len(),
        }
    }
}

/// The `LRANGE` bounds of a page of a list whose oldest entry is at its tail (`LPUSH`ed): the
/// `limit` entries after the `offset` oldest.
pub(super) fn oldest_page(offset: usize, limit: usize) -> (i64, i64) {
    let offset = i64::try_from(offset).unwrap_or(i64::MAX / 2);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX / 2);
    (-(offset + limit), -(offset + 1))
}

/// The payload as JSON, text, or a note of its size.
pub(super) fn payload_view(payload: &[u8]) -> serde_json::Value {
    if let Ok(v) = serde_json::from_slice(payload) {
        return v;
    }
    match std::str::from_utf8(payload) {
        Ok(text) => serde_json::Value::String(text.to_owned()),
        Err(_) => serde_json::Value::String(format!("<{} bytes, not UTF-8>", payload.len())),
    }
}

impl Operator {
    /// The `limit` oldest dead letters of the subscription `name`, oldest first.
    pub async fn dead_letters(&self, name: &str, limit: usize) -> Result<Vec<DeadLetter>> {
        self.dead_letters_from(name, 0, limit).await
    }

    /// The `limit` dead letters of the subscription `name` after the `offset` oldest, oldest
    /// first (a page of them).
    pub async fn dead_letters_from(
        &self,
        name: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        let dead = dead_key(self.queue(name)?)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let client = self.conns.pool()?.next().clone();
        let (start, stop) = oldest_page(offset, limit);
        let values: Vec<Bytes> = client.lrange(&dead, start, stop).await.map_err(core)?;
        Ok(values
            .iter()
            .rev()
            .enumerate()
            .map(|(i, v)| DeadLetter::of(v, offset + i + 1))
            .collect())
    }

    /// The dead letter `id` (a message id, or `#N`) of the subscription `name`, if it is there.
    pub async fn dead_letter(&self, name: &str, id: &str) -> Result<Option<DeadLetter>> {
        let dead = dead_key(self.queue(name)?)?;
        let client = self.conns.pool()?.next().clone();
        Ok(find(&client, &dead, id)
            .await?
            .map(|(raw, position)| DeadLetter::of(&raw, position)))
    }

    /// Moves dead letters of the subscription `name` back to its queue (onto its own priority
    /// level, on a list with levels), atomically, each with its attempt count reset to 1 and
    /// its reason appended to a `dead-history` header; a
    /// stream is then trimmed as its route says (`RedisBroker::route`). Returns how many moved
    /// (0 when `Select::Id` names none).
    pub async fn requeue(&self, name: &str, select: &Select) -> Result<usize> {
        let q = self.queue(name)?;
        let dead = dead_key(q)?;
        let bound = self
            .conns
            .routes
            .get(q.partition_of.as_deref().unwrap_or(&q.name))
            .and_then(|p| p.stream())
            .unwrap_or_default()
            .script_arg();
        let dest = match q.transport {
            "list" => {
                // A list's priority levels: each dead letter goes back onto its own.
                let mut levels = vec![q.queue.clone()];
                levels.extend(q.levels.iter().cloned());
                Dest::list(levels)
            }
            "stream" => Dest::Stream {
                key: q.queue.clone(),
                bound,
            },
            _ if q.mode == "pattern" => {
                return Err(ConfigError::new(
                    "requeue",
                    "it is a pattern subscription: its dead letters came from many channels and RustStream does not know which",
                    "publish them again by hand",
                )
                .on(name)
                .into());
            }
            _ if q.mode == "sharded" => Dest::Sharded {
                channel: q.queue.clone(),
            },
            _ => Dest::PubSub {
                channel: q.queue.clone(),
            },
        };
        self.apply(&dead, select, |take| Requeue {
            dead: &dead,
            dest: &dest,
            take,
        })
        .await
    }

    /// Deletes dead letters of the subscription `name`. Returns how many.
    pub async fn purge(&self, name: &str, select: &Select) -> Result<usize> {
        let dead = dead_key(self.queue(name)?)?;
        self.apply(&dead, select, |take| Purge { dead: &dead, take })
            .await
    }

    /// Runs the call `make` builds on the entries `select` names: by value for one id, in
    /// batches of the oldest for all (never more than the list held when it started, so dead
    /// letters that arrive meanwhile are left alone).
    async fn apply<C: Call<Reply = i64> + Sync>(
        &self,
        dead: &str,
        select: &Select,
        make: impl Fn(Taken) -> C,
    ) -> Result<usize> {
        let client = self.conns.pool()?.next().clone();
        match select {
            Select::Id(id) => {
                let Some((raw, _)) = find(&client, dead, id).await? else {
                    return Ok(0);
                };
                let n = make(Taken::Value(raw)).call(&client).await?;
                Ok(usize::try_from(n).unwrap_or(0))
            }
            Select::All { limit } => {
                let len: usize = client.llen(dead).await.map_err(core)?;
                in_batches(len, *limit, |take| {
                    let call = make(Taken::Oldest(take));
                    let client = &client;
                    async move { Ok(usize::try_from(call.call(client).await?).unwrap_or(0)) }
                })
                .await
            }
        }
    }
}

/// The dead-letter list of `q`, or an error when dead letters are off.
fn dead_key(q: &SourceKeys) -> Result<String> {
    q.dead.clone().ok_or_else(|| {
        ConfigError::new(
            "no_dead_letter",
            "it has no dead-letter list: nothing is kept",
            "give it one (leave out `.no_dead_letter()`) to keep dead letters from now on",
        )
        .on(&q.name)
        .into()
    })
}

/// The value and position (N-th oldest) of the dead letter `id` in the list `dead`, looked for
/// from the oldest, a page at a time.
async fn find(client: &Client, dead: &str, id: &str) -> Result<Option<(Bytes, usize)>> {
    if let Some(n) = id.strip_prefix('#').and_then(|n| n.parse::<i64>().ok()) {
        if n < 1 {
            return Ok(None);
        }
        let v: Option<Bytes> = client.lindex(dead, -n).await.map_err(core)?;
        return Ok(v.and_then(|v| usize::try_from(n).ok().map(|n| (v, n))));
    }
    let page = BATCH as i64;
    let mut from_tail = 0_i64;
    loop {
        let values: Vec<Bytes> = client
            .lrange(dead, -(from_tail + page), -(from_tail + 1))
            .await
            .map_err(core)?;
        for (i, v) in values.iter().rev().enumerate() {
            if Frame::decode(v.clone()).id == id {
                let position = usize::try_from(from_tail).unwrap_or(0) + i + 1;
                return Ok(Some((v.clone(), position)));
            }
        }
        if values.len() < BATCH {
            return Ok(None);
        }
        from_tail += page;
    }
}
