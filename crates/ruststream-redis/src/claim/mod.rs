//! The claim pipeline: one script per transport decides what a claim takes, built from Lua
//! parts: where entries come from (a list's levels, `list/take.lua`; a grouped list's groups
//! round robin, `list/groups.lua`; a stream's group), the gates
//! that hold it back (`gates.lua`, with one part per gate: `paused.lua`, `limit.lua`, `cap.lua`;
//! `cancels.lua` drops a cancelled message's entry after the take), and what
//! it records (a list's processing list and recovery set). This module holds the typed calls of
//! those scripts: [`Claim`] (`list/claim.lua`, simple and reliable lists) and [`StreamRead`]
//! (`stream/read.lua`), each building its script's KEYS and ARGV and parsing its reply, and
//! [`Gate`], one gate's keys and arguments as its option builds them.
//!
//! A new gate is a Lua part that registers `GATES.<name>` (see `gates.lua`'s header), named on
//! the `-- needs:` lines of the claim scripts, a constructor of [`Gate`] next to its option, and
//! its place in [`gates`]: no claim script's body and no path that puts an entry back changes. The concurrency cap (`cap.rs`,
//! `cap.lua`) was added so.
//!
//! Both calls read their replies from the RESP frames fred received (`crate::reply::Reply`), in
//! one pass, not through fred's `Value`s: a claim's reply holds every entry it took.
//!
//! A reader whose claim needs none of this (a simple list or a consumer group with no gate but
//! the pause, and the cancels) reads with native commands instead (`native.rs`), and through
//! its script only while a pause or a cancel is pending.
//!
//! Commands: `EVALSHA` of `list/claim.lua` or `stream/read.lua` (`SCRIPT LOAD` on `NOSCRIPT`).

use std::future::Future;
use std::sync::LazyLock;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::Result;

use crate::lua::{self, Call};
use crate::pause::Hold;
use crate::reply::{Reply, frame_bytes, frame_items, frame_u64, value_frame};
use limit::{Held, Limiter};

pub(crate) mod cap;
pub(crate) mod limit;
pub(crate) mod native;
mod reserve;
pub(crate) use reserve::{Refund, Reserve};

/// The name of the pause gate, as a claim's reply names the gate that let nothing through.
pub(crate) const PAUSED: &str = "paused";

static CLAIM: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("../list/claim.lua")));

static READ: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("../stream/read.lua")));

/// The gates of a reader's claims: the pause (if the source can be paused) first, so a paused
/// claim charges no limit, then the concurrency cap, then the rate limit (charged only for what
/// the gates before it let through).
pub(crate) fn gates(pause: Option<&Hold>, cap: Option<Gate>, rate: Option<&Limiter>) -> Vec<Gate> {
    pause
        .map(|p| Gate::paused(p.key().to_owned()))
        .into_iter()
        .chain(cap)
        .chain(rate.map(Limiter::gate))
        .collect()
}

/// What a reader does with a claim's verdict: a pause closes its pause gate (`pause`); what the
/// cap held back is counted in `ruststream_capped_total{queue}` (the cap let nothing through,
/// or the reader has no rate limit), else in the rate limit's counter.
pub(crate) fn report(
    closed: Option<&str>,
    held: Held,
    pause: Option<&Hold>,
    rate: bool,
    queue: &str,
) {
    match closed {
        Some(PAUSED) => {
            if let Some(p) = pause {
                p.closed();
            }
        }
        Some(cap::GATE) => cap::count(held, queue),
        _ if !rate => cap::count(held, queue),
        _ => held.count(queue),
    }
}

/// One gate of a claim: its name in `GATES`, its keys and its arguments (`gates.lua`).
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    name: &'static str,
    keys: Vec<String>,
    args: Vec<Value>,
}

impl Gate {
    /// A gate named `name` (its Lua part's `GATES.<name>`) on `keys` with `args`.
    pub(crate) fn new(name: &'static str, keys: Vec<String>, args: Vec<Value>) -> Self {
        Self { name, keys, args }
    }

    /// The pause gate of the pause key `key` (full name): nothing passes while it exists.
    pub fn paused(key: String) -> Self {
        Self::new(PAUSED, vec![key], Vec::new())
    }

    /// The cancel gate of a list's cancel record `record` (full name): an entry taken whose id
    /// the record holds is dropped, not delivered (`cancels.lua`, see `crate::cancel`).
    pub fn cancels(record: String) -> Self {
        Self::new("cancels", vec![record], Vec::new())
    }

    /// Appends this gate's keys to `keys` and `name, #keys, #args, args..` to `args`.
    fn push(&self, keys: &mut Vec<String>, args: &mut Vec<Value>) {
        keys.extend(self.keys.iter().cloned());
        args.push(Value::from_static_str(self.name));
        args.push(lua::int(self.keys.len()));
        args.push(lua::int(self.args.len()));
        args.extend(self.args.iter().cloned());
    }
}

/// What a list claim records.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// Nothing: a simple list pops.
    Pop,
    /// The processing list only (a reliable list without recovery).
    List {
        /// The processing list (full name).
        processing: String,
    },
    /// The processing list and, in the recovery set, one member a claimed batch with the
    /// batch's list of values (`list/claim.lua`), swept first.
    Claims {
        /// The processing list (full name).
        processing: String,
        /// The recovery set (full name).
        zset: String,
        /// The reader's id, the first part of each claim.
        reader: String,
        /// min_idle in ms: claims older than this are swept back.
        min_idle_ms: u64,
        /// The recovery set's ttl in ms (0 = none).
        ttl_ms: u64,
        /// Most claims one run sweeps back.
        most: u32,
    },
}

/// One call of `list/claim.lua`: sweep (with recovery), then take up to `max` entries from the
/// levels through the gates, and record them.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim<'a> {
    /// The queue's levels, lowest first (level 0, the queue itself, alone without levels).
    pub levels: &'a [String],
    /// What the claim records.
    pub record: &'a Record,
    /// The gates, in the order they are asked.
    pub gates: &'a [Gate],
    /// Most entries to take.
    pub max: usize,
    /// The sequence number of the first claim (with [`Record::Claims`]).
    pub first_seq: u64,
    /// Whether the call must run when sent or not at all (`lua::once`): a claim that may sweep,
    /// on a real connection.
    pub once: bool,
    /// The server time (ms) past which the call must not sweep (`crate::sweep_clock`); `None`:
    /// no deadline.
    pub sweep_by: Option<u64>,
}

/// What a claim took, and what held the rest back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Claimed {
    /// Stale claims swept back onto the queue.
    pub recovered: u64,
    /// The run's id (server time), part of each claim's member ('' without recovery).
    pub run: Bytes,
    /// What the gates held back.
    pub held: Held,
    /// The gate that let nothing through, if any (`"paused"` when paused).
    pub closed: Option<String>,
    /// The entries, oldest of each level first.
    pub values: Vec<Bytes>,
    /// The sequence number of the first entry's claim (the call's [`Claim::first_seq`]).
    pub first_seq: u64,
}

impl Claimed {
    /// Whether the pause gate let nothing through.
    pub fn paused(&self) -> bool {
        self.closed.as_deref() == Some(PAUSED)
    }
}

impl Call for Claim<'_> {
    type Reply = Claimed;

    fn script(&self) -> &'static Script {
        &CLAIM
    }

    /// KEYS: the levels, the records' keys, then each gate's keys; ARGV: see
    /// `list/claim.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut keys: Vec<String> = self.levels.to_vec();
        let max = lua::int(self.max);
        let zero = || Value::Integer(0);
        let mut args = match self.record {
            Record::Pop => vec![max, Value::from_static_str(""), "".into(), zero(), zero()],
            Record::List { processing } => {
                keys.push(processing.clone());
                vec![
                    max,
                    Value::from_static_str("list"),
                    "".into(),
                    zero(),
                    zero(),
                ]
            }
            Record::Claims {
                processing,
                zset,
                reader,
                min_idle_ms,
                ..
            } => {
                keys.push(processing.clone());
                keys.push(zset.clone());
                vec![
                    max,
                    Value::from_static_str("claims"),
                    Value::from(reader.as_str()),
                    Value::from(self.first_seq.to_string()),
                    Value::from(min_idle_ms.to_string()),
                ]
            }
        };
        let (ttl, most) = match self.record {
            Record::Claims { ttl_ms, most, .. } => (*ttl_ms, *most),
            _ => (0, 0),
        };
        args.push(Value::from(ttl.to_string()));
        args.push(Value::Integer(i64::from(most)));
        args.push(lua::int(self.levels.len()));
        args.push(
            self.sweep_by
                .map_or_else(|| "".into(), |by| Value::from(by.to_string())),
        );
        for g in self.gates {
            g.push(&mut keys, &mut args);
        }
        (keys, args)
    }

    fn parse(&self, reply: Value) -> Claimed {
        self.read(value_frame(reply))
    }

    // The trait's `call` with the reply read as a frame; an `async fn` here cannot name the
    // trait's lifetimes (its future must be `Send` for every `&self`).
    #[expect(clippy::manual_async_fn, reason = "see the comment above")]
    fn call(&self, client: &Client) -> impl Future<Output = Result<Claimed>> + Send {
        async move { Ok(self.read(lua::call_frame(self, client, self.once).await?)) }
    }
}

impl Claim<'_> {
    /// Reads the reply `recovered, run, held, wait, closed, entries..` (`list/claim.lua`).
    fn read(&self, reply: Reply) -> Claimed {
        let mut claimed = Claimed {
            first_seq: self.first_seq,
            ..Claimed::default()
        };
        let Some(items) = frame_items(reply) else {
            return claimed;
        };
        let mut items = items.into_iter();
        claimed.recovered = items.next().map_or(0, |f| frame_u64(&f));
        claimed.run = items.next().and_then(frame_bytes).unwrap_or_default();
        claimed.held = Held::read(&mut items);
        claimed.closed = items.next().and_then(text);
        let mut values = Vec::with_capacity(items.len());
        values.extend(items.filter_map(frame_bytes));
        claimed.values = values;
        claimed
    }
}

/// One call of `stream/read.lua`: up to `max` new entries of the group through the gates.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamRead<'a> {
    /// The stream (full name).
    pub stream: &'a str,
    /// The consumer group.
    pub group: &'a str,
    /// The consumer.
    pub consumer: &'a str,
    /// The stream's cancel record (`K.cancels`): entries of the messages it holds are acked,
    /// not delivered.
    pub cancels: &'a str,
    /// The gates, in the order they are asked.
    pub gates: &'a [Gate],
    /// Most entries to read.
    pub max: usize,
}

/// What a stream read got, and what held the rest back.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamClaimed {
    /// What the gates held back.
    pub held: Held,
    /// The gate that let nothing through, if any (`"paused"` when paused).
    pub closed: Option<String>,
    /// The stream's last id when nothing was read though the gates let it: wait for newer.
    pub last: Option<Bytes>,
    /// The `XREADGROUP` reply as fred received it (`Null` when nothing was read).
    pub reply: Reply,
}

impl StreamClaimed {
    /// Whether the pause gate let nothing through.
    pub fn paused(&self) -> bool {
        self.closed.as_deref() == Some(PAUSED)
    }
}

impl Call for StreamRead<'_> {
    type Reply = StreamClaimed;

    fn script(&self) -> &'static Script {
        &READ
    }

    /// KEYS and ARGV: see `stream/read.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut keys = vec![self.stream.to_owned(), self.cancels.to_owned()];
        let mut args: Vec<Value> =
            vec![self.group.into(), self.consumer.into(), lua::int(self.max)];
        for g in self.gates {
            g.push(&mut keys, &mut args);
        }
        (keys, args)
    }

    fn parse(&self, reply: Value) -> StreamClaimed {
        read_stream(value_frame(reply))
    }

    // The trait's `call` with the reply read as a frame; an `async fn` here cannot name the
    // trait's lifetimes (its future must be `Send` for every `&self`).
    #[expect(clippy::manual_async_fn, reason = "see the comment above")]
    fn call(&self, client: &Client) -> impl Future<Output = Result<StreamClaimed>> + Send {
        async move { Ok(read_stream(lua::call_frame(self, client, false).await?)) }
    }
}

/// Reads `read.lua`'s reply `held, wait, closed, last, XREADGROUP reply`.
fn read_stream(reply: Reply) -> StreamClaimed {
    let Some(items) = frame_items(reply) else {
        return StreamClaimed {
            held: Held::default(),
            closed: None,
            last: None,
            reply: Reply::Null,
        };
    };
    let mut items = items.into_iter();
    let held = Held::read(&mut items);
    StreamClaimed {
        held,
        closed: items.next().and_then(text),
        last: items
            .next()
            .and_then(frame_bytes)
            .filter(|id| !id.is_empty()),
        reply: items.next().unwrap_or(Reply::Null),
    }
}

fn text(v: Reply) -> Option<String> {
    frame_bytes(v)
        .filter(|b| !b.is_empty())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}
