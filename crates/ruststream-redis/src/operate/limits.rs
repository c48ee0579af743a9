//! A subscription's rate limit in use now: the limiter (`K.rate`, a GCRA's theoretical arrival
//! time in µs; or `K.rate.keys`, one per key, see `claim/limit.lua`) read as how many of its `n`
//! permits are spent at this moment. Commands: `TIME`, then `GET`, or `ZCARD` and
//! `ZRANGE .. REV LIMIT` of the [`KEYS_SHOWN`] busiest keys.

use fred::prelude::*;
use ruststream_core::Result;
use serde::Serialize;

use super::Operator;
use crate::error::core;
use crate::keys::RateKeys;

/// Most keys of a per-key limit shown, the busiest first.
pub const KEYS_SHOWN: usize = 10;

/// A rate limit and how much of it is spent now.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RateUse {
    /// The limit.
    pub limit: RateKeys,
    /// Whole-queue limit: permits spent now, of `n` (what passed in the last `per`, as the GCRA
    /// counts it).
    pub used: u32,
    /// Per-key limit: keys that passed within the last period.
    pub keys: u64,
    /// Per-key limit: the busiest keys and the permits each spent, of `n`.
    pub busiest: Vec<(String, u32)>,
}

/// Permits spent of a GCRA limit whose theoretical arrival time is `tat_us` at `now_us`.
fn spent(tat_us: f64, now_us: f64, limit: &RateKeys) -> u32 {
    let per_us = limit.per_ms as f64 * 1000.0;
    let step = per_us / f64::from(limit.n.max(1));
    if tat_us <= now_us || step <= 0.0 {
        return 0;
    }
    let used = ((tat_us - now_us) / step).ceil();
    used.min(f64::from(limit.n)) as u32
}

impl Operator {
    /// The rate limit of the subscription `name` in use now; `None` when it has none.
    pub async fn rate_use(&self, name: &str) -> Result<Option<RateUse>> {
        let q = self.queue(name)?;
        let Some(limit) = q.rate_limit.clone() else {
            return Ok(None);
        };
        let client = self.conns.pool()?.next().clone();
        let now = super::inspect::server_ms(&client).await? as f64 * 1000.0;
        if limit.by_header.is_none() {
            let tat: Option<String> = client.get(&limit.key).await.map_err(core)?;
            let used = tat
                .and_then(|t| t.parse::<f64>().ok())
                .map_or(0, |t| spent(t, now, &limit));
            return Ok(Some(RateUse {
                limit,
                used,
                keys: 0,
                busiest: Vec::new(),
            }));
        }
        let most = i64::try_from(KEYS_SHOWN).unwrap_or(10) - 1;
        let top: Vec<(String, f64)> = client
            .zrange(&limit.key, 0, most, None, true, None, true)
            .await
            .map_err(core)?;
        let keys: u64 = client
            .zcount(&limit.key, now, f64::INFINITY)
            .await
            .map_err(core)?;
        let busiest = top
            .into_iter()
            .map(|(k, tat)| {
                let used = spent(tat, now, &limit);
                (k, used)
            })
            .filter(|(_, used)| *used > 0)
            .collect();
        Ok(Some(RateUse {
            limit,
            used: 0,
            keys,
            busiest,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tat_ahead_of_now_is_the_permits_spent() {
        let limit = RateKeys {
            n: 10,
            per_ms: 1000,
            by_header: None,
            key: "k".into(),
        };
        assert_eq!(spent(0.0, 5.0, &limit), 0, "idle");
        assert_eq!(spent(1_300_000.0, 1_000_000.0, &limit), 3);
        assert_eq!(
            spent(1_000_300.0, 1_000_000.0, &limit),
            1,
            "a part of a step is one"
        );
        assert_eq!(spent(9e12, 0.0, &limit), 10, "at most n");
    }
}
