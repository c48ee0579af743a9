//! Reading: the receiver of one subscription.
//!
//! - Simple list: `RPOP key n`; when empty, `BRPOP key t`.
//! - Reliable list: the `CLAIM` script (stale claims swept back, then `LMOVE` ×n with their
//!   recovery-set members); when empty, `BLMOVE key key RIGHT RIGHT t`, which moves nothing but
//!   wakes when an entry arrives, then `CLAIM` again.
//! - Stream: `XREADGROUP GROUP g c COUNT n BLOCK ms STREAMS key >`.
//! - Pub/Sub channel: see [`pubsub`](crate::pubsub) (`SUBSCRIBE`/`PSUBSCRIBE`, no reads).
//!
//! Before each read, unless scheduling is off, `MOVE_DUE` moves the subscription's due entries
//! from `K.delayed` to `K` (delayed publishes and retries), and a wait never outlasts the next
//! due entry. Any number of readers may move at once: the script is atomic, so nothing is
//! delivered twice and no lock is taken. A publish that schedules a new earliest entry
//! `PUBLISH`es on the delayed set's name; the broker's subscriber wakes a waiting reader.
//!
//! Blocking reads run on the subscription's own client, in fred's `Interrupt` mode: on stop or
//! wake, a `PING` on that client makes fred send `CLIENT UNBLOCK`, so nobody waits out the block
//! timeout, and whatever the read returned is still handled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::ClusterHash;
use fred::types::lists::LMoveDirection;
use ruststream_core::{BrokerSource, Delivery, DeliveryInfo, Error, Headers, Receiver, Result};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::broker::RedisSource;
use crate::error::core;
use crate::frame::Frame;
use crate::list::Mode;
use crate::publish::new_id;
use crate::settler::{RedisSettler, SettleKind};
use crate::{RedisBroker, scripts};

/// Most due entries moved per read.
pub const MOVE_BATCH: u32 = 128;

/// Most stale claims one read moves back to the queue (seed 000).
pub const RECOVER_BATCH: u32 = 128;

/// How often an idle reader looks for due entries when no wake-up came (a lost `PUBLISH`).
const DUE_POLL: Duration = Duration::from_secs(5);

/// The shortest blocking wait sent to Redis.
const MIN_WAIT: Duration = Duration::from_millis(5);

/// What the settler needs of one delivered entry.
#[derive(Debug)]
pub struct Token {
    /// The list value as claimed (for `LREM`), the stream entry id, or the Pub/Sub message.
    pub(crate) raw: Bytes,
    /// The decoded entry, its id filled in.
    pub(crate) frame: Frame,
    /// The claim's member in the recovery set, when there is one.
    pub(crate) member: Option<Bytes>,
}

/// The receiver of one Redis subscription.
pub struct RedisReceiver(Reading);

enum Reading {
    Queue(QueueReceiver),
    Channel(crate::pubsub::ChannelReceiver),
}

/// The receiver of a list or stream subscription.
struct QueueReceiver {
    client: Client,
    stop: CancellationToken,
    source: Arc<str>,
    kind: Kind,
    schedule: Option<Schedule>,
    settler: RedisSettler,
    /// On the in-memory server (tests), what to await before a blocking read: see `crate::memory`.
    memory: Option<crate::memory::MemoryWait>,
}

enum Kind {
    Simple {
        key: String,
        block: Duration,
    },
    Reliable {
        key: String,
        processing: String,
        block: Duration,
        recovery: Option<Recovery>,
    },
    Stream {
        key: String,
        group: String,
        consumer: String,
        block: Duration,
    },
}

/// A reliable list's recovery set, and this reader's identity in it.
struct Recovery {
    zset: String,
    min_idle_ms: u64,
    ttl_ms: u64,
    reader_id: String,
    seq: AtomicU64,
}

/// Moves this subscription's due entries from its delayed set.
pub(crate) struct Schedule {
    /// Delayed set, payload hash, destination.
    keys: Vec<String>,
    /// `list` or `stream`.
    dest_kind: &'static str,
    /// When an entry may next be due (shared with the settler, which schedules retries).
    pub(crate) next_due: Arc<Mutex<Instant>>,
    /// Woken by the broker's subscriber when a publish schedules a new earliest entry.
    wake: Arc<Notify>,
    lateness: metrics::Histogram,
}

impl RedisReceiver {
    pub(crate) async fn open(
        broker: &RedisBroker,
        source: &RedisSource,
        stop: CancellationToken,
    ) -> Result<Self> {
        Ok(Self(match source {
            RedisSource::Channel(c) => {
                Reading::Channel(crate::pubsub::ChannelReceiver::open(broker, c, stop).await?)
            }
            _ => Reading::Queue(QueueReceiver::open(broker, source, stop).await?),
        }))
    }
}

impl QueueReceiver {
    async fn open(
        broker: &RedisBroker,
        source: &RedisSource,
        stop: CancellationToken,
    ) -> Result<Self> {
        let client = broker.reader_client().await?;
        let pool = broker.pool()?;
        let source_name: Arc<str> = source.key().into();
        let key = broker.key(source.key());
        let dead = broker.inner.dead_key(source);
        let (delayed, payloads) = broker.inner.delayed_keys(&key);
        let processing = match source {
            RedisSource::List(l) if l.mode == Mode::Reliable => {
                Some(broker.key(&l.processing_key()))
            }
            _ => None,
        };
        let memory = match source {
            RedisSource::List(_) => broker.inner.memory.list_waiter(&key),
            RedisSource::Stream(s) => broker.inner.memory.stream_waiter(&key, s.group_name()),
            RedisSource::Channel(_) => None,
        };
        let schedule = if broker.scheduling_on() && source_schedules(source) {
            Some(Schedule {
                keys: vec![delayed.clone(), payloads.clone(), key.clone()],
                dest_kind: if matches!(source, RedisSource::Stream(_)) {
                    "stream"
                } else {
                    "list"
                },
                next_due: Arc::new(Mutex::new(Instant::now())),
                wake: broker.wake_for(&delayed).await?,
                lateness: metrics::histogram!("ruststream_delivery_lateness_seconds", "queue" => key.clone()),
            })
        } else {
            None
        };
        let next_due = schedule
            .as_ref()
            .map(|s| (s.next_due.clone(), s.wake.clone()));
        crate::gauges::spawn(
            pool.clone(),
            crate::gauges::QueueKeys {
                queue: key.clone(),
                processing: processing.clone(),
                group: match source {
                    RedisSource::Stream(s) => Some(s.group_name().to_owned()),
                    RedisSource::List(_) | RedisSource::Channel(_) => None,
                },
                delayed: delayed.clone(),
                dead: dead.clone(),
            },
            stop.clone(),
        );
        let (kind, settle) = match (source, processing) {
            (RedisSource::List(l), None) => (
                Kind::Simple {
                    key,
                    block: l.block,
                },
                SettleKind::Simple { dead },
            ),
            (RedisSource::List(l), Some(processing)) => {
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
                    dead.clone().unwrap_or_else(|| key.clone()),
                    delayed,
                    payloads,
                ];
                if let Some(r) = &recovery {
                    keys.push(r.zset.clone());
                }
                (
                    Kind::Reliable {
                        key,
                        processing,
                        block: l.block,
                        recovery,
                    },
                    SettleKind::Reliable {
                        keys,
                        has_dead: dead.is_some(),
                        next_due,
                    },
                )
            }
            (RedisSource::Channel(c), _) => {
                return Err(Error::Broker(format!(
                    "internal: pub/sub channel `{}` has no queue to read",
                    c.name
                )));
            }
            (RedisSource::Stream(s), _) => (
                Kind::Stream {
                    key: key.clone(),
                    group: s.group_name().to_owned(),
                    consumer: s.consumer.clone().unwrap_or_else(consumer_name),
                    block: s.block,
                },
                SettleKind::Stream {
                    keys: vec![key.clone(), dead.clone().unwrap_or(key), delayed, payloads],
                    group: s.group_name().to_owned(),
                    has_dead: dead.is_some(),
                    next_due,
                },
            ),
        };
        Ok(Self {
            client,
            stop,
            settler: RedisSettler::new(pool, settle),
            source: source_name,
            kind,
            schedule,
            memory,
        })
    }

    /// How long a blocking read may wait: the source's block time, cut short by the next due
    /// entry.
    fn wait(&self, block: Duration) -> Duration {
        let until_due = self.schedule.as_ref().map_or(block, |s| {
            lock(&s.next_due).saturating_duration_since(Instant::now())
        });
        block.min(until_due).max(MIN_WAIT)
    }

    /// Runs a blocking read; on stop or wake, interrupts it and still returns what it read.
    async fn blocking(
        &self,
        wait: Duration,
        read: impl Future<Output = Result<Value, fred::error::Error>>,
    ) -> Result<Value> {
        tokio::pin!(read);
        let woken = async {
            match &self.schedule {
                Some(s) => s.wake.notified().await,
                None => std::future::pending().await,
            }
        };
        // The in-memory server answers a blocking read at once: wait here for what would wake it.
        let ready = async {
            match &self.memory {
                Some(m) => m.ready(wait).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = &mut read, if self.memory.is_none() => return empty_on_timeout(r),
            () = ready => return empty_on_timeout(read.await),
            () = self.stop.cancelled() => {}
            // Redis times out a blocked client only when its event loop wakes (every 100 ms at
            // the default `hz 10`), so a short wait would end up to 100 ms late: keep time here.
            () = tokio::time::sleep(wait), if self.memory.is_none() => {}
            () = woken => {
                if let Some(s) = &self.schedule {
                    *lock(&s.next_due) = Instant::now();
                }
            }
        }
        let client = self.client.clone();
        let interrupt = async move {
            let _: Result<(), _> = client.ping(None).await;
        };
        let (r, ()) = tokio::join!(read, interrupt);
        empty_on_timeout(r)
    }

    fn delivery(&self, raw: Bytes, frame: Frame) -> Delivery<Token> {
        delivery(self.source.clone(), raw, frame)
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
        max: usize,
    ) -> Result<Vec<Delivery<Token>>> {
        let popped: Value = self.client.rpop(key, Some(max)).await.map_err(core)?;
        let mut values = bytes_array(popped);
        if values.is_empty() && !self.stop.is_cancelled() {
            let wait = self.wait(block);
            let got: Value = self
                .blocking(wait, self.client.brpop(key, wait.as_secs_f64()))
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
        recovery: Option<&Recovery>,
        max: usize,
    ) -> Result<Vec<Delivery<Token>>> {
        let claimed = self.claim(key, processing, recovery, max).await?;
        if !claimed.is_empty() || self.stop.is_cancelled() {
            return Ok(claimed);
        }
        let mut wait = self.wait(block);
        if let Some(r) = recovery {
            // Wake in time to sweep claims that go stale while the queue is empty.
            wait = wait.min(Duration::from_millis(r.min_idle_ms).max(MIN_WAIT));
        }
        let _: Value = self
            .blocking(
                wait,
                self.client.blmove(
                    key,
                    key,
                    LMoveDirection::Right,
                    LMoveDirection::Right,
                    wait.as_secs_f64(),
                ),
            )
            .await?;
        self.move_due().await?;
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
            metrics::counter!("ruststream_recovered_total", "queue" => key.to_owned())
                .increment(u64::try_from(*recovered).unwrap_or(0));
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

    /// Moves due entries to the destination when one may be due.
    async fn move_due(&self) -> Result<()> {
        let Some(s) = &self.schedule else {
            return Ok(());
        };
        if *lock(&s.next_due) > Instant::now() {
            return Ok(());
        }
        let r: Vec<i64> = scripts::MOVE_DUE
            .evalsha_with_reload(
                &self.client,
                s.keys.clone(),
                vec![Value::from(MOVE_BATCH), Value::from_static_str(s.dest_kind)],
            )
            .await
            .map_err(core)?;
        let (moved, now, due) = (
            r.first().copied().unwrap_or(0),
            r.get(1).copied().unwrap_or(0),
            r.get(2).copied().unwrap_or(-1),
        );
        for late in r.iter().skip(3) {
            #[allow(clippy::cast_precision_loss)]
            s.lateness.record(*late as f64 / 1000.0);
        }
        let next = if moved >= i64::from(MOVE_BATCH) {
            Instant::now()
        } else if due >= 0 {
            let wait = Duration::from_millis(u64::try_from(due - now).unwrap_or(0));
            Instant::now() + wait.min(DUE_POLL)
        } else {
            Instant::now() + DUE_POLL
        };
        let mut next_due = lock(&s.next_due);
        // A retry scheduled by the settler meanwhile may be earlier.
        if next < *next_due || *next_due <= Instant::now() {
            *next_due = next;
        }
        Ok(())
    }

    async fn receive_stream(
        &self,
        key: &str,
        group: &str,
        consumer: &str,
        block: Duration,
        max: usize,
    ) -> Result<Vec<Delivery<Token>>> {
        let block_ms = if self.stop.is_cancelled() {
            1
        } else {
            millis(self.wait(block))
        };
        let args: Vec<Value> = vec![
            "GROUP".into(),
            group.into(),
            consumer.into(),
            "COUNT".into(),
            Value::Integer(i64::try_from(max).unwrap_or(i64::MAX)),
            "BLOCK".into(),
            Value::Integer(i64::try_from(block_ms).unwrap_or(i64::MAX)),
            "STREAMS".into(),
            key.into(),
            ">".into(),
        ];
        let reply: Value = self
            .blocking(
                Duration::from_millis(block_ms),
                self.client.custom(
                    fred::cmd!("XREADGROUP", hash: ClusterHash::Offset(8), blocking: true),
                    args,
                ),
            )
            .await?;
        Ok(stream_entries(reply)
            .into_iter()
            .map(|(id, frame)| self.delivery(id, frame))
            .collect())
    }
}

impl Drop for QueueReceiver {
    /// Closes the reader's own connection: fred keeps a client connected until it quits, so
    /// without this every stopped subscription would leave a connection (and its task) behind.
    fn drop(&mut self) {
        let client = self.client.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = client.quit().await;
            });
        }
    }
}

impl Receiver for RedisReceiver {
    type Token = Token;
    type Settler = RedisSettler;

    async fn receive(&mut self, max: usize) -> Result<Vec<Delivery<Token>>> {
        match &mut self.0 {
            Reading::Queue(q) => q.receive(max).await,
            Reading::Channel(c) => c.receive(max).await,
        }
    }

    fn settler(&self) -> RedisSettler {
        match &self.0 {
            Reading::Queue(q) => q.settler.clone(),
            Reading::Channel(c) => c.settler(),
        }
    }
}

impl QueueReceiver {
    async fn receive(&mut self, max: usize) -> Result<Vec<Delivery<Token>>> {
        self.move_due().await?;
        match &self.kind {
            Kind::Simple { key, block } => self.receive_simple(key, *block, max).await,
            Kind::Reliable {
                key,
                processing,
                block,
                recovery,
            } => {
                self.receive_reliable(key, processing, *block, recovery.as_ref(), max)
                    .await
            }
            Kind::Stream {
                key,
                group,
                consumer,
                block,
            } => self.receive_stream(key, group, consumer, *block, max).await,
        }
    }
}

fn source_schedules(source: &RedisSource) -> bool {
    match source {
        RedisSource::List(l) => l.scheduling,
        RedisSource::Stream(s) => s.scheduling,
        RedisSource::Channel(_) => false,
    }
}

/// fred reports a blocking read that timed out (a nil reply) as a `Timeout` error, and one we
/// interrupted as `UNBLOCKED`: both are an empty read, not a failure to back off from.
fn empty_on_timeout(r: Result<Value, fred::error::Error>) -> Result<Value> {
    match r {
        Err(e) if *e.kind() == fred::error::ErrorKind::Timeout => Ok(Value::Null),
        // `CLIENT UNBLOCK` sent by fred's interrupt (stop, wake-up) is not a failure either.
        Err(e) if e.details().starts_with("UNBLOCKED") => Ok(Value::Null),
        r => r.map_err(core),
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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

/// A delivery of `frame` (a missing id is made up) from `source`; `raw` is what settling needs.
pub(crate) fn delivery(source: Arc<str>, raw: Bytes, mut frame: Frame) -> Delivery<Token> {
    if frame.id.is_empty() {
        frame.id = new_id();
    }
    Delivery {
        info: DeliveryInfo::new(
            frame.id.clone(),
            frame.attempt,
            source,
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

pub(crate) fn value_bytes(v: Value) -> Option<Bytes> {
    match v {
        Value::Bytes(b) => Some(b),
        Value::String(s) => Some(s.into_inner()),
        Value::Integer(i) => Some(Bytes::from(i.to_string())),
        Value::Double(f) => Some(Bytes::from(f.to_string())),
        _ => None,
    }
}

fn bytes_array(v: Value) -> Vec<Bytes> {
    match v {
        Value::Array(items) => items.into_iter().filter_map(value_bytes).collect(),
        other => value_bytes(other).into_iter().collect(),
    }
}

/// Reads an `XREADGROUP` reply (RESP2 arrays or RESP3 maps) into `(entry id, frame)`, in one
/// pass over the entries (no intermediate field vectors: the stream benchmark's consumer spent a
/// fifth of its CPU building and dropping them).
fn stream_entries(reply: Value) -> Vec<(Bytes, Frame)> {
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
        out.reserve(entries.len());
        for entry in entries {
            let Value::Array(parts) = entry else {
                continue;
            };
            let mut parts = parts.into_iter();
            let Some(id) = parts.next().and_then(value_bytes) else {
                continue;
            };
            // An entry deleted while pending has no fields: it is still delivered, with an
            // empty payload, so that it is settled (dead-lettered as undecodable) and not stuck.
            let fields = match parts.next() {
                Some(Value::Array(fields)) => fields,
                _ => Vec::new(),
            };
            out.push((id, stream_frame(fields)));
        }
    }
    out
}

/// The frame of a stream entry's fields: `payload`, `rs.id`, `rs.attempt`, the rest headers.
fn stream_frame(fields: Vec<Value>) -> Frame {
    let mut frame = Frame {
        id: String::new(),
        attempt: 1,
        headers: Headers::new(),
        payload: Bytes::new(),
    };
    let mut fields = fields.into_iter().filter_map(value_bytes);
    while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
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
