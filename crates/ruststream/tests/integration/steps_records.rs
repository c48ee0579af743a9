//! A message's step record goes with the message, also when its last run reaches no step: an
//! earlier attempt records a step, the last attempt fails before its first step, and the dead
//! letter's settle removes the record. On a reliable list and a stream group, on the model and
//! on Redis.

use crate::harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use harness::{Env, WAIT, on, wait_until};
use ruststream::Source;
use ruststream::prelude::*;

use super::steps::{Order, start};

on!(
    [memory, standalone, cluster] multi_thread:
    a_dead_letter_without_a_step_in_its_last_run_removes_the_record,
    a_stream_dead_letter_without_a_step_in_its_last_run_removes_the_record,
);

/// Records a `charge` step at attempt 1, then fails; at every later attempt fails before any
/// step.
#[derive(Clone, Default)]
struct ChargeThenFail {
    calls: Arc<AtomicU32>,
}

impl Handle<Order> for ChargeThenFail {
    async fn handle(&self, _: &Order, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if ctx.attempt() == 1 {
            ctx.step("charge", || async { Ok::<_, String>(1) }).await?;
        }
        Err(HandlerOutcome::retry())
    }
}

/// Publishes one order (id `order-1`) to `source` read by [`ChargeThenFail`] with two attempts;
/// waits for its dead letter; returns how often the handler ran.
async fn dead_after_two(
    env: &Env,
    source: impl Source<Broker = RedisBroker>,
    producer: RedisBroker,
    to: &str,
) -> u32 {
    let handler = ChargeThenFail::default();
    let running = start(env, source, &producer, to, &handler).await;
    let dead = format!("{to}.dead");
    wait_until("the dead letter", WAIT, async || env.llen(&dead).await == 1).await;
    env.stop(running).await;
    handler.calls.load(Ordering::SeqCst)
}

async fn a_dead_letter_without_a_step_in_its_last_run_removes_the_record(env: &Env) {
    let list = RedisList::new("{sr}")
        .reliable()
        .max_attempts(2)
        .retry(Backoff::fixed(Duration::from_millis(20)));
    let calls = dead_after_two(env, list, env.broker(), "{sr}").await;
    assert_eq!(calls, 2, "two attempts");
    assert!(
        !env.exists("{sr}.steps:order-1").await,
        "the dead letter's settle removed the record of the first attempt's step"
    );
}

async fn a_stream_dead_letter_without_a_step_in_its_last_run_removes_the_record(env: &Env) {
    let stream = RedisStream::new("{ssr}")
        .group("g")
        .max_attempts(2)
        .retry(Backoff::fixed(Duration::from_millis(20)));
    let producer = env.broker_with(|b| b.route("{ssr}", ruststream::stream::Publish::new()));
    let calls = dead_after_two(env, stream, producer, "{ssr}").await;
    assert_eq!(calls, 2, "two attempts");
    assert!(
        !env.exists("{ssr}.steps:order-1").await,
        "the dead letter's settle removed the record of the first attempt's step"
    );
}
