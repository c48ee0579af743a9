//! The raw baseline: the Redis commands each scenario makes, sent with `fred` directly, pipelined,
//! with no framework. Values are built before the clock starts, so a baseline measures Redis and
//! the client's transport only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fred::prelude::*;
use fred::types::CustomCommand;
use fred::types::lists::LMoveDirection;
use futures::{StreamExt, TryStreamExt};
use ruststream::Headers;
use ruststream::redis::frame::encode_parts;

use crate::common::{Msg, now_ns, per_s};
use crate::{BoxError, GROUP};

mod timed;

pub use self::timed::{PUBSUB_BUFFER, latency, paced, pubsub};

/// Commands per pipeline (and list values per `LPUSH`) when filling.
const FILL_CHUNK: usize = 1000;
/// Pipelines or multi-value commands in flight at once.
const DEPTH: usize = 8;

/// What one baseline run measured.
#[derive(Debug, Default)]
pub struct Out {
    /// Messages per second of the measured phase.
    pub per_s: f64,
    /// Messages the consumer saw.
    pub seen: u64,
    /// Latency quantiles in µs (p50, p99, p999), when measured.
    pub lat_us: Option<(u32, u32, u32)>,
}

/// A connected client.
pub async fn client(url: &str) -> Result<Client, BoxError> {
    let client = Builder::from_config(Config::from_url(url)?).build()?;
    client.init().await?;
    Ok(client)
}

pub fn cmd(name: &'static str) -> CustomCommand {
    CustomCommand::new_static(name, fred::types::ClusterHash::FirstKey, false)
}

/// A list value as the publisher frames it: id, attempt, no headers, the JSON payload.
pub fn frame(id: u64, stamp_ns: u64) -> Bytes {
    let json = serde_json::to_vec(&Msg::new(id, stamp_ns)).expect("a Msg encodes");
    encode_parts(&msg_id(id), 1, &Headers::new(), &json)
}

/// A message id the length of a UUID, as the publisher makes them.
fn msg_id(id: u64) -> String {
    format!("00000000-0000-7000-8000-{id:012x}")
}

pub fn frames(n: u64) -> Vec<Bytes> {
    (0..n).map(|i| frame(i, 0)).collect()
}

pub fn bytes_of(v: Value) -> Option<Bytes> {
    match v {
        Value::Bytes(b) => Some(b),
        Value::String(s) => Some(s.into_inner()),
        _ => None,
    }
}

fn values_of(v: Value) -> Vec<Bytes> {
    match v {
        Value::Array(items) => items.into_iter().filter_map(bytes_of).collect(),
        other => bytes_of(other).into_iter().collect(),
    }
}

/// `LPUSH key` the values, `FILL_CHUNK` per command, `DEPTH` commands in flight.
pub async fn lpush_all(c: &Client, key: &str, values: Vec<Bytes>) -> Result<Duration, BoxError> {
    let chunks: Vec<Vec<Bytes>> = values.chunks(FILL_CHUNK).map(<[Bytes]>::to_vec).collect();
    let t0 = Instant::now();
    futures::stream::iter(chunks)
        .map(|chunk| c.lpush::<i64, _, _>(key, chunk))
        .buffer_unordered(DEPTH)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(t0.elapsed())
}

/// Raw publish, batch form: `LPUSH` of 1000 values, 8 in flight.
pub async fn publish_batch(c: &Client, key: &str, n: u64) -> Result<Out, BoxError> {
    let values = frames(n);
    let elapsed = lpush_all(c, key, values).await?;
    Ok(Out {
        per_s: per_s(n, elapsed),
        seen: n,
        lat_us: None,
    })
}

/// Raw publish, single form: 64 tasks each `LPUSH`ing one value at a time on one client
/// (fred pipelines concurrent commands on its connection).
pub async fn publish_single(c: &Client, key: &str, n: u64) -> Result<Out, BoxError> {
    let values = Arc::new(frames(n));
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (c, values, next, key) = (c.clone(), values.clone(), next.clone(), key.to_owned());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(v) = usize::try_from(i).ok().and_then(|i| values.get(i)) else {
                        break;
                    };
                    c.lpush::<i64, _, _>(&key, v.clone()).await?;
                }
                Ok::<(), fred::error::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(Out {
        per_s: per_s(n, t0.elapsed()),
        seen: n,
        lat_us: None,
    })
}

/// Raw simple list: pipelines of 4 × `RPOP key batch` until the list is empty.
pub async fn simple(c: &Client, key: &str, n: u64, batch: usize) -> Result<Out, BoxError> {
    lpush_all(c, key, frames(n)).await?;
    let t0 = Instant::now();
    let mut seen = 0;
    loop {
        let p = c.pipeline();
        for _ in 0..4 {
            let () = p.rpop(key, Some(batch)).await?;
        }
        let replies: Vec<Value> = p.all().await?;
        let got: u64 = replies.into_iter().map(|v| values_of(v).len() as u64).sum();
        if got == 0 {
            break;
        }
        seen += got;
    }
    Ok(Out {
        per_s: per_s(seen, t0.elapsed()),
        seen,
        lat_us: None,
    })
}

/// Raw reliable list, optionally with a recovery set: each round trip is one pipeline that
/// settles the previous claims (`ZREM` + `LREM processing -1 v`) and claims up to `batch`
/// (`LMOVE queue processing RIGHT LEFT`, then `ZADD set now member` in the next pipeline).
pub async fn reliable(
    c: &Client,
    key: &str,
    n: u64,
    batch: usize,
    recovery: bool,
) -> Result<Out, BoxError> {
    lpush_all(c, key, frames(n)).await?;
    let processing = format!("{key}.processing");
    let zset = format!("{key}.claims");
    let t0 = Instant::now();
    let mut seen = 0;
    let mut prev: Vec<Bytes> = Vec::new();
    let mut seq = 0u64;
    loop {
        let p = c.pipeline();
        let mut skip = 0;
        let members: Vec<Bytes> = prev
            .iter()
            .map(|v| {
                seq += 1;
                let mut m = format!("reader:{seq}:").into_bytes();
                m.extend_from_slice(v);
                Bytes::from(m)
            })
            .collect();
        if recovery && !prev.is_empty() {
            let pairs: Vec<(f64, Bytes)> = members.iter().map(|m| (1.0, m.clone())).collect();
            let () = p.zadd(&zset, None, None, false, false, pairs).await?;
            skip += 1;
        }
        for (v, m) in prev.iter().zip(&members) {
            if recovery {
                let () = p.zrem(&zset, m.clone()).await?;
                skip += 1;
            }
            let () = p.lrem(&processing, -1, v.clone()).await?;
            skip += 1;
        }
        for _ in 0..batch {
            let () = p
                .lmove(
                    key,
                    &processing,
                    LMoveDirection::Right,
                    LMoveDirection::Left,
                )
                .await?;
        }
        let replies: Vec<Value> = p.all().await?;
        prev = replies
            .into_iter()
            .skip(skip)
            .filter_map(bytes_of)
            .collect();
        if prev.is_empty() {
            break;
        }
        seen += prev.len() as u64;
    }
    Ok(Out {
        per_s: per_s(seen, t0.elapsed()),
        seen,
        lat_us: None,
    })
}

/// Raw stream: `XADD` pipelined to fill; then per round trip one pipeline of `XACK` for the
/// previous entries and `XREADGROUP .. COUNT batch .. >`.
pub async fn stream(c: &Client, key: &str, n: u64, batch: usize) -> Result<Out, BoxError> {
    let _: Value = c
        .custom(cmd("XGROUP"), vec!["CREATE", key, GROUP, "0", "MKSTREAM"])
        .await?;
    let payloads: Vec<(String, Bytes)> = (0..n)
        .map(|i| {
            let json = serde_json::to_vec(&Msg::new(i, 0)).expect("a Msg encodes");
            (msg_id(i), Bytes::from(json))
        })
        .collect();
    for chunk in payloads.chunks(FILL_CHUNK) {
        let p = c.pipeline();
        for (id, json) in chunk {
            let args: Vec<Value> = vec![
                key.into(),
                "*".into(),
                "payload".into(),
                Value::Bytes(json.clone()),
                "rs.id".into(),
                id.as_str().into(),
            ];
            let () = p.custom(cmd("XADD"), args).await?;
        }
        let _: Vec<Value> = p.all().await?;
    }
    let t0 = Instant::now();
    let mut seen = 0;
    let mut prev: Vec<Bytes> = Vec::new();
    loop {
        let p = c.pipeline();
        let acking = !prev.is_empty();
        if acking {
            let mut args: Vec<Value> = vec![key.into(), GROUP.into()];
            args.extend(prev.drain(..).map(Value::Bytes));
            let () = p.custom(cmd("XACK"), args).await?;
        }
        let args: Vec<Value> = vec![
            "GROUP".into(),
            GROUP.into(),
            "raw".into(),
            "COUNT".into(),
            Value::Integer(i64::try_from(batch).unwrap_or(i64::MAX)),
            "STREAMS".into(),
            key.into(),
            ">".into(),
        ];
        let () = p
            .custom(
                CustomCommand::new_static("XREADGROUP", fred::types::ClusterHash::Offset(6), false),
                args,
            )
            .await?;
        let mut replies: Vec<Value> = p.all().await?;
        prev = replies.pop().map(stream_ids).unwrap_or_default();
        if prev.is_empty() {
            break;
        }
        seen += prev.len() as u64;
    }
    Ok(Out {
        per_s: per_s(seen, t0.elapsed()),
        seen,
        lat_us: None,
    })
}

/// The entry ids of an `XREADGROUP` reply (RESP2 arrays or RESP3 maps).
fn stream_ids(reply: Value) -> Vec<Bytes> {
    let streams: Vec<Value> = match reply {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|s| match s {
                Value::Array(mut kv) if kv.len() == 2 => kv.pop(),
                _ => None,
            })
            .collect(),
        Value::Map(map) => map.inner().into_values().collect(),
        _ => Vec::new(),
    };
    let mut ids = Vec::new();
    for entries in streams {
        if let Value::Array(entries) = entries {
            for e in entries {
                if let Value::Array(mut parts) = e
                    && !parts.is_empty()
                    && let Some(id) = bytes_of(parts.swap_remove(0))
                {
                    ids.push(id);
                }
            }
        }
    }
    ids
}

/// Raw delayed: `ZADD` + `HSET` to fill, every entry due at `due_ns`; after it is due, per batch:
/// `ZRANGEBYSCORE set -inf now LIMIT 0 batch`, `HMGET`, then one pipeline of `RPUSH queue`,
/// `HDEL`, `ZREM`, the previous batch's `LREM`s and `LMOVE` × batch.
pub async fn delayed(
    c: &Client,
    key: &str,
    n: u64,
    batch: usize,
    due_ms: u64,
) -> Result<Out, BoxError> {
    let zset = format!("{key}.delayed");
    let hash = format!("{key}.delayed.payloads");
    let processing = format!("{key}.processing");
    let values = frames(n);
    #[allow(clippy::cast_precision_loss)]
    let score = due_ms as f64;
    for (i, chunk) in values.chunks(FILL_CHUNK).enumerate() {
        let first = i * FILL_CHUNK;
        let ids: Vec<String> = (first..first + chunk.len())
            .map(|j| msg_id(j as u64))
            .collect();
        let p = c.pipeline();
        let pairs: Vec<(f64, String)> = ids.iter().map(|id| (score, id.clone())).collect();
        let () = p.zadd(&zset, None, None, false, false, pairs).await?;
        let fields: Vec<(String, Bytes)> = ids.into_iter().zip(chunk.iter().cloned()).collect();
        let () = p.hset(&hash, fields).await?;
        let _: Vec<Value> = p.all().await?;
    }
    let wait = due_ms.saturating_mul(1_000_000).saturating_sub(now_ns());
    tokio::time::sleep(Duration::from_nanos(wait)).await;
    let t0 = Instant::now();
    let mut seen = 0;
    let mut prev: Vec<Bytes> = Vec::new();
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    loop {
        let now_ms = i64::try_from(now_ns() / 1_000_000).unwrap_or(i64::MAX);
        let ids: Vec<String> = c
            .zrangebyscore(&zset, "-inf", now_ms, false, Some((0, limit)))
            .await?;
        let p = c.pipeline();
        let mut skip = prev.len();
        for v in prev.drain(..) {
            let () = p.lrem(&processing, -1, v).await?;
        }
        if !ids.is_empty() {
            let vals: Vec<Value> = c.hmget(&hash, ids.clone()).await?;
            let vals: Vec<Bytes> = vals.into_iter().filter_map(bytes_of).collect();
            let () = p.rpush(key, vals).await?;
            let () = p.hdel(&hash, ids.clone()).await?;
            let () = p.zrem(&zset, ids.clone()).await?;
            skip += 3;
            for _ in 0..ids.len() {
                let () = p
                    .lmove(
                        key,
                        &processing,
                        LMoveDirection::Right,
                        LMoveDirection::Left,
                    )
                    .await?;
            }
        }
        if skip == 0 {
            break;
        }
        let replies: Vec<Value> = p.all().await?;
        prev = replies
            .into_iter()
            .skip(skip)
            .filter_map(bytes_of)
            .collect();
        seen += prev.len() as u64;
        if ids.is_empty() && prev.is_empty() {
            break;
        }
    }
    Ok(Out {
        per_s: per_s(seen, t0.elapsed()),
        seen,
        lat_us: None,
    })
}
