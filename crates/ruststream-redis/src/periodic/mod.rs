//! Periodic jobs' state in Redis, shared by every instance of a service (see
//! [`ruststream_core::periodic`]): the registry of job definitions, for operators, and each
//! job's last fired tick, for the catch-up policy.
//!
//! Keys (prefixed): `ruststream:periodic`, a hash of job name → definition (JSON); and
//! `ruststream:periodic.last` (`{ruststream:periodic}.last` on a cluster, in the registry's
//! slot), a hash of job name → last fired tick in epoch ms.
//!
//! Commands: `register.lua` (`HSET` the definition, `HGET` the last tick) when the app starts;
//! `fired.lua` (`HGET`, then `HSET` only when the tick is later) after each tick's publish. The
//! tick's message itself goes through the broker's publisher, unique per tick. The operator's
//! listing reads both hashes with `HGETALL`.

use std::sync::{Arc, LazyLock};

use fred::prelude::*;
use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::periodic::{PeriodicInfo, PeriodicStore};
use ruststream_core::{Error, Result};

use crate::conn::Connections;
use crate::keys::KeySpace;
use crate::lua::{self, Call};

static REGISTER: LazyLock<Script> =
    LazyLock::new(|| lua::script(include_str!("register.lua"), &[lua::GUARD]));
static FIRED: LazyLock<Script> =
    LazyLock::new(|| lua::script(include_str!("fired.lua"), &[lua::GUARD]));

/// The registry hash and the last-tick hash of a key space.
pub(crate) fn keys(keys: &KeySpace) -> [String; 2] {
    let registry = keys.key("ruststream:periodic");
    let last = keys.derived(&registry, ".last");
    [registry, last]
}

/// One call of `register.lua`: writes a periodic job's definition into the registry and reads
/// its last fired tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterPeriodic<'a> {
    /// The registry hash (full name).
    pub registry: &'a str,
    /// The last-tick hash (full name).
    pub last: &'a str,
    /// The job's name.
    pub name: &'a str,
    /// The job's definition (JSON).
    pub definition: &'a str,
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
            vec![self.registry.to_owned(), self.last.to_owned()],
            vec![self.name.into(), self.definition.into()],
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
    /// The last-tick hash (full name).
    pub last: &'a str,
    /// The job's name.
    pub name: &'a str,
    /// The tick, in epoch ms.
    pub tick: u64,
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
            vec![self.last.to_owned()],
            vec![self.name.into(), self.tick.to_string().into()],
        )
    }

    fn parse(&self, reply: Value) -> bool {
        lua::reply_u64(&reply) == 1
    }
}

/// The Redis broker's [`PeriodicStore`].
pub(crate) struct Store {
    pub(crate) conns: Arc<Connections>,
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
            let [registry, last] = keys(&self.conns.keys);
            let register = RegisterPeriodic {
                registry: &registry,
                last: &last,
                name: &job.name,
                definition: &definition,
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
            let [_, last] = keys(&self.conns.keys);
            let fired = PeriodicFired {
                last: &last,
                name,
                tick,
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
