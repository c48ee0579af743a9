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

use fred::types::scripts::Script;
use futures::future::BoxFuture;
use ruststream_core::periodic::{PeriodicInfo, PeriodicStore};
use ruststream_core::{Error, Result};

use crate::conn::Connections;
use crate::error::core;
use crate::keys::KeySpace;
use crate::lua;

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
            let last: Option<String> = REGISTER
                .evalsha_with_reload(
                    &client,
                    keys(&self.conns.keys).to_vec(),
                    vec![job.name.clone(), definition],
                )
                .await
                .map_err(|e| registry_error(&job.name, e))?;
            Ok(last.and_then(|t| t.parse().ok()))
        })
    }

    fn fired<'a>(&'a self, name: &'a str, tick: u64) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let client = self.conns.pool()?.next().clone();
            let [_, last] = keys(&self.conns.keys);
            let _: i64 = FIRED
                .evalsha_with_reload(&client, vec![last], vec![name.to_owned(), tick.to_string()])
                .await
                .map_err(core)?;
            Ok(())
        })
    }
}

fn registry_error(name: &str, e: fred::error::Error) -> Error {
    let message = format!(
        "periodic `{name}`: cannot register the job: {}",
        core(e.clone())
    );
    crate::error::core_as(e, message)
}
