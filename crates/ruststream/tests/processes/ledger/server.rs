//! What the ledger run reads off its server, on a direct connection (it goes through no
//! proxy), and the publishing of its jobs.

use crate::harness;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::prelude::*;
use harness::bounded;
use ruststream::prelude::*;
use ruststream::redis::frame::Frame;

use super::worker::{acks, job_of};
use super::{CHUNK, GROUP, Job, LEVELS, QUEUE, RATE, Transport};

// ---------------------------------------------------------------------------------------------
// Looking at the server (a direct connection: it goes through no proxy).

/// Awaits a command, `None` when it fails or takes longer than 5 s (the server may be down).
pub(super) async fn q<T>(f: impl Future<Output = Result<T, fred::error::Error>>) -> Option<T> {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .ok()?
        .ok()
}

pub(super) async fn inspector(url: &str) -> Client {
    let mut config = Config::from_url(url).unwrap();
    config.fail_fast = false;
    let client = Builder::from_config(config)
        .set_policy(ReconnectPolicy::new_constant(0, 100))
        .build()
        .unwrap();
    bounded(
        "the inspector connects",
        Duration::from_secs(10),
        client.init(),
    )
    .await
    .unwrap();
    client
}

pub(super) fn key(suffix: &str) -> String {
    format!("{QUEUE}{suffix}")
}

/// `v` as a number (integer or numeric text).
fn num(v: &Value) -> Option<u64> {
    match v {
        Value::Integer(i) => u64::try_from(*i).ok(),
        other => other.as_str().and_then(|s| s.parse().ok()),
    }
}

/// The field/value pairs of a RESP2 flat array or a RESP3 map.
fn fields(v: Value) -> HashMap<String, Value> {
    match v {
        Value::Map(m) => m
            .inner()
            .into_iter()
            .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v)))
            .collect(),
        Value::Array(items) => {
            let mut out = HashMap::new();
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                if let Some(k) = k.as_str() {
                    out.insert(k.to_string(), v);
                }
            }
            out
        }
        _ => HashMap::new(),
    }
}

/// Every claimed entry: the processing list's values, or the group's pending entry ids.
pub(super) async fn claimed(r: &Client, transport: Transport) -> Option<HashSet<Bytes>> {
    match transport {
        Transport::List | Transport::Levels | Transport::Batch | Transport::Steps => {
            let values: Vec<Bytes> = q(r.lrange(key(".processing"), 0, -1)).await?;
            Some(values.into_iter().collect())
        }
        Transport::Stream => Some(
            pending(r, None)
                .await?
                .into_iter()
                .map(|(id, _)| id)
                .collect(),
        ),
    }
}

/// The group's pending entries `(id, consumer)`, of `consumer` only when given.
pub(super) async fn pending(r: &Client, consumer: Option<&str>) -> Option<Vec<(Bytes, String)>> {
    let mut args: Vec<Value> = vec![QUEUE.into(), GROUP.into(), "-".into(), "+".into()];
    args.push(Value::Integer(1_000_000));
    args.extend(consumer.map(Value::from));
    let reply: Value = q(r.custom(fred::cmd!("XPENDING"), args)).await?;
    let Value::Array(rows) = reply else {
        return Some(Vec::new());
    };
    Some(
        rows.into_iter()
            .filter_map(|row| {
                let Value::Array(row) = row else { return None };
                let id = row.first()?.as_bytes()?.to_vec().into();
                let consumer = row.get(1)?.as_string()?;
                Some((id, consumer))
            })
            .collect(),
    )
}

/// Whether nothing is left to do: the queue, processing list, recovery set, delayed set and
/// payloads are gone (stream: nothing pending, nothing unread, no delayed set). `None`: unknown.
pub(super) async fn drained(r: &Client, transport: Transport) -> Option<bool> {
    match transport {
        Transport::List | Transport::Levels | Transport::Batch | Transport::Steps => {
            let keys = [
                "",
                ".p1",
                ".p2",
                ".processing",
                ".claims",
                ".delayed",
                ".delayed.payloads",
            ];
            let n: i64 = q(r.exists(keys.map(key).to_vec())).await?;
            Some(n == 0)
        }
        Transport::Stream => {
            let n: i64 = q(r.exists(vec![key(".delayed"), key(".delayed.payloads")])).await?;
            let (pending, lag) = group_state(r).await?;
            Some(n == 0 && pending == 0 && lag == 0)
        }
    }
}

/// The stream group's `(pending, lag)` (`XINFO GROUPS`).
pub(super) async fn group_state(r: &Client) -> Option<(u64, u64)> {
    let groups: Value = q(r.custom(fred::cmd!("XINFO"), vec!["GROUPS", QUEUE])).await?;
    let Value::Array(groups) = groups else {
        return None;
    };
    groups.into_iter().map(fields).find_map(|g| {
        (g.get("name")?.as_str()? == GROUP).then_some(())?;
        Some((num(g.get("pending")?)?, num(g.get("lag")?)?))
    })
}

/// The dead letters: `(job id, reason)` (`None` for an entry that is not a job).
pub(super) async fn dead_letters(r: &Client) -> Option<Vec<(Option<u32>, String)>> {
    let values: Vec<Bytes> = q(r.lrange(key(".dead"), 0, -1)).await?;
    Some(
        values
            .into_iter()
            .map(|v| {
                let f = Frame::decode(v);
                let reason = f
                    .headers
                    .get(ruststream::redis::REASON_HEADER)
                    .cloned()
                    .unwrap_or_default();
                (job_of(&f), reason)
            })
            .collect(),
    )
}

/// Ids acked or dead-lettered so far (an estimate while running: the dead letters are counted).
pub(super) async fn progress(r: &Client, ledgers: &[PathBuf]) -> Option<u64> {
    let dead: i64 = q(r.llen(key(".dead"))).await?;
    Some(acks(ledgers).len() as u64 + u64::try_from(dead).unwrap_or(0))
}

/// `CLIENT PAUSE <ms> WRITE`: the server runs no write command until unpaused.
pub(super) async fn pause_writes(r: &Client, ms: u64) {
    let _: Option<Value> = q(r.custom(
        fred::cmd!("CLIENT"),
        vec!["PAUSE".to_owned(), ms.to_string(), "WRITE".to_owned()],
    ))
    .await;
}

pub(super) async fn used_memory(r: &Client) -> u64 {
    let info: String = q(r.custom(fred::cmd!("INFO"), vec!["memory"]))
        .await
        .expect("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

pub(super) async fn config_set(r: &Client, name: &str, value: &str) {
    let _: Value = q(r.custom(fred::cmd!("CONFIG"), vec!["SET", name, value]))
        .await
        .unwrap_or_else(|| panic!("CONFIG SET {name} {value}"));
}

// ---------------------------------------------------------------------------------------------
// Publishing.

/// Publishes jobs `0..n` at [`RATE`] a second, holding `gate` for each publish: a restart or the
/// OOM episode takes it, so no publish is in flight then (a publish retried after a lost reply
/// would duplicate messages; that is the publisher's business, not the consumers').
pub(super) async fn publish_all(
    url: String,
    transport: Transport,
    n: u32,
    gate: Arc<tokio::sync::Mutex<()>>,
    published: Arc<AtomicU64>,
) {
    let mut broker = RedisBroker::standalone(url);
    if transport == Transport::Stream {
        broker = broker.route(QUEUE, stream::Publish::new());
    }
    if transport == Transport::Levels {
        broker = broker.route(QUEUE, list::Publish::new().priorities(LEVELS));
    }
    broker.connect().await.expect("the publisher connects");
    let publisher = broker.publisher();
    let mut tick = tokio::time::interval(Duration::from_millis(u64::from(1000 * CHUNK / RATE)));
    for first in (0..n).step_by(CHUNK as usize) {
        tick.tick().await;
        let jobs: Vec<Job> = (first..(first + CHUNK).min(n)).map(|n| Job { n }).collect();
        let _gate = gate.lock().await;
        let mut chunk = publisher.messages(&jobs).to(QUEUE);
        if transport == Transport::Levels {
            chunk = chunk.priority(u8::try_from(first / CHUNK % u32::from(LEVELS)).unwrap());
        }
        bounded("a publish", Duration::from_secs(30), chunk.publish())
            .await
            .expect("a publish succeeds: the restart and the OOM episode wait for it");
        published.fetch_add(jobs.len() as u64, Ordering::SeqCst);
    }
}
