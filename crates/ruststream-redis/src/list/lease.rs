//! Leases: while a worker holds claims on a reliable list (handlers running, and entries claimed
//! ahead and waiting for a handler), a task of its own moves the scores of their batches'
//! members in the recovery set to now every `min_idle / 3` (`lease.lua`: `ZADD XX`; with a
//! `recovery_ttl`, `PEXPIRE` of the set and of every batch list in it, `ZRANGE`). A batch is
//! leased while any of its claims is held. So a
//! claim is idle longer than `min_idle` only when its worker is gone, and the sweep never takes
//! work from a live one: `min_idle` is how long a dead worker's work takes to come back.
//!
//! The reader adds what it claims ([`Leases::hold`]); the settler lets a claim go once its
//! settle was sent ([`Leases::release`]), whatever came of it, so a claim whose settle keeps
//! failing is left to the sweep rather than kept alive for ever: once the other claims of its
//! batch are let go too (a batch is one member), `min_idle` after the last of them.
//!
//! After a reconnect (or a failed renewal) the reader renews on its own connection before its
//! next sweep ([`Leases::renew`], see `crate::rejoin`).
//!
//! A renewal is sent as `EVAL` with the script's text, so it is one command even where Redis has
//! not cached the script (see [`Lease`]'s `call`).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_core::Result;

use crate::lua::{self, Call};
use crate::rejoin::Rejoin;

static LEASE: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("lease.lua")));

/// Most members one `lease.lua` call carries.
const LEASE_BATCH: usize = 2048;

/// One call of `lease.lua`: moves the scores of claims still in a recovery set to now.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease<'a> {
    /// The recovery set (full name).
    pub zset: &'a str,
    /// The recovery set's ttl in ms (0 = none).
    pub ttl_ms: u64,
    /// The claimed batches' members, each once.
    pub members: &'a [Bytes],
}

impl Call for Lease<'_> {
    /// How many scores moved.
    type Reply = u64;

    fn script(&self) -> &'static Script {
        &LEASE
    }

    /// KEYS and ARGV: see `lease.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        let mut args = Vec::with_capacity(self.members.len() + 1);
        args.push(Value::from(self.ttl_ms.to_string()));
        args.extend(self.members.iter().cloned().map(Value::Bytes));
        (vec![self.zset.to_owned()], args)
    }

    fn parse(&self, reply: Value) -> u64 {
        lua::reply_u64(&reply)
    }

    /// `EVAL` with the script's text, not `EVALSHA`: a renewal must reach Redis as one command
    /// whatever its script cache holds. A renewal queued behind a frozen server runs at the thaw
    /// before the reader's next sweep, which waits for its read's reply; but an `EVALSHA` that
    /// got `NOSCRIPT` (the first renewal since Redis started) took two more round trips, `SCRIPT
    /// LOAD` and `EVALSHA` again, and that sweep ran between them and took the live claims.
    #[allow(
        clippy::manual_async_fn,
        reason = "an `async fn` here cannot meet the trait's `Self: Sync` for every lifetime of `Lease`"
    )]
    fn call(&self, client: &Client) -> impl Future<Output = Result<u64>> + Send
    where
        Self: Sync,
    {
        async move {
            let (keys, args) = self.build();
            let reply: Value = match LEASE.lua() {
                Some(text) => client.eval(text.clone(), keys, args).await,
                None => LEASE.evalsha_with_reload(client, keys, args).await,
            }
            .map_err(|e| crate::lua::script_error(&LEASE, e))?;
            Ok(self.parse(reply))
        }
    }
}

/// The claims a reader holds: claim sequence number → its batch's recovery-set member.
#[derive(Debug, Default)]
pub(super) struct Leases(Mutex<HashMap<u64, Bytes>>);

impl Leases {
    /// Holds the claims `(seq, member)`.
    pub(super) fn hold(&self, claims: impl IntoIterator<Item = (u64, Bytes)>) {
        self.held().extend(claims);
    }

    /// Lets the claims `seqs` go.
    pub(super) fn release(&self, seqs: impl IntoIterator<Item = u64>) {
        let mut held = self.held();
        for seq in seqs {
            held.remove(&seq);
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Bytes>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Renews every held claim's lease in the recovery set `zset`, on `client`.
    pub(super) async fn renew(&self, client: &Client, zset: &str, ttl_ms: u64) -> Result<()> {
        let members: Vec<Bytes> = {
            let held = self.held();
            let unique: std::collections::HashSet<&Bytes> = held.values().collect();
            unique.into_iter().cloned().collect()
        };
        for chunk in members.chunks(LEASE_BATCH) {
            let lease = Lease {
                zset,
                ttl_ms,
                members: chunk,
            };
            lease.call(client).await?;
        }
        Ok(())
    }

    /// Renews `leases` in the recovery set `zset` every `every`, until the reader and its
    /// settler are gone; a failed renewal marks `rejoin`, so the reader renews before it sweeps.
    pub(super) fn spawn_renewal(
        leases: &Arc<Self>,
        pool: Pool,
        zset: String,
        ttl_ms: u64,
        every: Duration,
        rejoin: Arc<Rejoin>,
    ) {
        let leases: Weak<Self> = Arc::downgrade(leases);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(held) = leases.upgrade() else { break };
                if let Err(e) = held.renew(pool.next(), &zset, ttl_ms).await {
                    if e.kind() == ruststream_core::ErrorKind::Unsupported {
                        tracing::error!(recovery_set = %zset, error = %e,
                            "the server refused the lease renewal; claims are no longer renewed and come back after min_idle");
                        break;
                    }
                    rejoin.mark();
                    tracing::warn!(recovery_set = %zset, error = %e,
                        "claims not renewed; they may be recovered by another worker if this goes on past min_idle");
                }
            }
        });
    }
}
