//! The pubsub scenario, run by the parent: a subscribed child, and this process publishing.

use std::time::Duration;

use fred::prelude::*;

use crate::common::{Config, Scenario, Tuning, per_s};
use crate::inspect::{calls_per_msg, command_calls, leftovers};
use crate::line::{Line, take_consumer};
use crate::running::{Running, Spec};
use crate::{BoxError, Ctx, KEY, Role, child, raw};

/// The pubsub scenario: a consumer child subscribes to channel `q` (`RedisChannel::new`), then
/// this process publishes N messages to it in batches; lost = ids the handler never saw (Pub/Sub
/// is at most once: a message Redis drops when it disconnects a subscriber past its output
/// buffer limit is gone; such disconnects are counted as `disconnects`).
pub(crate) async fn run(
    ctx: &Ctx<'_>,
    c: Config,
    tuning: &Tuning,
    prefix: &str,
    raw_key: &str,
    line: &mut Line,
) -> Result<(), BoxError> {
    let n = ctx.cli.n;
    let s = Scenario::Pubsub;
    let channel = format!("{prefix}{KEY}");
    let running = Running::spawn(ctx, Spec::new(Role::Consumer, s, c, n, prefix)).await?;
    // The child prints READY once its app started, i.e. once SUBSCRIBE was confirmed; check.
    let t = std::time::Instant::now();
    while numsub(&ctx.raw, &channel).await? < 1 {
        if t.elapsed() > Duration::from_secs(10) {
            return Err("the consumer did not subscribe within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let broker =
        child::broker(&ctx.target, prefix, tuning).route(KEY, ruststream::pubsub::Publish::new());
    broker.connect().await?;
    let before = command_calls(&ctx.raw).await?;
    let (fill, _) = child::publish_batches(&broker.publisher(), KEY, n, tuning, None).await?;
    line.publish_per_s = Some(per_s(n, fill));
    let st = running.stats().await?;
    let after = command_calls(&ctx.raw).await?;
    ruststream_core::Broker::close(&broker).await;
    take_consumer(line, n, &st);
    line.extra("lagged", st.u("lagged").unwrap_or(0));
    line.extra("disconnects", st.u("disconnects").unwrap_or(0));
    line.extra("calls_per_msg", calls_per_msg(&before, &after, n));
    line.extra("left", leftovers(&ctx.raw, prefix).await?);
    if !ctx.cli.no_baseline {
        // The ceiling: a buffer no burst of this run overflows, whatever the app's.
        let buffer = tuning.buffer.unwrap_or(0).max(raw::PUBSUB_BUFFER);
        let out = raw::pubsub(
            &ctx.cli.redis,
            &ctx.raw,
            raw_key,
            n,
            buffer,
            child::PUBSUB_QUIET,
        )
        .await?;
        line.baseline_per_s = Some(out.per_s);
        line.extra("baseline_seen", out.seen);
        line.extra("baseline_lagged", out.lagged);
    }
    Ok(())
}

/// `PUBSUB NUMSUB channel`: its subscribers.
pub(crate) async fn numsub(raw: &Client, channel: &str) -> Result<i64, BoxError> {
    let reply: Vec<Value> = raw
        .custom(raw::cmd("PUBSUB"), vec!["NUMSUB", channel])
        .await?;
    Ok(reply.get(1).and_then(Value::as_i64).unwrap_or(0))
}
