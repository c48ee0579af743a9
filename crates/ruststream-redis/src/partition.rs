//! Partitions: one logical queue (a list or a stream) spread over `n` keys `{k:0}` … `{k:n-1}`.
//!
//! On a cluster every key of a queue shares one hash slot, so one Redis core bounds a queue.
//! `RedisList::new(k).partitions(n)` (and `RedisStream`'s) makes the queue `n` queues, each a
//! whole queue of its own in its own slot (its processing list, recovery set, delayed set and
//! dead-letter list tagged with it), read by every reader of the subscription:
//!
//! - Publishing picks one partition per message: by its partition key (CRC16, as Redis names
//!   slots, so every process picks the same one and one key's messages stay in order), else
//!   round robin.
//! - A reader asks every open (not paused) partition at once without waiting, splitting its
//!   free permits between them (the first in line turns round every call, so none waits behind
//!   the others), each through that partition's own claim path and connection. When none has
//!   entries it waits on all of them at once, and the first that gets some hurries the others:
//!   their blocking reads are interrupted and return what they got. Nothing is ever dropped: a
//!   read always runs to its end. With fewer free permits than partitions (a concurrency below
//!   twice the partitions), the partitions left out are asked in turn, and while idle the reader
//!   waits on some only, looking at all every 100 ms.
//! - Settling sends each partition's settlements to that partition's settler.
//! - Recovery, retries, dead letters and the operator's views are each partition's own.
//!
//! Here too: [`open`], [`prepare`] and [`queues`], what the broker and the operator call for any
//! source, partitioned or not. Sends no command itself: each partition's receiver and settler do.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::{BoxFuture, try_join_all};
use futures::stream::{FuturesUnordered, StreamExt};
use ruststream_core::{ConfigError, Delivery, Error, Receiver, Result, Settlement, Settler};
use tokio_util::sync::CancellationToken;

use crate::claim::limit::{Held, Limiter};
use crate::claim::{Refund, Reserve};
use crate::conn::Connections;
use crate::keys::{KeySpace, SourceKeys};
use crate::lua::Call;
use crate::transport::{Receive, RedisReceiver, RedisSettler, Settle, Token, Transport};

/// Most partitions a queue may have.
pub(crate) const MAX: u16 = 1024;

/// With fewer free permits than open partitions, a reader waits on some partitions only, and
/// this often looks again at all of them.
const UNWATCHED_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// The key of partition `i` of the queue `key`: `{key:i}`, a hash tag of its own.
pub(crate) fn key(key: &str, i: u16) -> String {
    format!("{{{key}:{i}}}")
}

/// The keys of the `n` partitions of `key` (none when `n` is `None`).
pub(crate) fn keys(key: &str, n: Option<u16>) -> Vec<String> {
    (0..n.unwrap_or(0)).map(|i| self::key(key, i)).collect()
}

/// One transport per partition of `key`, each made by `part` from its partition's key.
pub(crate) fn transports<T: Transport>(
    key: &str,
    n: Option<u16>,
    part: impl Fn(String) -> T,
) -> Vec<Box<dyn Transport>> {
    keys(key, n)
        .into_iter()
        .map(|k| Box::new(part(k)) as Box<dyn Transport>)
        .collect()
}

/// The partition of `n` a message goes to: its partition key's slot modulo `n`, else the next
/// one round robin.
pub(crate) fn pick(n: u16, partition_key: Option<&str>, next: &AtomicUsize) -> u16 {
    let n = n.max(1);
    match partition_key {
        Some(k) => fred::util::redis_keyslot(k.as_bytes()) % n,
        None => u16::try_from(next.fetch_add(1, Ordering::Relaxed) % usize::from(n)).unwrap_or(0),
    }
}

/// Checks a partitioned queue's own settings: `n` in range, a key without a hash tag, and no
/// key named by hand (`named`: the settings that name one), since every partition needs its own.
pub(crate) fn validate(key: &str, n: u16, named: &[&'static str]) -> Result<()> {
    let e = if n == 0 || n > MAX {
        ConfigError::new(
            "partitions",
            format!("must be between 1 and {MAX}, not {n}"),
            format!("give a number of partitions from 1 to {MAX}"),
        )
    } else if key.contains('{') || key.contains('}') {
        ConfigError::new(
            "partitions",
            format!(
                "a queue with partitions names its partitions `{}` … `{}`, each with a hash tag of its own, so its key cannot hold one",
                self::key(key.trim_matches(['{', '}']), 0),
                self::key(key.trim_matches(['{', '}']), n - 1)
            ),
            "name it without braces",
        )
    } else if let Some(setting) = named.first() {
        ConfigError::new(
            *setting,
            format!(
                "names one key, but each partition needs its own (`{}.…`)",
                self::key(key, 0)
            ),
            "remove it; the partitions' keys are derived",
        )
    } else {
        return Ok(());
    };
    Err(e.on(key).into())
}

/// The keys of every queue `source` reads: its own, or each partition's (named after its key,
/// with `partition_of` the source's). A rate limit holds over the whole queue, one limiter on
/// the source's key: the first partition carries it, so it is shown once.
pub(crate) fn queues(source: &dyn Transport, space: &KeySpace) -> Vec<SourceKeys> {
    let parts = source.partitions();
    if parts.is_empty() {
        return vec![source.source_keys(space)];
    }
    let mut whole = source.source_keys(space).rate_limit;
    parts
        .iter()
        .map(|p| {
            let keys = p.source_keys(space);
            SourceKeys {
                partition_of: Some(source.key().to_owned()),
                rate_limit: whole.take().or(keys.rate_limit.clone()),
                ..keys
            }
        })
        .collect()
}

/// Opens the receiver of `source`: its own, or one reading all its partitions.
pub(crate) async fn open(
    source: &dyn Transport,
    conns: &Arc<Connections>,
    stop: CancellationToken,
) -> Result<RedisReceiver> {
    let parts = source.partitions();
    if parts.is_empty() {
        return source.open(conns, stop).await;
    }
    let limit = match source.limiter(&conns.keys) {
        Some(limiter) => Some(Limit {
            limiter,
            pool: conns.pool()?,
            block: source.options().block,
        }),
        None => None,
    };
    open_parts(parts, conns, stop, limit).await
}

/// Prepares `source` (each of its partitions) on the connected server.
pub(crate) async fn prepare(source: &dyn Transport, conns: &Connections) -> Result<()> {
    let parts = source.partitions();
    if parts.is_empty() {
        return source.prepare(conns).await;
    }
    for p in parts {
        p.prepare(conns).await?;
    }
    Ok(())
}

/// Opens a receiver reading every partition of a source.
async fn open_parts(
    parts: Vec<Box<dyn Transport>>,
    conns: &Arc<Connections>,
    stop: CancellationToken,
    limit: Option<Limit>,
) -> Result<RedisReceiver> {
    let mut readers = Vec::with_capacity(parts.len());
    for part in &parts {
        readers.push(part.open(conns, stop.clone()).await?);
    }
    let settler = RedisSettler::new(PartitionedSettle(
        readers.iter().map(Receiver::settler).collect(),
    ));
    Ok(RedisReceiver::new(Partitioned {
        parts: readers,
        first: 0,
        settler,
        limit,
        stop,
    }))
}

/// The whole-queue rate limit of a partitioned queue, on the limiter's own slot.
struct Limit {
    limiter: Limiter,
    pool: fred::clients::Pool,
    /// The source's block: the longest a reader waits for the limit before it asks again.
    block: std::time::Duration,
}

/// Reads every partition of one source.
struct Partitioned {
    parts: Vec<RedisReceiver>,
    /// The partition first in line for the next call's permits.
    first: usize,
    settler: RedisSettler,
    /// With a rate limit: reserved before each read, what was not taken given back after.
    limit: Option<Limit>,
    stop: CancellationToken,
}

impl Partitioned {
    /// The open (not paused) partitions, the first in line first; the next call's line starts
    /// one further.
    fn line(&mut self) -> Vec<usize> {
        let n = self.parts.len();
        let line = (0..n)
            .map(|k| (self.first + k) % n)
            .filter(|&i| self.parts[i].is_open())
            .collect();
        self.first = (self.first + 1) % n.max(1);
        line
    }

    /// A read under the queue's rate limit (if any): reserve up to `max` passes from the
    /// limiter, read at most that many from the partitions, give back what was not taken.
    async fn receive(
        &mut self,
        max: usize,
        hurry: &CancellationToken,
    ) -> Result<Vec<Delivery<Token>>> {
        // Every partition paused: wait for a resume without holding passes.
        let open = self.parts.iter().any(RedisReceiver::is_open);
        let Some(limit) = self.limit.as_ref().filter(|_| open) else {
            return self.receive_parts(max, hurry).await;
        };
        let client = limit.pool.next().clone();
        let limiter = limit.limiter.clone();
        let (granted, wait) = Reserve {
            limiter: &limiter,
            want: max,
        }
        .call(&client)
        .await?;
        if granted == 0 {
            let held = Held { entries: 0, wait };
            held.wait(limiter.wait_cap(limit.block), &self.stop, hurry)
                .await;
            return Ok(Vec::new());
        }
        let got = self.receive_parts(granted, hurry).await;
        let used = got.as_ref().map_or(0, Vec::len);
        let refund = Refund {
            limiter: &limiter,
            unused: granted.saturating_sub(used),
        };
        let refunded = match refund.unused {
            0 => Ok(()),
            _ => refund.call(&client).await,
        };
        if let Err(e) = refunded {
            // The passes stay taken: the limit holds back more than it must, never less.
            tracing::warn!(limiter = %limiter.key, error = %e, "unused rate-limit passes not given back");
        }
        got
    }

    async fn receive_parts(
        &mut self,
        max: usize,
        hurry: &CancellationToken,
    ) -> Result<Vec<Delivery<Token>>> {
        let line = self.line();
        if line.is_empty() {
            // Every partition is paused: wait until one is resumed (or stopping), read nothing.
            let waits = self.parts.iter_mut().map(|p| Box::pin(p.wait_open()));
            futures::future::select_all(waits).await;
            return Ok(Vec::new());
        }
        // Each permit goes to one partition: with fewer permits than partitions, the first in
        // line share them and the others are asked in turn.
        let (shared, rest) = line.split_at(line.len().min(max));
        let now = CancellationToken::new();
        now.cancel();
        let got = self.read(shared, max, &now).await?;
        if !got.is_empty() {
            return Ok(got);
        }
        for &i in rest {
            let got = self.read(&[i], max, &now).await?;
            if !got.is_empty() {
                return Ok(got);
            }
        }
        // Nothing anywhere: wait on the shared ones; when some are left out, only for a moment.
        let round = hurry.child_token();
        let read = self.read(shared, max, &round);
        tokio::pin!(read);
        tokio::select! {
            got = &mut read => got,
            () = tokio::time::sleep(UNWATCHED_POLL), if !rest.is_empty() => {
                round.cancel();
                read.await
            }
        }
    }

    /// Reads the partitions `which` at once, `max` permits split between them; the first to
    /// find entries hurries the others. What any of them claimed is returned, even when another
    /// failed (it is claimed and must be handled); an error only when none found anything.
    async fn read(
        &mut self,
        which: &[usize],
        max: usize,
        hurry: &CancellationToken,
    ) -> Result<Vec<Delivery<Token>>> {
        let (each, extra) = (max / which.len(), max % which.len());
        let round = hurry.child_token();
        let mut reads: FuturesUnordered<_> = self
            .parts
            .iter_mut()
            .enumerate()
            .filter_map(|(i, part)| {
                let rank = which.iter().position(|&w| w == i)?;
                let share = each + usize::from(rank < extra);
                let round = &round;
                Some(async move { (i, part.receive_now(share, round).await) })
            })
            .collect();
        let mut out = Vec::new();
        let mut failed = None;
        while let Some((i, read)) = reads.next().await {
            match read {
                Ok(got) => {
                    if !got.is_empty() {
                        round.cancel();
                    }
                    out.extend(got.into_iter().map(|mut d| {
                        d.token.partition = i;
                        d
                    }));
                }
                Err(e) => {
                    tracing::warn!(partition = i, error = %e, "reading a partition failed");
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }
}

impl Receive for Partitioned {
    fn receive<'a>(
        &'a mut self,
        max: usize,
        hurry: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Vec<Delivery<Token>>>> {
        Box::pin(Partitioned::receive(self, max, hurry))
    }

    fn settler(&self) -> RedisSettler {
        self.settler.clone()
    }

    /// Up when every partition's connection is up.
    fn probe(&self) -> Option<ruststream_core::Probe> {
        let probes: Vec<_> = self.parts.iter().filter_map(Receiver::probe).collect();
        Some(std::sync::Arc::new(move || probes.iter().all(|p| p())))
    }

    /// Every partition's cancel signals, as one stream.
    fn cancel_signals(&mut self) -> Option<futures::stream::BoxStream<'static, String>> {
        let all: Vec<_> = self
            .parts
            .iter_mut()
            .filter_map(Receiver::cancel_signals)
            .collect();
        (!all.is_empty()).then(|| futures::StreamExt::boxed(futures::stream::select_all(all)))
    }
}

/// Settles each partition's deliveries with that partition's settler.
struct PartitionedSettle(Vec<RedisSettler>);

impl PartitionedSettle {
    fn part(&self, i: usize) -> Result<&RedisSettler> {
        self.0.get(i).ok_or_else(|| {
            Error::broker(
                ruststream_core::ErrorKind::Other,
                format!("a delivery names partition {i}, which this reader does not have"),
            )
        })
    }

    async fn settle(&self, batch: &[(Token, Settlement)]) -> Result<()> {
        let Some((first, _)) = batch.first() else {
            return Ok(());
        };
        if batch.iter().all(|(t, _)| t.partition == first.partition) {
            return self.part(first.partition)?.settle(batch).await;
        }
        let mut per: Vec<Vec<(Token, Settlement)>> = vec![Vec::new(); self.0.len()];
        for (token, settlement) in batch {
            self.part(token.partition)?;
            per[token.partition].push((token.clone(), settlement.clone()));
        }
        try_join_all(
            per.iter()
                .enumerate()
                .filter(|(_, b)| !b.is_empty())
                .map(|(i, b)| self.0[i].settle(b)),
        )
        .await?;
        Ok(())
    }
}

impl Settle for PartitionedSettle {
    fn settle<'a>(&'a self, batch: &'a [(Token, Settlement)]) -> BoxFuture<'a, Result<()>> {
        Box::pin(PartitionedSettle::settle(self, batch))
    }

    fn unsettled(&self) -> String {
        let parts: Vec<String> = self.0.iter().map(Settler::unsettled).collect();
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_key_always_picks_the_same_partition_and_none_goes_round() {
        let next = AtomicUsize::new(0);
        let a = pick(8, Some("customer-17"), &next);
        assert!((0..20).all(|_| pick(8, Some("customer-17"), &next) == a));
        let round: Vec<u16> = (0..8).map(|_| pick(4, None, &next)).collect();
        assert_eq!(round, [0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(key("jobs", 3), "{jobs:3}");
    }

    #[test]
    fn bad_partition_settings_say_what_to_change() {
        let refused = |key, n, named| {
            let e = validate(key, n, named).unwrap_err();
            let config = e.config_error().cloned().expect("a configuration error");
            assert_eq!(config.subject.as_deref(), Some(key), "{e}");
            config
        };
        let e = refused("jobs", 0, &[]);
        assert_eq!(e.option, "partitions");
        assert!(e.problem.contains("between 1 and"), "{e}");
        let e = refused("{jobs}", 4, &[]);
        assert_eq!(e.option, "partitions");
        assert!(e.problem.contains("`{jobs:0}` … `{jobs:3}`"), "{e}");
        let e = refused("jobs", 4, &["processing"]);
        assert_eq!(e.option, "processing");
        assert!(e.problem.contains("names one key"), "{e}");
        assert!(validate("jobs", 4, &[]).is_ok());
    }
}
