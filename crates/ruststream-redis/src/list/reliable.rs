//! Reading a reliable list: claims into the processing list through `claim.lua` (see
//! `crate::claim` and `receive.rs`, which reads both modes), each claim's deliveries carrying their
//! claim and, with recovery, their place in the claimed batch, leased while their handlers run.
//!
//! With recovery a claim sweeps stale claims back first, only by the sweep's deadline in the
//! server's clock (`crate::sweep_clock`: `TIME` before a reader's first sweep), and after a
//! reconnect only once this reader's leases are renewed (`lease.lua`, see `crate::rejoin`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use futures::future::BoxFuture;
use ruststream_core::{Delivery, Result};
use tokio_util::sync::CancellationToken;

use super::lease::Leases;
use super::receive::Reader;
use super::settle::ReliableSettle;
use super::source::{ListKeys, RedisList};
use crate::claim::{Claimed, Record};
use crate::delayed::Mover;
use crate::rejoin::Rejoin;
use crate::sweep_clock::{SweepClock, run_ms};
use crate::transport::{InBatch, Receive, RedisReceiver, RedisSettler, Token, signal_ids};

/// Most stale claims one read moves back to the queue.
const RECOVER_BATCH: u32 = 128;

/// The receiver of a reliable list, with its leases and settler.
pub(super) fn open_reliable(
    list: &RedisList,
    keys: ListKeys,
    pool: Pool,
    mut reader: Reader,
) -> RedisReceiver {
    let leases = Arc::new(Leases::default());
    let reader_id = uuid::Uuid::now_v7().simple().to_string();
    let processing = keys.processing.clone().unwrap_or_default();
    let mut rejoin = None;
    let mut slack = Duration::ZERO;
    let record = match keys.recovery.clone() {
        None => Record::List { processing },
        Some(zset) => {
            let idle = list.queue.idle();
            let ttl_ms = list.recovery_ttl.map_or(0, millis);
            let every = (idle / 3).max(Duration::from_millis(10));
            let r = Rejoin::new(every);
            r.watch(&mut reader.conn);
            Leases::spawn_renewal(
                &leases,
                pool.clone(),
                zset.clone(),
                ttl_ms,
                every,
                r.clone(),
            );
            rejoin = Some(r);
            slack = every;
            Record::Claims {
                processing,
                zset,
                reader: reader_id.clone(),
                min_idle_ms: millis(idle),
                ttl_ms,
                most: RECOVER_BATCH,
            }
        }
    };
    let clock = reader.mover.as_ref().map(Mover::clock);
    let settle = ReliableSettle::new(
        pool,
        &keys,
        &reader_id,
        &list.options,
        clock,
        leases.clone(),
    );
    RedisReceiver::new(ReliableList {
        settler: RedisSettler::new(settle),
        reader_id,
        seq: AtomicU64::new(0),
        record,
        leases,
        rejoin,
        clock: SweepClock::new(slack),
        reader,
    })
}

/// A `min_idle` no claim reaches (about 31,700 years): a claim call that must not sweep.
const NO_SWEEP_MS: u64 = 1_000_000_000_000_000;

/// A reliable list: claimed into the processing list, at least once.
struct ReliableList {
    /// This reader's identity: its claimed batches are `<reader id>:<seq>.<run>` (see
    /// `claim.lua`).
    reader_id: String,
    /// The sequence number of this reader's next claim.
    seq: AtomicU64,
    /// What a claim records: the processing list, with recovery the recovery set too.
    record: Record,
    /// The claims this reader holds, kept alive in the recovery set (with recovery).
    leases: Arc<Leases>,
    /// With recovery, after a reconnect: renew before sweeping (`crate::rejoin`).
    rejoin: Option<Arc<Rejoin>>,
    /// With recovery: the server time each sweep must run by (`crate::sweep_clock`).
    clock: SweepClock,
    reader: Reader,
    settler: RedisSettler,
}

impl ReliableList {
    async fn receive(&self, max: usize, hurry: &CancellationToken) -> Result<Vec<Delivery<Token>>> {
        // With recovery, wake in time to sweep claims that go stale while the queue is empty.
        let cap = match &self.record {
            Record::Claims { min_idle_ms, .. } => Duration::from_millis(*min_idle_ms),
            _ => Duration::MAX,
        };
        self.reader
            .receive(max, cap, hurry, |n| self.claim(n))
            .await
            .map(|c| self.tokens(c))
    }

    /// One claim: its first sequence number is taken here, so each claim's is its own.
    async fn claim(&self, max: usize) -> Result<Claimed> {
        let first_seq = self.seq.fetch_add(max as u64, Ordering::Relaxed);
        let Record::Claims { .. } = &self.record else {
            return self.reader.claim(&self.record, max, first_seq, None).await;
        };
        if !self.may_sweep().await {
            // Within the grace after a reconnect, no claim is old enough to sweep.
            let mut record = self.record.clone();
            if let Record::Claims { min_idle_ms, .. } = &mut record {
                *min_idle_ms = NO_SWEEP_MS;
            }
            let claimed = self.reader.claim(&record, max, first_seq, None).await?;
            self.ran(&claimed, None);
            return Ok(claimed);
        }
        let by = self.clock.deadline(self.reader.conn.client()).await?;
        let claimed = self
            .reader
            .claim(&self.record, max, first_seq, Some(by))
            .await?;
        self.ran(&claimed, Some(by));
        Ok(claimed)
    }

    /// Notes the server time `claimed` ran at, against its sweep's deadline `sweep_by`.
    fn ran(&self, claimed: &Claimed, sweep_by: Option<u64>) {
        if let Some(ran) = run_ms(&claimed.run) {
            let rejoin = self.rejoin.as_deref();
            self.clock.ran(ran, sweep_by, rejoin, &self.reader.source);
        }
    }

    /// After a reconnect, renews this reader's leases on its reading connection (the one the
    /// sweep goes on, so the renewal runs first); whether this claim may sweep.
    async fn may_sweep(&self) -> bool {
        let (Some(rejoin), Record::Claims { zset, ttl_ms, .. }) = (&self.rejoin, &self.record)
        else {
            return true;
        };
        rejoin.mark_if_back(&self.reader.conn);
        if rejoin.take()
            && let Err(e) = self
                .leases
                .renew(self.reader.conn.client(), zset, *ttl_ms)
                .await
        {
            rejoin.mark();
            tracing::warn!(recovery_set = %zset, error = %e,
                "claims not renewed after the reconnect; not sweeping until they are");
            return false;
        }
        rejoin.may_sweep()
    }

    /// The deliveries of `claimed`, each with its claim (and its place in the batch, with
    /// recovery), leased.
    fn tokens(&self, claimed: Claimed) -> Vec<Delivery<Token>> {
        let recovery = matches!(self.record, Record::Claims { .. });
        let first_seq = claimed.first_seq;
        let member = {
            let mut m = format!("{}:{first_seq}.", self.reader_id).into_bytes();
            m.extend_from_slice(&claimed.run);
            Bytes::from(m)
        };
        let mut out = self.reader.deliveries(claimed.values);
        for (index, (i, d)) in (first_seq..).zip(out.iter_mut()).enumerate() {
            d.token.claim = Some(i);
            if recovery {
                d.token.batch = Some(InBatch {
                    member: member.clone(),
                    index,
                });
            }
        }
        if recovery {
            self.leases
                .hold(out.iter().filter_map(|d| {
                    Some((d.token.claim?, d.token.batch.as_ref()?.member.clone()))
                }));
        }
        out
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

    fn cancel_signals(&mut self) -> Option<futures::stream::BoxStream<'static, String>> {
        self.reader.signals.take().map(signal_ids)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
