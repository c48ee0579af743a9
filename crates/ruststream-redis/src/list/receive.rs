//! Reading a list subscription.
//!
//! - Simple: `RPOP key n` (with priority levels `pop_levels.lua`, highest level first; with a
//!   rate limit `pop.lua`, as many as the limit allows); when empty, `BRPOP key t` (with levels `BRPOP` over every
//!   level, highest first; with a rate limit `BLMOVE key key RIGHT RIGHT t` to wait).
//! - Reliable: `claim.lua` (stale claims swept back first, with recovery, then up to `n` entries
//!   claimed into the processing list, from the highest non-empty level down or as many as a rate
//!   limit allows, each recorded in the recovery set); when the queue is empty,
//!   `BLMOVE key key RIGHT RIGHT t`, which moves nothing but wakes when an entry arrives on level
//!   0 (a level above announces its first entry on Pub/Sub, see `levels.rs`), then `claim.lua`
//!   again.
//! - Held back by a rate limit (see `crate::limit`), a reader waits (no command) until the
//!   script says the next entry may pass, then reads again.
//!
//! Before each read the subscription's [`Mover`] moves due delayed entries into the queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::lists::LMoveDirection;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::{Delivery, Result};
use tokio_util::sync::CancellationToken;

use super::lease::Leases;
use super::levels::Wakes;
use super::settle::ReliableSettle;
use super::{ListKeys, Mode, RedisList};
use crate::conn::{Connections, ReadConn};
use crate::dead::PushDeadLetters;
use crate::delayed::{Destination, Mover, interrupted, read_wait};
use crate::error::core;
use crate::limit::{self, Held, Limiter};
use crate::lua;
use crate::memory::BlockingRead;
use crate::transport::{
    Receive, RedisReceiver, RedisSettler, Token, list_delivery, value_bytes, watch_source,
};

/// Most stale claims one read moves back to the queue.
const RECOVER_BATCH: u32 = 128;

static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    lua::script(
        include_str!("claim.lua"),
        &[lua::GUARD, crate::frame::LUA, lua::LEVELS, limit::LUA],
    )
});

static POP: LazyLock<Script> = LazyLock::new(|| {
    lua::script(
        include_str!("pop.lua"),
        &[lua::GUARD, crate::frame::LUA, limit::LUA],
    )
});

static POP_LEVELS: LazyLock<Script> = LazyLock::new(|| {
    lua::script(
        include_str!("pop_levels.lua"),
        &[lua::GUARD, crate::frame::LUA, lua::LEVELS],
    )
});

/// Opens the receiver of `list`: its keys, mover, gauges and settler.
pub(super) async fn open(
    list: &RedisList,
    conns: &Connections,
    stop: CancellationToken,
) -> Result<RedisReceiver> {
    let keys = list.keys(&conns.keys);
    let pool = conns.pool()?;
    let conn = conns
        .reader(
            BlockingRead::List {
                key: keys.queue.clone(),
            },
            list.options.block,
        )
        .await?;
    let mover = Mover::open_if(
        conns,
        &list.options,
        &keys.queue,
        &keys.delayed,
        keys.dead.as_deref(),
        Destination::List,
    )
    .await?
    .map(|m| m.with_levels(&keys.levels));
    let gate = watch_source(conns, list, &pool, &stop).await?;
    let reader = Reader {
        conn,
        stop,
        source: list.key.as_str().into(),
        block: list.options.block,
        mover,
        rate: list
            .rate
            .as_ref()
            .zip(keys.rate.clone())
            .map(|(r, key)| r.limiter(key)),
        wakes: Wakes::open(conns, &keys.levels).await?,
    };
    let receiver = match list.mode {
        Mode::Simple => RedisReceiver::new(SimpleList {
            settler: RedisSettler::new(PushDeadLetters {
                pool,
                dead: keys.dead.clone(),
            }),
            key: keys.queue,
            levels: keys.levels,
            reader,
        }),
        Mode::Reliable => open_reliable(list, keys, pool, reader),
    };
    Ok(receiver.gated(gate))
}

/// The receiver of a reliable list, with its leases and settler.
fn open_reliable(list: &RedisList, keys: ListKeys, pool: Pool, reader: Reader) -> RedisReceiver {
    let leases = Arc::new(Leases::default());
    let recovery = keys.recovery.clone().map(|zset| {
        let idle = list.idle();
        let ttl_ms = list.recovery_ttl.map_or(0, millis);
        let every = (idle / 3).max(Duration::from_millis(10));
        Leases::spawn_renewal(&leases, pool.clone(), zset.clone(), ttl_ms, every);
        Recovery {
            zset,
            min_idle_ms: millis(idle),
            ttl_ms,
            leases: leases.clone(),
        }
    });
    let reader_id = uuid::Uuid::now_v7().simple().to_string();
    let clock = reader.mover.as_ref().map(Mover::clock);
    let settle = ReliableSettle::new(pool, &keys, &reader_id, clock, leases);
    RedisReceiver::new(ReliableList {
        settler: RedisSettler::new(settle),
        keys,
        reader_id,
        seq: AtomicU64::new(0),
        recovery,
        reader,
    })
}

/// What both modes read with.
struct Reader {
    conn: ReadConn,
    stop: CancellationToken,
    /// The key as the user named it: each delivery's source.
    source: Arc<str>,
    block: Duration,
    mover: Option<Mover>,
    rate: Option<Limiter>,
    /// With priority levels: woken when a level above 0 gets its first entry.
    wakes: Wakes,
}

impl Reader {
    async fn move_due(&self) {
        if let Some(m) = &self.mover {
            m.move_due(self.conn.client()).await;
        }
    }

    /// How long the next blocking read may wait, at most `cap`.
    fn wait(&self, cap: Duration) -> Duration {
        read_wait(self.mover.as_ref(), self.block.min(cap))
    }

    /// Whether a read may wait for entries: not when stopping or hurried.
    fn may_wait(&self, hurry: &CancellationToken) -> bool {
        !self.stop.is_cancelled() && !hurry.is_cancelled()
    }

    /// Resolves on a stop, a hurry, a wake-up of the mover or of a priority level.
    async fn interruption(&self, hurry: &CancellationToken) {
        tokio::select! {
            () = interrupted(&self.stop, hurry, self.mover.as_ref()) => {}
            () = self.wakes.any() => {}
        }
    }

    /// Runs a blocking read, cut short by an [`interruption`](Self::interruption).
    async fn blocking(
        &self,
        wait: Duration,
        read: impl Future<Output = Result<Value, fred::error::Error>>,
        hurry: &CancellationToken,
    ) -> Result<Value> {
        self.conn
            .blocking(wait, read, self.interruption(hurry))
            .await
    }

    /// Waits until `queue` holds an entry, without taking it: `BLMOVE queue queue RIGHT RIGHT
    /// t`, which moves nothing, at most `wait`.
    async fn wait_for_entry(
        &self,
        queue: &str,
        wait: Duration,
        hurry: &CancellationToken,
    ) -> Result<()> {
        let waited = self
            .blocking(
                wait,
                self.conn.client().blmove(
                    queue,
                    queue,
                    LMoveDirection::Right,
                    LMoveDirection::Right,
                    wait.as_secs_f64(),
                ),
                hurry,
            )
            .await;
        match waited {
            Ok(_) => Ok(()),
            // At maxmemory Redis refuses BLMOVE (it may grow a list), not the claim script
            // (allow-oom): wait here instead, so a full Redis still drains its queues.
            Err(e) if e.kind() == ruststream_core::ErrorKind::OutOfMemory => {
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = self.interruption(hurry) => {}
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn deliveries(&self, values: Vec<Bytes>) -> Vec<Delivery<Token>> {
        values
            .into_iter()
            .map(|raw| list_delivery(self.source.clone(), raw))
            .collect()
    }
}

/// A simple list: popped, at most once.
struct SimpleList {
    key: String,
    /// Priority levels 1 … n-1; empty without levels.
    levels: Vec<String>,
    reader: Reader,
    settler: RedisSettler,
}

impl SimpleList {
    async fn receive(&self, max: usize, hurry: &CancellationToken) -> Result<Vec<Delivery<Token>>> {
        if self.reader.rate.is_some() {
            return self.receive_limited(max, hurry).await;
        }
        let r = &self.reader;
        r.move_due().await;
        let client = r.conn.client();
        let popped: Value = if self.levels.is_empty() {
            client.rpop(&self.key, Some(max)).await
        } else {
            let mut keys = vec![self.key.clone()];
            keys.extend(self.levels.iter().cloned());
            let max = i64::try_from(max).unwrap_or(i64::MAX);
            POP_LEVELS
                .evalsha_with_reload(client, keys, vec![max])
                .await
        }
        .map_err(core)?;
        let mut values = bytes_array(popped);
        if values.is_empty() && r.may_wait(hurry) {
            let wait = r.wait(Duration::MAX);
            // Highest level first: BRPOP pops from the first non-empty key it is given.
            let mut keys: Vec<&str> = self.levels.iter().rev().map(String::as_str).collect();
            keys.push(&self.key);
            let got = r
                .blocking(wait, client.brpop(keys, wait.as_secs_f64()), hurry)
                .await?;
            if let Value::Array(mut kv) = got
                && kv.len() == 2
                && let Some(v) = kv.pop().and_then(value_bytes)
            {
                values.push(v);
            }
        }
        Ok(r.deliveries(values))
    }

    /// A rate-limited read: `pop.lua`; held back, wait for the limit; empty, wait for an entry
    /// without taking it; then `pop.lua` once more.
    async fn receive_limited(
        &self,
        max: usize,
        hurry: &CancellationToken,
    ) -> Result<Vec<Delivery<Token>>> {
        let r = &self.reader;
        r.move_due().await;
        let (values, held) = self.pop(max).await?;
        if !values.is_empty() || !r.may_wait(hurry) {
            return Ok(r.deliveries(values));
        }
        if held.wait.is_zero() {
            r.wait_for_entry(&self.key, r.wait(Duration::MAX), hurry)
                .await?;
            r.move_due().await;
        } else {
            let cap = r.rate.as_ref().map_or(r.block, |l| l.wait_cap(r.block));
            held.wait(cap, &r.stop, hurry).await;
        }
        let (values, _) = self.pop(max).await?;
        Ok(r.deliveries(values))
    }

    /// One `pop.lua` call: up to `max` entries, as many as the limit allows (none without one).
    async fn pop(&self, max: usize) -> Result<(Vec<Bytes>, Held)> {
        let Some(limiter) = &self.reader.rate else {
            return Ok((Vec::new(), Held::default()));
        };
        let mut args = vec![Value::Integer(i64::try_from(max).unwrap_or(i64::MAX))];
        args.extend(limiter.args.iter().cloned());
        let reply: Value = POP
            .evalsha_with_reload(
                self.reader.conn.client(),
                vec![self.key.clone(), limiter.key.clone()],
                args,
            )
            .await
            .map_err(core)?;
        let Value::Array(mut items) = reply else {
            return Ok((Vec::new(), Held::default()));
        };
        let held = Held::read(&items, 0);
        held.count(&self.key);
        let values = items
            .drain(2.min(items.len())..)
            .filter_map(value_bytes)
            .collect();
        Ok((values, held))
    }
}

impl Receive for SimpleList {
    fn receive<'a>(
        &'a mut self,
        max: usize,
        hurry: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Vec<Delivery<Token>>>> {
        Box::pin(async move {
            self.reader.conn.heal().await?;
            let read = SimpleList::receive(self, max, hurry).await;
            self.reader.conn.check(read)
        })
    }

    fn settler(&self) -> RedisSettler {
        self.settler.clone()
    }

    fn probe(&self) -> Option<ruststream_core::Probe> {
        Some(self.reader.conn.probe())
    }
}

/// A reliable list's recovery set.
struct Recovery {
    zset: String,
    min_idle_ms: u64,
    ttl_ms: u64,
    /// The claims this reader holds, kept alive in the recovery set.
    leases: Arc<Leases>,
}

/// A reliable list: claimed into the processing list, at least once.
struct ReliableList {
    keys: ListKeys,
    /// This reader's identity: its claims are `<reader id>:<seq>.<run>` (see `claim.lua`).
    reader_id: String,
    /// The sequence number of this reader's next claim.
    seq: AtomicU64,
    recovery: Option<Recovery>,
    reader: Reader,
    settler: RedisSettler,
}

impl ReliableList {
    async fn receive(&self, max: usize, hurry: &CancellationToken) -> Result<Vec<Delivery<Token>>> {
        let r = &self.reader;
        r.move_due().await;
        let (claimed, held) = self.claim(max).await?;
        if !claimed.is_empty() || !r.may_wait(hurry) {
            return Ok(claimed);
        }
        if !held.wait.is_zero() {
            // Entries wait, held back by the rate limit: wait for it, not for entries.
            let cap = r.rate.as_ref().map_or(r.block, |l| l.wait_cap(r.block));
            held.wait(cap, &r.stop, hurry).await;
            return Ok(self.claim(max).await?.0);
        }
        // With recovery, wake in time to sweep claims that go stale while the queue is empty.
        let wait = r.wait(
            self.recovery
                .as_ref()
                .map_or(Duration::MAX, |rec| Duration::from_millis(rec.min_idle_ms)),
        );
        r.wait_for_entry(&self.keys.queue, wait, hurry).await?;
        r.move_due().await;
        Ok(self.claim(max).await?.0)
    }

    /// One `claim.lua` call: sweep stale claims (with recovery), then claim up to `max`, as many
    /// as the rate limit allows; with what the limit held back.
    async fn claim(&self, max: usize) -> Result<(Vec<Delivery<Token>>, Held)> {
        let Some(processing) = &self.keys.processing else {
            return Ok((Vec::new(), Held::default()));
        };
        let mut keys = vec![self.keys.queue.clone(), processing.clone()];
        let max_i = i64::try_from(max).unwrap_or(i64::MAX);
        let first_seq = self.seq.fetch_add(max as u64, Ordering::Relaxed);
        let mut args: Vec<Value> = match &self.recovery {
            None => vec![
                Value::Integer(max_i),
                Value::from_static_str(""),
                Value::Integer(0),
                Value::Integer(0),
                Value::Integer(0),
                Value::Integer(0),
            ],
            Some(r) => {
                keys.push(r.zset.clone());
                vec![
                    Value::Integer(max_i),
                    Value::from(self.reader_id.as_str()),
                    Value::from(first_seq.to_string()),
                    Value::from(r.min_idle_ms.to_string()),
                    Value::from(r.ttl_ms.to_string()),
                    Value::Integer(i64::from(RECOVER_BATCH)),
                ]
            }
        };
        match &self.reader.rate {
            Some(limiter) => {
                keys.push(limiter.key.clone());
                args.extend(limiter.args.iter().cloned());
            }
            None => {
                keys.extend(self.keys.levels.iter().cloned());
                args.extend(limit::no_args());
            }
        }
        let reply: Value = CLAIM
            .evalsha_with_reload(self.reader.conn.client(), keys, args)
            .await
            .map_err(core)?;
        let Value::Array(mut items) = reply else {
            return Ok((Vec::new(), Held::default()));
        };
        let held = Held::read(&items, 2);
        held.count(&self.keys.queue);
        if let Some(Value::Integer(recovered)) = items.first()
            && *recovered > 0
        {
            metrics::counter!("ruststream_recovered_total", "queue" => self.keys.queue.clone())
                .increment(u64::try_from(*recovered).unwrap_or(0));
            tracing::warn!(source = %self.reader.source, recovered, "claims idle longer than min_idle went back to the queue");
        }
        // The script's run: part of each member, so a call sent twice makes distinct claims.
        let run = items
            .get(1)
            .cloned()
            .and_then(value_bytes)
            .unwrap_or_default();
        let values: Vec<Bytes> = items
            .drain(4.min(items.len())..)
            .filter_map(value_bytes)
            .collect();
        let mut out = self.reader.deliveries(values);
        for (i, d) in (first_seq..).zip(out.iter_mut()) {
            d.token.claim = Some(i);
            if self.recovery.is_some() {
                let mut member = format!("{}:{i}.", self.reader_id).into_bytes();
                member.extend_from_slice(&run);
                member.push(b':');
                member.extend_from_slice(&d.token.raw);
                d.token.member = Some(Bytes::from(member));
            }
        }
        if let Some(r) = &self.recovery {
            r.leases.hold(
                out.iter()
                    .filter_map(|d| Some((d.token.claim?, d.token.member.clone()?))),
            );
        }
        Ok((out, held))
    }
}

impl Receive for ReliableList {
    fn receive<'a>(
        &'a mut self,
        max: usize,
        hurry: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Vec<Delivery<Token>>>> {
        Box::pin(async move {
            self.reader.conn.heal().await?;
            let read = ReliableList::receive(self, max, hurry).await;
            self.reader.conn.check(read)
        })
    }

    fn settler(&self) -> RedisSettler {
        self.settler.clone()
    }

    fn probe(&self) -> Option<ruststream_core::Probe> {
        Some(self.reader.conn.probe())
    }
}

fn bytes_array(v: Value) -> Vec<Bytes> {
    match v {
        Value::Array(items) => items.into_iter().filter_map(value_bytes).collect(),
        other => value_bytes(other).into_iter().collect(),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
