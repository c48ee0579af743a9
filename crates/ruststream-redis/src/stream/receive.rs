//! Reading a stream subscription: `XREADGROUP GROUP g consumer COUNT n BLOCK ms STREAMS key >`
//! on the subscription's own connection, after its [`Mover`] moved due delayed entries in.
//!
//! With a rate limit, `read.lua` reads instead (the limiter and `XREADGROUP` without `BLOCK`, in
//! one run; see `crate::limit`). When it read nothing, the reader waits: for the limit, as long
//! as the script says; for new entries, with `XREAD BLOCK ms STREAMS key <last id>`, which
//! delivers nothing to the group, then reads once more.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::ClusterHash;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::{Delivery, Headers, Result};
use tokio_util::sync::CancellationToken;

use super::recover::{Group, Recovery};
use super::settle::StreamSettle;
use super::{ATTEMPT_FIELD, ID_FIELD, PAYLOAD_FIELD, RedisStream};
use crate::conn::{Connections, ReadConn};
use crate::delayed::{Destination, Mover, interrupted, read_wait};
use crate::frame::{Frame, FrameError, FramePart};
use crate::limit::{self, Held, Limiter};
use crate::memory::BlockingRead;
use crate::options::DEFAULT_MIN_IDLE;
use crate::transport::{
    Receive, RedisReceiver, RedisSettler, Token, delivery, unreadable, value_bytes, watch_source,
};

static READ: LazyLock<Script> = LazyLock::new(|| {
    crate::lua::script(
        include_str!("read.lua"),
        &[crate::lua::GUARD, crate::frame::LUA, limit::LUA],
    )
});

/// Opens the receiver of `stream`: its keys, mover, gauges and settler.
pub(super) async fn open(
    stream: &RedisStream,
    conns: &Connections,
    stop: CancellationToken,
) -> Result<RedisReceiver> {
    let keys = stream.keys(&conns.keys);
    let group = stream.group_name().to_owned();
    let pool = conns.pool()?;
    let conn = conns
        .reader(
            BlockingRead::Stream {
                key: keys.stream.clone(),
                group: group.clone(),
            },
            stream.options.block,
        )
        .await?;
    // The stream's route (`RedisBroker::route`, else the subscription's plain XADD) bounds what
    // this subscription re-adds to it; a partition follows its stream's route.
    let bound = conns
        .routes
        .get(stream.partition_of.as_deref().unwrap_or(&stream.key))
        .and_then(|p| p.stream())
        .unwrap_or_default();
    let mover = Mover::open_if(
        conns,
        &stream.options,
        &keys.stream,
        &keys.delayed,
        keys.dead.as_deref(),
        Destination::Stream(bound),
    )
    .await?;
    let gate = watch_source(conns, stream, &pool, &stop).await?;
    let consumer = stream.consumer.clone().unwrap_or_else(consumer_name);
    let recovery = (!stream.no_recovery).then(|| {
        let r = Recovery::new(stream.min_idle.unwrap_or(DEFAULT_MIN_IDLE));
        r.spawn_renewal(
            pool.clone(),
            Group {
                key: keys.stream.clone(),
                group: group.clone(),
                consumer: consumer.clone(),
            },
        );
        r
    });
    if let Some(every) = stream.trim_acked {
        super::trim::spawn(pool.clone(), keys.stream.clone(), every, stop.clone());
    }
    let held = recovery.as_ref().map(|r| r.held.clone());
    let clock = mover.as_ref().map(Mover::clock);
    let settler = StreamSettle::new(
        pool.clone(),
        &keys,
        group.clone(),
        bound.script_arg(),
        clock,
        held,
    );
    let receiver = RedisReceiver::new(StreamReceiver {
        conn,
        stop,
        source: stream.key.as_str().into(),
        group: Group {
            key: keys.stream,
            group,
            consumer,
        },
        block: stream.options.block,
        mover,
        recovery,
        rate: stream
            .rate
            .as_ref()
            .zip(keys.rate.clone())
            .map(|(r, key)| r.limiter(key)),
        settler: RedisSettler::new(settler),
    });
    Ok(receiver.gated(gate))
}

struct StreamReceiver {
    conn: ReadConn,
    stop: CancellationToken,
    /// The key as the user named it: each delivery's source.
    source: Arc<str>,
    group: Group,
    block: Duration,
    mover: Option<Mover>,
    recovery: Option<Recovery>,
    rate: Option<Limiter>,
    settler: RedisSettler,
}

impl StreamReceiver {
    async fn receive(
        &mut self,
        max: usize,
        hurry: &CancellationToken,
    ) -> Result<Vec<Delivery<Token>>> {
        if let Some(m) = &self.mover {
            m.move_due(self.conn.client()).await;
        }
        if let Some(r) = &mut self.recovery {
            let claimed = r.claim(self.conn.client(), &self.group, max).await?;
            if !claimed.is_empty() {
                return Ok(self.deliver(
                    claimed
                        .into_iter()
                        .map(|(id, frame, error)| (id, (frame, error))),
                ));
            }
        }
        if let Some(limiter) = &self.rate {
            return self.receive_limited(limiter, max, hurry).await;
        }
        let g = &self.group;
        let mut args: Vec<Value> = vec![
            "GROUP".into(),
            g.group.as_str().into(),
            g.consumer.as_str().into(),
            "COUNT".into(),
            Value::Integer(i64::try_from(max).unwrap_or(i64::MAX)),
        ];
        let tail = ["STREAMS".into(), g.key.as_str().into(), ">".into()];
        if self.stop.is_cancelled() || hurry.is_cancelled() {
            // Not waiting: a plain read, no BLOCK.
            args.extend(tail);
            let reply: Value = self
                .conn
                .client()
                .custom(fred::cmd!("XREADGROUP", hash: ClusterHash::Offset(6)), args)
                .await
                .map_err(crate::error::core)?;
            return Ok(self.deliver(entries(reply)));
        }
        let wait = read_wait(self.mover.as_ref(), self.block);
        let block_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
        args.extend(["BLOCK".into(), Value::Integer(block_ms)]);
        args.extend(tail);
        let read = self.conn.client().custom(
            fred::cmd!("XREADGROUP", hash: ClusterHash::Offset(8), blocking: true),
            args,
        );
        let interrupt = interrupted(&self.stop, hurry, self.mover.as_ref());
        let reply = self.conn.blocking(wait, read, interrupt).await?;
        Ok(self.deliver(entries(reply)))
    }

    /// A rate-limited read: `read.lua`; when it read nothing, wait for the limit or for new
    /// entries, then `read.lua` once more.
    async fn receive_limited(
        &self,
        limiter: &Limiter,
        max: usize,
        hurry: &CancellationToken,
    ) -> Result<Vec<Delivery<Token>>> {
        let (read, held, last) = self.read_limited(limiter, max).await?;
        if !read.is_empty() || self.stop.is_cancelled() || hurry.is_cancelled() {
            return Ok(self.deliver(read));
        }
        match last {
            Some(last) => {
                let wait = read_wait(self.mover.as_ref(), self.block);
                let block_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
                let args: Vec<Value> = vec![
                    "BLOCK".into(),
                    Value::Integer(block_ms),
                    "STREAMS".into(),
                    self.group.key.as_str().into(),
                    Value::from(last),
                ];
                let read = self.conn.client().custom(
                    fred::cmd!("XREAD", hash: ClusterHash::Offset(3), blocking: true),
                    args,
                );
                let interrupt = interrupted(&self.stop, hurry, self.mover.as_ref());
                self.conn.blocking(wait, read, interrupt).await?;
                if let Some(m) = &self.mover {
                    m.move_due(self.conn.client()).await;
                }
            }
            None => held.wait(self.block, &self.stop, hurry).await,
        }
        let (read, _, _) = self.read_limited(limiter, max).await?;
        Ok(self.deliver(read))
    }

    /// One `read.lua` call: what it read, what the limit held back, and the stream's last id
    /// when it read nothing though the limit let it.
    async fn read_limited(
        &self,
        limiter: &Limiter,
        max: usize,
    ) -> Result<(Vec<StreamEntry>, Held, Option<Bytes>)> {
        let g = &self.group;
        let mut args: Vec<Value> = vec![
            g.group.as_str().into(),
            g.consumer.as_str().into(),
            Value::Integer(i64::try_from(max).unwrap_or(i64::MAX)),
        ];
        args.extend(limiter.args.iter().cloned());
        let reply: Value = READ
            .evalsha_with_reload(
                self.conn.client(),
                vec![g.key.clone(), limiter.key.clone()],
                args,
            )
            .await
            .map_err(crate::error::core)?;
        let Value::Array(mut items) = reply else {
            return Ok((Vec::new(), Held::default(), None));
        };
        let held = Held::read(&items, 0);
        held.count(&g.key);
        let read = items.pop().map(entries).unwrap_or_default();
        let last = items
            .pop()
            .and_then(value_bytes)
            .filter(|id| !id.is_empty());
        Ok((read, held, last))
    }

    /// The deliveries of `entries`, held (for their leases) until settled.
    fn deliver(
        &self,
        entries: impl IntoIterator<Item = (Bytes, (Frame, Option<FrameError>))>,
    ) -> Vec<Delivery<Token>> {
        let out: Vec<Delivery<Token>> = entries
            .into_iter()
            .map(|(id, (frame, error))| {
                let d = delivery(self.source.clone(), id, frame);
                match error {
                    Some(e) => unreadable(d, &e),
                    None => d,
                }
            })
            .collect();
        if let Some(r) = &self.recovery {
            r.held.hold(out.iter().map(|d| d.token.raw.clone()));
        }
        out
    }
}

impl Receive for StreamReceiver {
    fn receive<'a>(
        &'a mut self,
        max: usize,
        hurry: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Vec<Delivery<Token>>>> {
        Box::pin(async move {
            self.conn.heal().await?;
            let read = StreamReceiver::receive(self, max, hurry).await;
            self.conn.check(read)
        })
    }

    fn settler(&self) -> RedisSettler {
        self.settler.clone()
    }
    fn probe(&self) -> Option<ruststream_core::Probe> {
        Some(self.conn.probe())
    }
}

/// `<host>-<pid>-<random>`: unique per process, readable in `XINFO CONSUMERS`.
fn consumer_name() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_owned());
    let id = uuid::Uuid::now_v7().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &id[24..])
}

/// One entry read: its id and frame (with the first unreadable part, if any).
type StreamEntry = (Bytes, (Frame, Option<FrameError>));

/// Reads an `XREADGROUP` reply (RESP2 arrays or RESP3 maps) into `(entry id, frame)`.
fn entries(reply: Value) -> Vec<StreamEntry> {
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
    streams.into_iter().flat_map(entry_list).collect()
}

/// Reads a list of entries (`[[id, [field, value, ..]], ..]`, as `XRANGE` and `XCLAIM` reply)
/// into `(entry id, frame)`, in one pass, with no intermediate field vectors.
pub(super) fn entry_list(entries: Value) -> Vec<(Bytes, (Frame, Option<FrameError>))> {
    let Value::Array(entries) = entries else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(parts) = entry else {
            continue;
        };
        let mut parts = parts.into_iter();
        let Some(id) = parts.next().and_then(value_bytes) else {
            continue;
        };
        // An entry deleted while pending has no fields: it is still delivered, with an empty
        // payload, so that it is settled (dead-lettered as undecodable) and not stuck.
        let fields = match parts.next() {
            Some(Value::Array(fields)) => fields,
            _ => Vec::new(),
        };
        out.push((id, frame(fields)));
    }
    out
}

/// The frame of a stream entry's fields: `payload`, `rs.id`, `rs.attempt`, the rest headers.
/// Text that is not UTF-8 is read lossily, and the first such part is returned with the frame.
fn frame(fields: Vec<Value>) -> (Frame, Option<FrameError>) {
    let mut frame = Frame {
        id: String::new(),
        attempt: 1,
        headers: Headers::new(),
        payload: Bytes::new(),
    };
    let mut error = None;
    let mut text = |b: &[u8], part: FramePart| match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            error.get_or_insert(FrameError::NotUtf8(part));
            String::from_utf8_lossy(b).into_owned()
        }
    };
    let mut fields = fields.into_iter().filter_map(value_bytes);
    let mut n = 0;
    while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
        match &k[..] {
            f if f == PAYLOAD_FIELD.as_bytes() => frame.payload = v,
            f if f == ID_FIELD.as_bytes() => frame.id = text(&v, FramePart::Id),
            f if f == ATTEMPT_FIELD.as_bytes() => {
                frame.attempt = std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(1);
            }
            _ => {
                n += 1;
                let key = text(&k, FramePart::HeaderKey(n));
                let value = text(&v, FramePart::HeaderValue(key.clone()));
                frame.headers.insert(key, value);
            }
        }
    }
    (frame, error)
}
