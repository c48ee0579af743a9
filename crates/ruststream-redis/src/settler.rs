//! Settling: what happens to entries once their handlers are done, one round trip per batch.
//!
//! Measured: acks of a reliable list as pipelined `LREM`s cost the client (fred, per command)
//! twice what the script costs Redis, so they stay in the script; a stream's acks are one
//! `XACK` with many ids, cheaper than the script on both sides.
//!
//! Reliable lists: `SETTLE_LIST` (ack `LREM`, retry `LPUSH`, retry later `ZADD`+`HSET` into the
//! delayed set, dead `LPUSH K.dead`; with recovery, each only while the claim's member is still
//! in the set). Streams: plain acks are one `XACK key group id...`; the rest `SETTLE_STREAM` (`XACK`, then `XADD` / delayed set / dead letters).
//! Simple lists popped their entries already, and Pub/Sub channels store nothing: for both, only
//! dead letters are pushed (`LPUSH`). A Pub/Sub retry arrives here as a dead letter with reason
//! [`NO_REDELIVERY`](crate::pubsub::NO_REDELIVERY): the core turns it into one
//! (`BrokerSource::no_redelivery`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::{Headers, Result, Settlement, Settler};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::core;
use crate::frame::{Frame, encode_parts};
use crate::reader::{Token, lock};
use crate::scripts;
use crate::stream::{ATTEMPT_FIELD, ID_FIELD, PAYLOAD_FIELD};

/// The header a dead letter's reason is stored under.
pub const REASON_HEADER: &str = "reason";

/// Settles the entries of one subscription.
#[derive(Clone)]
pub struct RedisSettler {
    pool: Pool,
    kind: Arc<SettleKind>,
}

pub(crate) enum SettleKind {
    /// A simple list or a Pub/Sub channel: nothing to acknowledge, dead letters to push.
    Simple { dead: Option<String> },
    Reliable {
        /// Queue, processing, dead (or the queue as a stand-in), delayed, payloads[, recovery].
        keys: Vec<String>,
        has_dead: bool,
        /// The reader's next-due time and wake-up, so a retry is not slept through.
        next_due: Option<(Arc<Mutex<Instant>>, Arc<Notify>)>,
    },
    Stream {
        /// Stream, dead (or the stream as a stand-in), delayed, payloads.
        keys: Vec<String>,
        group: String,
        has_dead: bool,
        /// The reader's next-due time and wake-up, so a retry is not slept through.
        next_due: Option<(Arc<Mutex<Instant>>, Arc<Notify>)>,
    },
}

impl RedisSettler {
    pub(crate) fn new(pool: Pool, kind: SettleKind) -> Self {
        Self {
            pool,
            kind: Arc::new(kind),
        }
    }
}

fn dead_frame(t: &Token, reason: &str) -> Bytes {
    let mut headers: Headers = t.frame.headers.clone();
    headers.insert(REASON_HEADER.to_owned(), reason.to_owned());
    encode_parts(&t.frame.id, t.frame.attempt, &headers, &t.frame.payload)
}

fn retry_frame(t: &Token) -> Bytes {
    encode_parts(
        &t.frame.id,
        t.frame.attempt.saturating_add(1),
        &t.frame.headers,
        &t.frame.payload,
    )
}

fn delay_arg(d: Duration, t: &Token) -> Value {
    Value::from(format!("{}:{}", d.as_millis(), t.frame.id))
}

/// Tells the reader that a retry is due after `d` and wakes it, so it does not wait past it.
fn note_due(next_due: Option<&(Arc<Mutex<Instant>>, Arc<Notify>)>, d: Option<Duration>) {
    if let (Some((next_due, wake)), Some(d)) = (next_due, d) {
        let at = Instant::now() + d;
        let mut next = lock(next_due);
        if at < *next {
            *next = at;
            wake.notify_one();
        }
    }
}

impl Settler for RedisSettler {
    type Token = Token;

    async fn settle(&self, batch: &[(Token, Settlement)]) -> Result<()> {
        let client = self.pool.next();
        match &*self.kind {
            SettleKind::Simple { dead } => {
                let dead_letters: Vec<Value> = batch
                    .iter()
                    .filter_map(|(t, s)| match s {
                        Settlement::Dead { reason } => Some(Value::Bytes(dead_frame(t, reason))),
                        _ => None,
                    })
                    .collect();
                match dead {
                    _ if dead_letters.is_empty() => {}
                    Some(dead) => {
                        let _: i64 = client.lpush(dead, dead_letters).await.map_err(core)?;
                    }
                    None => tracing::error!(
                        messages = dead_letters.len(),
                        "no dead-letter list: unacknowledged messages discarded"
                    ),
                }
                Ok(())
            }
            SettleKind::Reliable {
                keys,
                has_dead,
                next_due,
            } => {
                let mut args = Vec::with_capacity(batch.len() * 5);
                let mut earliest: Option<Duration> = None;
                for (t, s) in batch {
                    let (op, new, arg) = match s {
                        Settlement::Ack => ("a", Bytes::new(), Value::from_static_str("")),
                        Settlement::Dead { .. } if !has_dead => {
                            ("a", Bytes::new(), Value::from_static_str(""))
                        }
                        Settlement::Dead { reason } => {
                            ("x", dead_frame(t, reason), Value::from_static_str(""))
                        }
                        Settlement::Retry { delay: None } => {
                            ("r", retry_frame(t), Value::from_static_str(""))
                        }
                        Settlement::Retry { delay: Some(d) } => {
                            earliest = Some(earliest.map_or(*d, |e| e.min(*d)));
                            ("d", retry_frame(t), delay_arg(*d, t))
                        }
                    };
                    args.extend([
                        Value::from_static_str(op),
                        Value::Bytes(t.raw.clone()),
                        Value::Bytes(new),
                        arg,
                        t.member
                            .clone()
                            .map_or_else(|| Value::from_static_str(""), Value::Bytes),
                    ]);
                }
                let _: i64 = scripts::SETTLE_LIST
                    .evalsha_with_reload(client, keys.clone(), args)
                    .await
                    .map_err(core)?;
                note_due(next_due.as_ref(), earliest);
                Ok(())
            }
            SettleKind::Stream {
                keys,
                group,
                has_dead,
                next_due,
            } => {
                let mut args: Vec<Value> = vec![group.as_str().into()];
                // Plain acks: one `XACK key group id...` command, no script.
                let mut acks: Vec<Value> = vec![keys[0].as_str().into(), group.as_str().into()];
                let mut earliest: Option<Duration> = None;
                for (t, s) in batch {
                    let id = Value::Bytes(t.raw.clone());
                    let s = match s {
                        Settlement::Dead { .. } if !has_dead => &Settlement::Ack,
                        s => s,
                    };
                    match s {
                        Settlement::Ack => acks.push(id),
                        Settlement::Dead { reason } => {
                            let frame = Value::Bytes(dead_frame(t, reason));
                            args.extend([
                                Value::from_static_str("x"),
                                id,
                                Value::Integer(1),
                                frame,
                            ]);
                        }
                        Settlement::Retry { delay: None } => {
                            let fields = stream_fields(&t.frame, t.frame.attempt.saturating_add(1));
                            let n = Value::Integer(i64::try_from(fields.len()).unwrap_or(0));
                            args.extend([Value::from_static_str("r"), id, n]);
                            args.extend(fields);
                        }
                        Settlement::Retry { delay: Some(d) } => {
                            earliest = Some(earliest.map_or(*d, |e| e.min(*d)));
                            let frame = Value::Bytes(retry_frame(t));
                            args.extend([
                                Value::from_static_str("d"),
                                id,
                                Value::Integer(2),
                                delay_arg(*d, t),
                                frame,
                            ]);
                        }
                    }
                }
                let script = async {
                    if args.len() == 1 {
                        return Ok(());
                    }
                    let _: i64 = scripts::SETTLE_STREAM
                        .evalsha_with_reload(client, keys.clone(), args)
                        .await?;
                    Ok(())
                };
                let xack = async {
                    if acks.len() == 2 {
                        return Ok(());
                    }
                    let _: i64 = client.custom(fred::cmd!("XACK"), acks).await?;
                    Ok::<(), fred::error::Error>(())
                };
                let (script, xack) = tokio::join!(script, xack);
                script.and(xack).map_err(core)?;
                note_due(next_due.as_ref(), earliest);
                Ok(())
            }
        }
    }
}

/// A frame as stream fields: `payload`, `rs.id`, `rs.attempt`, then the headers.
pub(crate) fn stream_fields(frame: &Frame, attempt: u32) -> Vec<Value> {
    let mut f = vec![
        Value::from_static_str(PAYLOAD_FIELD),
        Value::Bytes(frame.payload.clone()),
        Value::from_static_str(ID_FIELD),
        Value::from(frame.id.as_str()),
        Value::from_static_str(ATTEMPT_FIELD),
        Value::from(attempt.to_string()),
    ];
    for (k, v) in &frame.headers {
        f.push(Value::from(k.as_str()));
        f.push(Value::from(v.as_str()));
    }
    f
}
