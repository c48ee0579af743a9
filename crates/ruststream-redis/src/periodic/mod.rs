//! Periodic jobs' state in Redis, shared by every instance of a service (see
//! [`ruststream_core::periodic`]): the registry of job definitions, for operators, and each
//! job's last fired tick, for the catch-up policy.
//!
//! Keys (prefixed): `ruststream:periodic`, a hash of job name → definition (JSON);
//! `ruststream:periodic.last` (`{ruststream:periodic}.last` on a cluster, in the registry's
//! slot), a hash of job name → last fired tick in epoch ms; and `ruststream:periodic.seen` (in
//! the same slot), a hash of job name → the epoch ms until which it is kept: [`keep_of`] after
//! an instance last registered it or fired one of its ticks. A job removed from the code is no
//! longer seen, and the next registration or tick of any job forgets its three fields
//! (`forget.lua`), so the registry holds the jobs of the running code and of the last
//! [`keep_of`].
//!
//! Commands: `register.lua` (`HSET` the definition, `HGET` the last tick) when the app starts;
//! `fired.lua` (`HGET`, then `HSET` only when the tick is later) after each tick's publish; both
//! `HSET` the job's seen field, read the seen hash (`HGETALL`) and the registry's names (`HKEYS`)
//! and `HDEL` the jobs not seen for their bound. The tick's message itself goes through the
//! broker's publisher, unique per tick. The operator's listing reads the registry and last-tick
//! hashes with `HGETALL`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::periodic::{PeriodicInfo, PeriodicStore, Schedule};
use ruststream_core::{Error, Result};

use crate::conn::Connections;
use crate::keys::KeySpace;
use crate::lua::{self, Call};

static REGISTER: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("register.lua")));
static FIRED: LazyLock<Script> = LazyLock::new(|| lua::script(include_str!("fired.lua")));

/// The least time a job is kept after an instance last registered it or fired one of its
/// ticks: a week, so a job an operator removed is gone from the listing a week later, and one
/// whose service is down over a long weekend keeps its last tick for its catch-up.
pub const PERIODIC_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long the job of `cron` in the zone `tz` is kept after it was last seen: three times the
/// gap between its next two ticks, at least [`PERIODIC_KEEP`] (a monthly job is kept three
/// months, since a live instance sees it once a tick; an expression that does not parse, or
/// whose ticks are over, gets the least).
pub fn keep_of(cron: &str, tz: &str) -> Duration {
    let gap = Schedule::parse(cron, tz).ok().and_then(|s| {
        let now = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_millis(),
        )
        .ok()?;
        let first = s.next_after(now)?;
        let second = s.next_after(first)?;
        Some(Duration::from_millis(second.saturating_sub(first)))
    });
    gap.map_or(PERIODIC_KEEP, |g| (g * 3).max(PERIODIC_KEEP))
}

/// The registry hash, the last-tick hash and the seen hash of a key space.
pub(crate) fn keys(keys: &KeySpace) -> [String; 3] {
    let registry = keys.key("ruststream:periodic");
    let last = keys.derived(&registry, ".last");
    let seen = keys.derived(&registry, ".seen");
    [registry, last, seen]
}

fn millis(d: Duration) -> Value {
    Value::from(u64::try_from(d.as_millis()).unwrap_or(u64::MAX).to_string())
}

/// One call of `register.lua`: writes a periodic job's definition into the registry and reads
/// its last fired tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterPeriodic<'a> {
    /// The registry hash (full name).
    pub registry: &'a str,
    /// The last-tick hash (full name).
    pub last: &'a str,
    /// The seen hash (full name).
    pub seen: &'a str,
    /// The job's name.
    pub name: &'a str,
    /// The job's definition (JSON).
    pub definition: &'a str,
    /// How long it is kept after it was last seen ([`keep_of`]).
    pub keep: Duration,
}

impl Call for RegisterPeriodic<'_> {
    /// The job's last fired tick in epoch ms, or `None` when it never fired.
    type Reply = Option<u64>;

    fn script(&self) -> &'static Script {
        &REGISTER
    }

    /// KEYS and ARGV: see `register.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        (
            vec![
                self.registry.to_owned(),
                self.last.to_owned(),
                self.seen.to_owned(),
            ],
            vec![self.name.into(), self.definition.into(), millis(self.keep)],
        )
    }

    fn parse(&self, reply: Value) -> Option<u64> {
        reply.as_str()?.parse().ok()
    }
}

/// One call of `fired.lua`: records that a periodic job's tick was published, unless a later
/// or equal one is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeriodicFired<'a> {
    /// The registry hash (full name).
    pub registry: &'a str,
    /// The last-tick hash (full name).
    pub last: &'a str,
    /// The seen hash (full name).
    pub seen: &'a str,
    /// The job's name.
    pub name: &'a str,
    /// The tick, in epoch ms.
    pub tick: u64,
    /// How long it is kept after it was last seen ([`keep_of`]).
    pub keep: Duration,
}

impl Call for PeriodicFired<'_> {
    /// Whether the stored tick moved.
    type Reply = bool;

    fn script(&self) -> &'static Script {
        &FIRED
    }

    /// KEYS and ARGV: see `fired.lua`'s header.
    fn build(&self) -> (Vec<String>, Vec<Value>) {
        (
            vec![
                self.registry.to_owned(),
                self.last.to_owned(),
                self.seen.to_owned(),
            ],
            vec![
                self.name.into(),
                self.tick.to_string().into(),
                millis(self.keep),
            ],
        )
    }

    fn parse(&self, reply: Value) -> bool {
        lua::reply_u64(&reply) == 1
    }
}

/// The Redis broker's [`PeriodicStore`].
pub(crate) struct Store {
    pub(crate) conns: Arc<Connections>,
    /// Each registered job's keep time ([`keep_of`]), for its ticks' `fired.lua`.
    pub(crate) keeps: Mutex<HashMap<String, Duration>>,
}

impl Store {
    pub(crate) fn new(conns: Arc<Connections>) -> Self {
        Self {
            conns,
            keeps: Mutex::default(),
        }
    }

    fn keep(&self, name: &str) -> Duration {
        self.keeps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .copied()
            .unwrap_or(PERIODIC_KEEP)
    }
}

impl PeriodicStore for Store {
    fn now_ms(&self) -> u64 {
        self.conns.memory.clock_ms()
    }

    fn register<'a>(&'a self, job: &'a PeriodicInfo) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(async move {
            let definition =
                serde_json::to_string(job).map_err(|e| Error::Encode(e.to_string()))?;
            let client = self.conns.pool()?.next().clone();
            let [registry, last, seen] = keys(&self.conns.keys);
            let keep = keep_of(&job.cron, &job.tz);
            self.keeps
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(job.name.clone(), keep);
            let register = RegisterPeriodic {
                registry: &registry,
                last: &last,
                seen: &seen,
                name: &job.name,
                definition: &definition,
                keep,
            };
            register
                .call(&client)
                .await
                .map_err(|e| registry_error(&job.name, e))
        })
    }

    fn fired<'a>(&'a self, name: &'a str, tick: u64) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let client = self.conns.pool()?.next().clone();
            let [registry, last, seen] = keys(&self.conns.keys);
            let fired = PeriodicFired {
                registry: &registry,
                last: &last,
                seen: &seen,
                name,
                tick,
                keep: self.keep(name),
            };
            fired.call(&client).await?;
            Ok(())
        })
    }
}

/// `e` with the job `name` it failed to register, of the same kind and source.
fn registry_error(name: &str, e: Error) -> Error {
    let message = format!("periodic `{name}`: cannot register the job: {e}");
    match e {
        Error::Broker {
            kind,
            source: Some(source),
            ..
        } => Error::broker_from(kind, message, source),
        other => Error::broker(other.kind(), message),
    }
}
