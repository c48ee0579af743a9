//! Reading and settling: the receiver and settler of one subscription.
//!
//! Simple list: `RPOP key n`; when empty, `BRPOP key t`; delayed publishes are moved back by
//! `MOVE_DUE` before popping, as for reliable lists. Reliable list: the `CLAIM` script
//! (`LMOVE` ×n); when empty, `BLMOVE key key RIGHT RIGHT t`, which moves nothing but wakes when an
//! entry arrives; due retries are moved back by `MOVE_DUE` before claiming. Stream:
//! `XREADGROUP .. BLOCK`. Settles: `SETTLE_LIST` / `SETTLE_STREAM`, one script call per batch;
//! simple lists only push dead letters (`LPUSH`).
//!
//! Blocking reads run on the subscription's own client, in fred's `Interrupt` mode: on stop, a
//! `PING` on that client makes fred send `CLIENT UNBLOCK`, so shutdown does not wait for the block
//! timeout, and whatever the read returned is still handled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::ClusterHash;
use fred::types::lists::LMoveDirection;
use ruststream_core::{
    Delivery, DeliveryInfo, Error, Headers, Receiver, Result, Settlement, Settler,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::broker::RedisSource;
use crate::error::core;
use crate::frame::{Frame, encode_parts};
use crate::list::{Mode, delayed_keys};
use crate::publish::new_id;
use crate::stream::{ATTEMPT_FIELD, ID_FIELD, PAYLOAD_FIELD};
use crate::{RedisBroker, scripts};

/// The header a dead letter's reason is stored under.
pub const REASON_HEADER: &str = "reason";

/// Most due retries moved back per read.
const MOVE_BATCH: u32 = 128;

/// How often an idle reliable reader looks for due entries scheduled by others.
const DUE_POLL: Duration = Duration::from_secs(1);

/// What the settler needs of one delivered entry.
#[derive(Debug)]
pub struct Token {
    /// The list value as claimed (for `LREM`), or the stream entry id.
    raw: Bytes,
    /// The decoded entry, its id filled in.
    frame: Frame,
    /// The claim's member in the recovery set, when there is one.
    member: Option<Bytes>,
}

/// The receiver of one Redis subscription.
pub struct RedisReceiver {
    client: Client,
    stop: CancellationToken,
    source: Arc<str>,
    kind: Kind,
    settler: RedisSettler,
}

/// A reliable list's recovery set, and this reader's identity in it.
struct Recovery {
    zset: String,
    min_idle_ms: u64,
    ttl_ms: u64,
    reader_id: String,
    seq: AtomicU64,
}

/// Most stale claims one read moves back to the queue (seed 000).
pub const RECOVER_BATCH: u32 = 128;

enum Kind {
    Simple {
        key: String,
        block: Duration,
        next_due: Mutex<Instant>,
    },
    Reliable {
        key: String,
        processing: String,
        block: Duration,
        next_due: Arc<Mutex<Instant>>,
        recovery: Option<Recovery>,
    },
    Stream {
        key: String,
        group: String,
        consumer: String,
        block_ms: u64,
    },
}

impl RedisReceiver {
    pub(crate) async fn open(
        broker: &RedisBroker,
        source: &RedisSource,
        stop: CancellationToken,
    ) -> Result<Self> {
        let client = broker.reader_client().await?;
        let pool = broker.pool()?;
        let (source_name, kind, settle) = match source {
            RedisSource::List(l) => {
                let key = broker.key(&l.key);
                let dead = l.dead_letter_key().map(|k| broker.key(&k));
                match l.mode {
                    Mode::Simple => (
                        l.key.clone(),
                        Kind::Simple {
                            key,
                            block: l.block,
                            next_due: Mutex::new(Instant::now()),
                        },
                        SettleKind::Simple { dead },
                    ),
                    Mode::Reliable => {
                        let processing = broker.key(&l.processing_key());
                        let (delayed, payloads) = delayed_keys(&key);
                        let next_due = Arc::new(Mutex::new(Instant::now()));
                        let recovery = l.recovery_zset.as_ref().map(|z| Recovery {
                            zset: broker.key(z),
                            min_idle_ms: millis(l.min_idle.unwrap_or_default()),
                            ttl_ms: l.recovery_ttl.map_or(0, millis),
                            reader_id: uuid::Uuid::now_v7().simple().to_string(),
                            seq: AtomicU64::new(0),
                        });
                        let mut keys = vec![
                            key.clone(),
                            processing.clone(),
                            dead.unwrap_or_else(|| key.clone()),
                            delayed,
                            payloads,
                        ];
                        if let Some(r) = &recovery {
                            keys.push(r.zset.clone());
                        }
                        (
                            l.key.clone(),
                            Kind::Reliable {
                                key,
                                processing,
                                block: l.block,
                                next_due: next_due.clone(),
                                recovery,
                            },
                            SettleKind::Reliable {
                                keys,
                                has_dead: l.dead_letter_key().is_some(),
                                next_due,
                            },
                        )
                    }
                }
            }
            RedisSource::Stream(s) => {
                let key = broker.key(&s.key);
                let consumer = s.consumer.clone().unwrap_or_else(consumer_name);
                let dead = s.dead_letter_key().map(|k| broker.key(&k));
                (
                    s.key.clone(),
                    Kind::Stream {
                        key: key.clone(),
                        group: s.group_name().to_owned(),
                        consumer,
                        block_ms: u64::try_from(s.block.as_millis())
                            .unwrap_or(u64::MAX)
                            .max(1),
                    },
                    SettleKind::Stream {
                        keys: vec![key.clone(), dead.clone().unwrap_or(key)],
                        group: s.group_name().to_owned(),
                        has_dead: dead.is_some(),
                    },
                )
            }
        };
        Ok(Self {
            client,
            stop,
            source: source_name.into(),
            kind,
            settler: RedisSettler {
                pool,
                kind: Arc::new(settle),
            },
        })
    }

    /// Runs a blocking read; on stop, interrupts it and still returns what it read.
    async fn blocking<T>(
        &self,
        read: impl Future<Output = Result<T, fred::error::Error>>,
    ) -> Result<T> {
        tokio::pin!(read);
        tokio::select! {
            r = &mut read => return r.map_err(core),
            () = self.stop.cancelled() => {}
        }
        let client = self.client.clone();
        let interrupt = async move {
            let _: Result<(), _> = client.ping(None).await;
        };
        let (r, ()) = tokio::join!(read, interrupt);
        r.map_err(core)
    }

    fn delivery(&self, raw: Bytes, frame: Frame) -> Delivery<Token> {
        let mut frame = frame;
        if frame.id.is_empty() {
            frame.id = new_id();
        }
        Delivery {
            info: DeliveryInfo::new(
                frame.id.clone(),
                frame.attempt,
                self.source.clone(),
                frame.headers.clone(),
            ),
            payload: frame.payload.clone(),
            token: Token {
                raw,
                frame,
                member: None,
            },
        }
    }

    fn list_deliveries(&self, values: Vec<Bytes>) -> Vec<Delivery<Token>> {
        values
            .into_iter()
            .map(|raw| {
                let frame = Frame::decode(raw.clone());
                self.delivery(raw, frame)
            })
            .collect()
    }

    async fn receive_simple(
        &self,
        key: &str,
        block: Duration,
        next_due: &Mutex<Instant>,
        max: usize,
    ) -> Result<Vec<Delivery<Token>>> {
        // Delayed publishes (`.delay(..)`) wait in `K.delayed` whatever the consumer's mode.
        self.move_due(key, next_due).await?;
        let popped: Value = self.client.rpop(key, Some(max)).await.map_err(core)?;
        let mut values = bytes_array(popped);
        if values.is_empty() && !self.stop.is_cancelled() {
            let until_due = lock(next_due).saturating_duration_since(Instant::now());
            let wait = block.min(until_due).max(Duration::from_millis(10));
            let got: Value = self
                .blocking(self.client.brpop(key, wait.as_secs_f64()))
                .await?;
            if let Value::Array(mut kv) = got
                && kv.len() == 2
                && let Some(v) = kv.pop().and_then(value_bytes)
            {
                values.push(v);
            }
        }
        Ok(self.list_deliveries(values))
    }

    async fn receive_reliable(
        &self,
        key: &str,
        processing: &str,
        block: Duration,
        next_due: &Mutex<Instant>,
        recovery: Option<&Recovery>,
        max: usize,
    ) -> Result<Vec<Delivery<Token>>> {
        self.move_due(key, next_due).await?;
        let claimed = self.claim(key, processing, recovery, max).await?;
        if !claimed.is_empty() || self.stop.is_cancelled() {
            return Ok(claimed);
        }
        let until_due = lock(next_due).saturating_duration_since(Instant::now());
        let mut wait = block.min(until_due);
        if let Some(r) = recovery {
            // Wake in time to sweep claims that go stale while the queue is empty.
            wait = wait.min(Duration::from_millis(r.min_idle_ms));
        }
        let _: Value = self
            .blocking(self.client.blmove(
                key,
                key,
                LMoveDirection::Right,
                LMoveDirection::Right,
                wait.max(Duration::from_millis(10)).as_secs_f64(),
            ))
            .await?;
        self.move_due(key, next_due).await?;
        self.claim(key, processing, recovery, max).await
    }

    /// One `CLAIM` script call: sweep stale claims (with recovery), then claim up to `max`.
    async fn claim(
        &self,
        key: &str,
        processing: &str,
        recovery: Option<&Recovery>,
        max: usize,
    ) -> Result<Vec<Delivery<Token>>> {
        let mut keys = vec![key.to_owned(), processing.to_owned()];
        let max_i = i64::try_from(max).unwrap_or(i64::MAX);
        let (args, first_seq): (Vec<Value>, u64) = match recovery {
            None => (vec![Value::Integer(max_i), Value::from_static_str("")], 0),
            Some(r) => {
                keys.push(r.zset.clone());
                let first = r.seq.fetch_add(max as u64, Ordering::Relaxed);
                (
                    vec![
                        Value::Integer(max_i),
                        Value::from(r.reader_id.as_str()),
                        Value::from(first.to_string()),
                        Value::from(r.min_idle_ms.to_string()),
                        Value::from(r.ttl_ms.to_string()),
                        Value::Integer(i64::from(RECOVER_BATCH)),
                    ],
                    first,
                )
            }
        };
        let reply: Value = scripts::CLAIM
            .evalsha_with_reload(&self.client, keys, args)
            .await
            .map_err(core)?;
        let Value::Array(mut items) = reply else {
            return Ok(Vec::new());
        };
        if let Some(Value::Integer(recovered)) = items.first()
            && *recovered > 0
        {
            tracing::warn!(source = %self.source, recovered, "claims idle longer than min_idle went back to the queue");
        }
        let values: Vec<Bytes> = items.drain(1..).filter_map(value_bytes).collect();
        let mut out = self.list_deliveries(values);
        if let Some(r) = recovery {
            for (i, d) in (first_seq..).zip(out.iter_mut()) {
                let mut member = format!("{}:{i}:", r.reader_id).into_bytes();
                member.extend_from_slice(&d.token.raw);
                d.token.member = Some(Bytes::from(member));
            }
        }
        Ok(out)
    }

    /// Moves due retries back to the queue when one may be due.
    async fn move_due(&self, key: &str, next_due: &Mutex<Instant>) -> Result<()> {
        if *lock(next_due) > Instant::now() {
            return Ok(());
        }
        let (delayed, payloads) = delayed_keys(key);
        let r: Vec<i64> = scripts::MOVE_DUE
            .evalsha_with_reload(
                &self.client,
                vec![delayed, payloads, key.to_owned()],
                vec![MOVE_BATCH],
            )
            .await
            .map_err(core)?;
        let (moved, now, due) = (
            r.first().copied().unwrap_or(0),
            r.get(1).copied().unwrap_or(0),
            r.get(2).copied().unwrap_or(-1),
        );
        let next = if moved >= i64::from(MOVE_BATCH) {
            Instant::now()
        } else if due >= 0 {
            let wait = Duration::from_millis(u64::try_from(due - now).unwrap_or(0));
            Instant::now() + wait.min(DUE_POLL)
        } else {
            Instant::now() + DUE_POLL
        };
        *lock(next_due) = next;
        Ok(())
    }

    async fn receive_stream(
        &self,
        key: &str,
        group: &str,
        consumer: &str,
        block_ms: u64,
        max: usize,
    ) -> Result<Vec<Delivery<Token>>> {
        let block = if self.stop.is_cancelled() {
            1
        } else {
            block_ms
        };
        let args: Vec<Value> = vec![
            "GROUP".into(),
            group.into(),
            consumer.into(),
            "COUNT".into(),
            Value::Integer(i64::try_from(max).unwrap_or(i64::MAX)),
            "BLOCK".into(),
            Value::Integer(i64::try_from(block).unwrap_or(i64::MAX)),
            "STREAMS".into(),
            key.into(),
            ">".into(),
        ];
        let reply: Value = self
            .blocking(self.client.custom(
                fred::cmd!("XREADGROUP", hash: ClusterHash::Offset(8), blocking: true),
                args,
            ))
            .await?;
        Ok(stream_entries(reply)
            .into_iter()
            .map(|(id, fields)| {
                let frame = stream_frame(fields);
                self.delivery(id, frame)
            })
            .collect())
    }
}

impl Receiver for RedisReceiver {
    type Token = Token;
    type Settler = RedisSettler;

    async fn receive(&mut self, max: usize) -> Result<Vec<Delivery<Token>>> {
        match &self.kind {
            Kind::Simple {
                key,
                block,
                next_due,
            } => self.receive_simple(key, *block, next_due, max).await,
            Kind::Reliable {
                key,
                processing,
                block,
                next_due,
                recovery,
            } => {
                self.receive_reliable(key, processing, *block, next_due, recovery.as_ref(), max)
                    .await
            }
            Kind::Stream {
                key,
                group,
                consumer,
                block_ms,
            } => {
                self.receive_stream(key, group, consumer, *block_ms, max)
                    .await
            }
        }
    }

    fn settler(&self) -> RedisSettler {
        self.settler.clone()
    }
}

/// Settles the entries of one subscription.
#[derive(Clone)]
pub struct RedisSettler {
    pool: Pool,
    kind: Arc<SettleKind>,
}

enum SettleKind {
    Simple {
        dead: Option<String>,
    },
    Reliable {
        keys: Vec<String>,
        has_dead: bool,
        next_due: Arc<Mutex<Instant>>,
    },
    Stream {
        keys: Vec<String>,
        group: String,
        has_dead: bool,
    },
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
                    Some(dead) if !dead_letters.is_empty() => {
                        let _: i64 = client.lpush(dead, dead_letters).await.map_err(core)?;
                    }
                    _ => {}
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
                        Settlement::Ack => ("a", Bytes::new(), Value::Null),
                        Settlement::Dead { .. } if !has_dead => ("a", Bytes::new(), Value::Null),
                        Settlement::Dead { reason } => ("x", dead_frame(t, reason), Value::Null),
                        Settlement::Retry { delay: None } => ("r", retry_frame(t), Value::Null),
                        Settlement::Retry { delay: Some(d) } => {
                            earliest = Some(earliest.map_or(*d, |e| e.min(*d)));
                            let ms = d.as_millis();
                            (
                                "d",
                                retry_frame(t),
                                Value::from(format!("{ms}:{}", t.frame.id)),
                            )
                        }
                    };
                    args.extend([
                        Value::from_static_str(op),
                        Value::Bytes(t.raw.clone()),
                        Value::Bytes(new),
                        if arg.is_null() {
                            Value::from_static_str("")
                        } else {
                            arg
                        },
                        t.member
                            .clone()
                            .map_or_else(|| Value::from_static_str(""), Value::Bytes),
                    ]);
                }
                let _: i64 = scripts::SETTLE_LIST
                    .evalsha_with_reload(client, keys.clone(), args)
                    .await
                    .map_err(core)?;
                if let Some(d) = earliest {
                    let at = Instant::now() + d;
                    let mut next = lock(next_due);
                    if at < *next {
                        *next = at;
                    }
                }
                Ok(())
            }
            SettleKind::Stream {
                keys,
                group,
                has_dead,
            } => {
                let mut args: Vec<Value> = vec![group.as_str().into()];
                for (t, s) in batch {
                    args.push(Value::from_static_str(match s {
                        Settlement::Ack => "a",
                        Settlement::Dead { .. } if !has_dead => "a",
                        Settlement::Dead { .. } => "x",
                        Settlement::Retry { .. } => "r",
                    }));
                    args.push(Value::Bytes(t.raw.clone()));
                    match s {
                        Settlement::Dead { reason } if *has_dead => {
                            args.push(Value::Integer(1));
                            args.push(Value::Bytes(dead_frame(t, reason)));
                        }
                        Settlement::Retry { .. } => {
                            let fields = stream_fields(&t.frame, t.frame.attempt.saturating_add(1));
                            args.push(Value::Integer(i64::try_from(fields.len()).unwrap_or(0)));
                            args.extend(fields);
                        }
                        _ => args.push(Value::Integer(0)),
                    }
                }
                let _: i64 = scripts::SETTLE_STREAM
                    .evalsha_with_reload(client, keys.clone(), args)
                    .await
                    .map_err(core)?;
                Ok(())
            }
        }
    }
}

fn lock(m: &Mutex<Instant>) -> std::sync::MutexGuard<'_, Instant> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn consumer_name() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_owned());
    let id = uuid::Uuid::now_v7().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &id[24..])
}

/// Creates the consumer group (and the stream) if missing.
pub(crate) async fn create_group(pool: &Pool, key: &str, group: &str) -> Result<()> {
    let r: Result<Value, _> = pool
        .next()
        .custom(
            fred::cmd!("XGROUP", hash: ClusterHash::Offset(1)),
            vec!["CREATE", key, group, "0", "MKSTREAM"],
        )
        .await;
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.details().contains("BUSYGROUP") => Ok(()),
        Err(e) => Err(Error::Broker(format!(
            "cannot create consumer group `{group}` on stream `{key}`: {}",
            e.details()
        ))),
    }
}

fn value_bytes(v: Value) -> Option<Bytes> {
    match v {
        Value::Bytes(b) => Some(b),
        Value::String(s) => Some(s.into_inner()),
        Value::Integer(i) => Some(Bytes::from(i.to_string())),
        _ => None,
    }
}

fn bytes_array(v: Value) -> Vec<Bytes> {
    match v {
        Value::Array(items) => items.into_iter().filter_map(value_bytes).collect(),
        other => value_bytes(other).into_iter().collect(),
    }
}

/// Flattens an `XREADGROUP` reply (RESP2 arrays or RESP3 maps) into `(id, fields)`.
fn stream_entries(reply: Value) -> Vec<(Bytes, Vec<(Bytes, Bytes)>)> {
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
    let mut out = Vec::new();
    for entries in streams {
        let Value::Array(entries) = entries else {
            continue;
        };
        for entry in entries {
            let Value::Array(mut parts) = entry else {
                continue;
            };
            if parts.len() != 2 {
                continue;
            }
            let fields = parts.pop().map(bytes_array).unwrap_or_default();
            let Some(id) = parts.pop().and_then(value_bytes) else {
                continue;
            };
            let pairs = fields
                .chunks_exact(2)
                .map(|kv| (kv[0].clone(), kv[1].clone()))
                .collect();
            out.push((id, pairs));
        }
    }
    out
}

fn stream_frame(fields: Vec<(Bytes, Bytes)>) -> Frame {
    let mut frame = Frame {
        id: String::new(),
        attempt: 1,
        headers: Headers::new(),
        payload: Bytes::new(),
    };
    for (k, v) in fields {
        match &k[..] {
            b"payload" => frame.payload = v,
            b"rs.id" => frame.id = String::from_utf8_lossy(&v).into_owned(),
            b"rs.attempt" => {
                frame.attempt = std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(1);
            }
            _ => {
                frame.headers.insert(
                    String::from_utf8_lossy(&k).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                );
            }
        }
    }
    frame
}

fn stream_fields(frame: &Frame, attempt: u32) -> Vec<Value> {
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

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
