//! Delayed entries: listed (`ZRANGE .. WITHSCORES` + `HMGET`), promoted to due now or cancelled
//! (`delayed.lua`).

use std::sync::LazyLock;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::{Error, Headers, Result};
use serde::Serialize;

use super::{Operator, Select, in_batches};
use crate::error::core;
use crate::frame::Frame;
use crate::keys::SourceKeys;
use crate::lua;

static CHANGE: LazyLock<Script> =
    LazyLock::new(|| lua::script(include_str!("delayed.lua"), &[lua::GUARD]));

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
        let (set, payloads) = delayed_keys(self.queue(name)?)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let client = self.conns.pool()?.next().clone();
        let now = super::inspect::server_ms(&client).await?;
        let stop = i64::try_from(limit).unwrap_or(i64::MAX) - 1;
        let scored: Vec<(String, f64)> = client
            .zrange(&set, 0, stop, None, false, None, true)
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
        self.change_delayed(name, "promote", select).await
    }

    /// Removes delayed entries of the subscription `name` (they are never delivered). Returns
    /// how many.
    pub async fn cancel(&self, name: &str, select: &Select) -> Result<usize> {
        self.change_delayed(name, "cancel", select).await
    }

    async fn change_delayed(
        &self,
        name: &str,
        what: &'static str,
        select: &Select,
    ) -> Result<usize> {
        let (set, payloads) = delayed_keys(self.queue(name)?)?;
        let client = self.conns.pool()?.next().clone();
        let keys = vec![set.clone(), payloads];
        let run = |tail: Vec<Value>| {
            let mut args = vec![Value::from_static_str(what)];
            args.extend(tail);
            CHANGE.evalsha_with_reload::<i64, _, _>(&client, keys.clone(), args)
        };
        match select {
            Select::Id(id) => {
                let n = run(vec![Value::from("ids"), Value::from(id.as_str())])
                    .await
                    .map_err(core)?;
                Ok(usize::try_from(n).unwrap_or(0))
            }
            Select::All { limit } => {
                let len: usize = client.zcard(&set).await.map_err(core)?;
                in_batches(len, *limit, |take| {
                    let call = run(vec![Value::from("earliest"), Value::from(take as i64)]);
                    async move { Ok(usize::try_from(call.await.map_err(core)?).unwrap_or(0)) }
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
        _ => Err(Error::config(format!(
            "`{}` is a Pub/Sub subscription: it has no delayed entries",
            q.name
        ))),
    }
}
