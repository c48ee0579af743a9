//! The `rate-limit` and `rate-limit-key` scenarios: the `reliable` scenario's queue (a reliable
//! list without crash recovery, 512 claims a read) with a rate limit so high that it never holds a
//! message back, so the difference to `reliable` is what the limiter costs per message: in
//! `claim.lua`, `TIME`, `GET`/`SET` of `q.rate` once per claim (`rate-limit`), or per key a scan
//! of each claimed frame's headers and `ZSCORE`/`ZADD` of `q.rate.keys` (`rate-limit-key`; the
//! bench's messages have no `customer` header, so all share one key).

use std::time::Duration;

use ruststream::prelude::*;

use crate::common::Scenario;

/// The limit: never reached (the most a `u32` holds per second).
const NEVER: u32 = u32::MAX;

/// The header a `rate-limit-key` message's key would be in.
const KEY_HEADER: &str = "customer";

/// The limited queue of `scenario` on `key`.
pub fn source(scenario: Scenario, key: &str) -> RedisList {
    let list = RedisList::new(key).reliable().no_recovery();
    match scenario {
        Scenario::RateLimitKey => list.rate_limit_by(KEY_HEADER, NEVER, Duration::from_secs(1)),
        _ => list.rate_limit(NEVER, Duration::from_secs(1)),
    }
}
