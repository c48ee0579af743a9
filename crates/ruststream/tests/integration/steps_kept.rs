//! `keep_steps(d)`: the settle that acknowledges or dead-letters a message keeps its step record
//! for `d` instead of deleting it, with each step's timing (`t:<name>`). An operator sees a
//! finished message's steps, and a dead letter requeued within `d` replays its recorded steps.
//! On a reliable list and a stream group; the ack on the model and on Redis, the requeue
//! through the operator on Redis.

use crate::harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use harness::{Env, WAIT, on, wait_until};
use ruststream::operate::operators;
use ruststream::prelude::*;
use ruststream::redis::operate::Select;
use ruststream::{Source, subscriber};

use super::steps::Order;

on!(
    [memory, standalone, cluster] multi_thread:
    an_ack_keeps_the_step_record_for_keep_steps,
    a_stream_ack_keeps_the_step_record_for_keep_steps,
);

on!(
    [standalone, cluster] multi_thread:
    a_requeued_dead_letter_replays_its_kept_steps,
    a_requeued_stream_dead_letter_replays_its_kept_steps,
);

/// How long the tests keep a record.
const KEEP: Duration = Duration::from_secs(60);

/// Runs a `charge` step (counting its closure's runs), then drops the message (to its dead
/// letters) while `broken`, else acknowledges it (counting the acks).
#[derive(Clone, Default)]
struct Charge {
    charges: Arc<AtomicU32>,
    acks: Arc<AtomicU32>,
    broken: Arc<AtomicBool>,
}

impl Handle<Order> for Charge {
    async fn handle(&self, _: &Order, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        ctx.step("charge", || async {
            self.charges.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>("paid".to_owned())
        })
        .await?;
        if self.broken.load(Ordering::SeqCst) {
            return Err(HandlerOutcome::drop());
        }
        self.acks.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// The record `record` exists with an expiry of at most [`KEEP`], and holds the step and its
/// timing.
async fn kept(env: &Env, record: &str) {
    let ttl = env.pttl(record).await;
    assert!(
        ttl > 0 && ttl <= i64::try_from(KEEP.as_millis()).expect("ms"),
        "the record is kept for at most keep_steps: PTTL {ttl}"
    );
    assert_eq!(
        env.hlen(record).await,
        2,
        "`charge` and its timing `t:charge`"
    );
}

/// Publishes order `order-1` to `to` read from `source` by `handler`; waits until `done`.
async fn run_one(
    env: &Env,
    source: impl Source<Broker = RedisBroker>,
    producer: &RedisBroker,
    to: &str,
    handler: &Charge,
) {
    let running = super::steps::start(env, source, producer, to, handler).await;
    wait_until("the ack", WAIT, async || {
        handler.acks.load(Ordering::SeqCst) == 1
    })
    .await;
    env.stop(running).await;
}

async fn an_ack_keeps_the_step_record_for_keep_steps(env: &Env) {
    let handler = Charge::default();
    let list = RedisList::new("{sk}").reliable().keep_steps(KEEP);
    run_one(env, list, &env.broker(), "{sk}", &handler).await;
    kept(env, "{sk}.steps:order-1").await;
}

async fn a_stream_ack_keeps_the_step_record_for_keep_steps(env: &Env) {
    let handler = Charge::default();
    let stream = RedisStream::new("{sks}").group("g").keep_steps(KEEP);
    let producer = env.broker_with(|b| b.route("{sks}", ruststream::stream::Publish::new()));
    run_one(env, stream, &producer, "{sks}", &handler).await;
    kept(env, "{sks}.steps:order-1").await;
}

/// Runs `source` with a broken [`Charge`] until order `order-1` is a dead letter of `to`, checks
/// its record is kept, fixes the handler and requeues the letter through the operator: the
/// requeued message replays `charge` (its closure ran once in all) and is acknowledged.
async fn requeue_replays(
    env: &Env,
    source: impl Source<Broker = RedisBroker> + 'static,
    producer: RedisBroker,
    to: &str,
) {
    let handler = Charge::default();
    handler.broken.store(true, Ordering::SeqCst);
    let h = handler.clone();
    let app = env.app(move |b| {
        b.include(subscriber(source, h).build());
    });
    let op = operators(&app).pop().expect("the app has a Redis broker");
    op.connect().await.expect("the operator connects");
    let running = env.start(app).await;
    producer.connect().await.expect("connect");
    producer
        .publisher()
        .message(&super::steps::order(7))
        .to(to)
        .id("order-1")
        .publish()
        .await
        .expect("publish");
    let dead = format!("{to}.dead");
    wait_until("the dead letter", WAIT, async || env.llen(&dead).await == 1).await;
    let record = format!("{to}.steps:order-1");
    kept(env, &record).await;
    let shown = op
        .steps(to, "order-1")
        .await
        .expect("steps")
        .expect("the dead letter's record is kept");
    assert_eq!(shown.steps[0].name, "charge");
    assert!(shown.steps[0].began_ms.is_some() && shown.steps[0].took_ms.is_some());

    handler.broken.store(false, Ordering::SeqCst);
    let moved = op
        .requeue(to, &Select::Id("order-1".into()))
        .await
        .expect("requeue");
    assert_eq!(moved, 1);
    wait_until("the requeued message is acknowledged", WAIT, async || {
        handler.acks.load(Ordering::SeqCst) == 1
    })
    .await;
    env.stop(running).await;
    assert_eq!(
        handler.charges.load(Ordering::SeqCst),
        1,
        "the requeued message replayed `charge` from its kept record"
    );
    kept(env, &record).await;
}

async fn a_requeued_dead_letter_replays_its_kept_steps(env: &Env) {
    let list = RedisList::new("{skd}").reliable().keep_steps(KEEP);
    requeue_replays(env, list, env.broker(), "{skd}").await;
}

async fn a_requeued_stream_dead_letter_replays_its_kept_steps(env: &Env) {
    let stream = RedisStream::new("{skds}").group("g").keep_steps(KEEP);
    let producer = env.broker_with(|b| b.route("{skds}", ruststream::stream::Publish::new()));
    requeue_replays(env, stream, producer, "{skds}").await;
}
