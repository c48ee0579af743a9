//! The `priorities` scenario: the `reliable` scenario on a queue with [`LEVELS`] priority levels
//! (`RedisList::priorities`), its messages spread evenly over the levels (each publish call's
//! chunk on the next level), so the difference from `reliable` is what the levels cost per
//! message: the claim script walking the levels, one `LPUSH` per level and chunk, and the
//! `rs.priority` header in every frame above level 0.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use ruststream::prelude::*;
use ruststream::redis::list;
use ruststream_core::Publisher;

use crate::BoxError;
use crate::common::{Msg, Tuning};

/// The levels of the scenario's queue.
pub const LEVELS: u8 = 4;

/// The scenario's subscription: `reliable`'s (no crash recovery) with the levels.
pub fn source(key: &str) -> RedisList {
    RedisList::new(key)
        .reliable()
        .no_recovery()
        .priorities(LEVELS)
}

/// The publisher's route to the queue, so it knows the levels.
pub fn route(broker: RedisBroker, key: &str) -> RedisBroker {
    broker.route(key, list::Publish::new().priorities(LEVELS))
}

/// Publishes `0..n` to `key` as `child::publish_batches` does, chunk `i` on level `i % LEVELS`;
/// returns the elapsed time.
pub async fn fill(
    publisher: &Publisher,
    key: &str,
    n: u64,
    tuning: &Tuning,
) -> Result<Duration, BoxError> {
    let chunk = tuning.chunk as u64;
    let t0 = Instant::now();
    futures::stream::iter((0..n).step_by(tuning.chunk))
        .map(|first| async move {
            let msgs: Vec<Msg> = (first..(first + chunk).min(n))
                .map(|i| Msg::new(i, 0))
                .collect();
            let level = u8::try_from((first / chunk) % u64::from(LEVELS)).unwrap_or(0);
            publisher
                .messages(&msgs)
                .to(key)
                .priority(level)
                .publish()
                .await?;
            Ok::<(), BoxError>(())
        })
        .buffer_unordered(tuning.in_flight)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(t0.elapsed())
}
