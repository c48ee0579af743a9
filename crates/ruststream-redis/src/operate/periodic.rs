//! Periodic jobs as the instances registered them, with their last and next ticks: `HGETALL`
//! of the registry and of the last-tick hash, `TIME`.

use fred::prelude::*;
use ruststream_core::Result;
use ruststream_core::periodic::{CatchUp, PeriodicInfo, Schedule};
use serde::Serialize;

use super::Operator;
use crate::error::core;

/// One periodic job of the broker's key space.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct PeriodicJob {
    /// Its name.
    pub name: String,
    /// The cron expression.
    pub cron: String,
    /// The time zone.
    pub tz: String,
    /// Where its messages go (`None`: the message type's own name).
    pub destination: Option<String>,
    /// Its catch-up policy.
    pub catch_up: CatchUp,
    /// The last tick fired by any instance, in ms since the epoch.
    pub last_ms: Option<i64>,
    /// How long ago the last tick was, in ms (on the server's clock).
    pub last_ago_ms: Option<i64>,
    /// The next tick after now (the server's clock), in ms since the epoch.
    pub next_ms: Option<i64>,
    /// How long until the next tick, in ms.
    pub next_in_ms: Option<i64>,
    /// What the registry holds when it is not a definition this version reads.
    pub unreadable: Option<String>,
}

impl Operator {
    /// Every periodic job registered under this broker's prefix (by any instance, of any app
    /// sharing the prefix), by name.
    pub async fn periodic(&self) -> Result<Vec<PeriodicJob>> {
        let client = self.conns.pool()?.next().clone();
        let [registry, last, _] = crate::periodic::keys(&self.conns.keys);
        let now = super::inspect::server_ms(&client).await?;
        let defs: Vec<(String, String)> = client.hgetall(&registry).await.map_err(core)?;
        let lasts: std::collections::HashMap<String, i64> =
            client.hgetall(&last).await.map_err(core)?;
        let mut jobs: Vec<PeriodicJob> = defs
            .into_iter()
            .map(|(name, def)| {
                let last_ms = lasts.get(&name).copied();
                match serde_json::from_str::<PeriodicInfo>(&def) {
                    Ok(info) => {
                        let next_ms = Schedule::parse(&info.cron, &info.tz)
                            .ok()
                            .and_then(|s| s.next_after(u64::try_from(now).unwrap_or(0)))
                            .and_then(|t| i64::try_from(t).ok());
                        PeriodicJob {
                            name,
                            cron: info.cron,
                            tz: info.tz,
                            destination: info.destination,
                            catch_up: info.catch_up,
                            last_ms,
                            last_ago_ms: last_ms.map(|t| now - t),
                            next_ms,
                            next_in_ms: next_ms.map(|t| t - now),
                            unreadable: None,
                        }
                    }
                    Err(e) => PeriodicJob {
                        name,
                        cron: String::new(),
                        tz: String::new(),
                        destination: None,
                        catch_up: CatchUp::Skip,
                        last_ms,
                        last_ago_ms: last_ms.map(|t| now - t),
                        next_ms: None,
                        next_in_ms: None,
                        unreadable: Some(format!("{e}: {def}")),
                    },
                }
            })
            .collect();
        jobs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(jobs)
    }
}
