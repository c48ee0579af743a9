//! Delayed entries: listed (`ZRANGE .. WITHSCORES` + `HMGET`), promoted to due now or cancelled
//! (`delayed.lua`).

use std::sync::LazyLock;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::{ConfigError, Headers, Result};
use serde::Serialize;

use super::{Operator, Select, in_batches};
use crate::error::core;
use crate::frame::Frame;
use crate::keys::SourceKeys;
use crate::lua::{self, Call};

static CHANGE: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("delayed.lua")));

/// What an operator's change does to delayed entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayedChange {
    /// The entries become due now (readers move them to the queue at once).
    Promote,
    /// The entries leave the delayed set and their payloads the hash.
    Cancel,
}

/// Which delayed entries a change applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayedPick<'a> {
    /// The earliest this many (at most 1,000; a promote takes those not yet due).
    Earliest(usize),
    /// The entries with these message ids.
    Ids(&'a [&'a str]),
}

/// One call of `operate/delayed.lua`: promotes or cancels delayed entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeDelayed<'a> {
    /// The delayed set (full name).
    pub set: &'a str,
    /// The delayed payload hash (full name).
    pub payloads: &'a str,
    /// What the change does.
    pub change: DelayedChange,
    /// Which entries it applies to.
    pub pick: DelayedPick<'a>,
}

impl Call for ChangeDelayed<'_> {
    /// How many entries were changed.
    type Reply = usize;

    fn script(&self) -> &'static Script {
        &CHANGE
    }

    /// KEYS and ARGV: see `operate/delayed.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let change = match self.change {
            DelayedChange::Promote => "promote",
            DelayedChange::Cancel => "cancel",
        };
        let mut args = vec![Value::from_static_str(change)];
        match self.pick {
            DelayedPick::Earliest(n) => {
                args.push(Value::from_static_str("earliest"));
                args.push(lua::int(n));
            }
            DelayedPick::Ids(ids) => {
                args.push(Value::from_static_str("ids"));
                args.extend(ids.iter().map(|id| Value::from(*id)));
            }
        }
        (vec![self.set.to_owned(), self.payloads.to_owned()], args)
    }

    fn parse(&self, reply: Value) -> usize {
        usize::try_from(lua::reply_u64(&reply)).unwrap_or(0)
    }
}

/// One delayed entry.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DelayedEntry {
    /// The message id.
    pub id: String,
    /// When it is due, in ms since the epoch.
    pub due_ms: i64,
    /// In how many ms it is due (negative: overdue, waiting for a reader to move it).
    pub due_in_ms: i64,
    /// The delivery it will be.
    pub attempt: u32,
    /// Its headers.
    pub headers: Headers,
    /// The payload: JSON when it parses as JSON, else its text, else a note of its size.
    pub payload: serde_json::Value,
}

impl Operator {
    /// The `limit` earliest delayed entries of the subscription `name`, earliest first.
    pub async fn delayed(&self, name: &str, limit: usize) -> Result<Vec<DelayedEntry>> {
        self.delayed_from(name, 0, limit).await
    }

    /// The `limit` delayed entries of the subscription `name` after the `offset` earliest,
    /// earliest first (a page of them).
    pub async fn delayed_from(
        &self,
        name: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<DelayedEntry>> {
        let (set, payloads) = delayed_keys(self.queue(name)?)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let client = self.conns.pool()?.next().clone();
        let now = super::inspect::server_ms(&client).await?;
        let start = i64::try_from(offset).unwrap_or(i64::MAX);
        let stop = start.saturating_add(i64::try_from(limit).unwrap_or(i64::MAX) - 1);
        let scored: Vec<(String, f64)> = client
            .zrange(&set, start, stop, None, false, None, true)
            .await
            .map_err(core)?;
        if scored.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = scored.iter().map(|(id, _)| id.as_str()).collect();
        let frames: Vec<Option<Bytes>> = client.hmget(&payloads, ids).await.map_err(core)?;
        Ok(scored
            .into_iter()
            .zip(frames)
            .map(|((id, score), frame)| {
                #[allow(clippy::cast_possible_truncation)]
                let due_ms = score as i64;
                let frame = frame.map(Frame::decode);
                DelayedEntry {
                    id,
                    due_ms,
                    due_in_ms: due_ms - now,
                    attempt: frame.as_ref().map_or(0, |f| f.attempt),
                    headers: frame
                        .as_ref()
                        .map(|f| f.headers.clone())
                        .unwrap_or_default(),
                    payload: frame.map_or(serde_json::Value::Null, |f| {
                        super::dead::payload_view(&f.payload)
                    }),
                }
            })
            .collect())
    }

    /// Makes delayed entries of the subscription `name` due now; readers move them to the
    /// queue at once. Returns how many.
    pub async fn promote(&self, name: &str, select: &Select) -> Result<usize> {
        self.change_delayed(name, DelayedChange::Promote, select)
            .await
    }

    /// Removes delayed entries of the subscription `name` (they are never delivered). Returns
    /// how many.
    pub async fn cancel(&self, name: &str, select: &Select) -> Result<usize> {
        self.change_delayed(name, DelayedChange::Cancel, select)
            .await
    }

    async fn change_delayed(
        &self,
        name: &str,
        change: DelayedChange,
        select: &Select,
    ) -> Result<usize> {
        let (set, payloads) = delayed_keys(self.queue(name)?)?;
        let client = self.conns.pool()?.next().clone();
        let call = |pick| ChangeDelayed {
            set: &set,
            payloads: &payloads,
            change,
            pick,
        };
        match select {
            Select::Id(id) => call(DelayedPick::Ids(&[id.as_str()])).call(&client).await,
            Select::All { limit } => {
                let len: usize = client.zcard(&set).await.map_err(core)?;
                in_batches(len, *limit, |take| {
                    let call = call(DelayedPick::Earliest(take));
                    let client = &client;
                    async move { call.call(client).await }
                })
                .await
            }
        }
    }
}

/// The delayed set and payload hash of `q`, or an error for Pub/Sub.
fn delayed_keys(q: &SourceKeys) -> Result<(String, String)> {
    match (&q.delayed, &q.delayed_payloads) {
        (Some(set), Some(payloads)) => Ok((set.clone(), payloads.clone())),
        _ => Err(ConfigError::new(
            "delayed",
            "it is a Pub/Sub subscription: it has no delayed entries",
            "look at the delayed entries of a list queue or a stream",
        )
        .on(&q.name)
        .into()),
    }
}
