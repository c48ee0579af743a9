//! A stop puts a message whose handler uses steps back on its queue at once. A handler that
//! sees the stop (`ctx.is_stopping()`) returns after its checkpoint; one still running at the
//! shutdown timeout is cut off. No attempt is spent, the step record stays, and the next app
//! resumes at the last checkpoint without waiting for `min_idle` (a minute here). When the
//! put-back cannot reach Redis, the message stays claimed and comes back through recovery, as
//! after a crash, and the stop is still bounded.

use crate::harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::proxy::{Proxy, resp_args};
use harness::{Env, on};
use ruststream::prelude::*;
use ruststream::{RunningApp, Source, subscriber};
use tokio::time::Instant;

use super::steps::Order;

on!(
    [memory, standalone, cluster] multi_thread:
    a_cut_off_import_goes_back_to_its_list_at_once,
    a_cut_off_import_goes_back_to_its_stream_at_once,
    an_import_that_sees_the_stop_returns_and_goes_back_at_once,
);

on!([standalone] multi_thread: a_put_back_that_cannot_reach_redis_leaves_the_message_to_recovery);

/// Longer than any test waits: a message back within it was put back, not recovered.
const NO_RECOVERY: Duration = Duration::from_secs(60);

/// A run as the handler saw it: its attempt and the checkpoint it resumed at.
type Run = (u32, Option<u32>);

/// An import without end: from its last checkpoint, it records one page after another. With
/// `heeds`, it returns a retry once the app stops, after a checkpoint; without, it stops
/// recording after three pages and never returns. Its second run only acknowledges.
#[derive(Clone, Default)]
struct Endless {
    heeds: bool,
    /// Each run.
    runs: Arc<Mutex<Vec<Run>>>,
    /// The last page whose checkpoint was recorded.
    last: Arc<Mutex<Option<u32>>>,
}

impl Endless {
    fn runs(&self) -> Vec<Run> {
        self.runs.lock().expect("lock").clone()
    }

    fn last(&self) -> Option<u32> {
        *self.last.lock().expect("lock")
    }
}

impl Handle<Order> for Endless {
    async fn handle(&self, _: &Order, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let from = ctx.resume_from::<u32>().await?;
        let first = {
            let mut runs = self.runs.lock().expect("lock");
            runs.push((ctx.attempt(), from));
            runs.len() == 1
        };
        if !first {
            return Ok(());
        }
        let mut page = from.unwrap_or(0);
        loop {
            if self.heeds && ctx.is_stopping() {
                return Err(HandlerOutcome::retry());
            }
            if !self.heeds && page == 3 {
                std::future::pending::<()>().await;
            }
            page += 1;
            ctx.checkpoint(&page).await?;
            *self.last.lock().expect("lock") = Some(page);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Starts `handler` on `source` through `broker` with a shutdown timeout of `shutdown`, and
/// publishes order `order-1` to `{stops}` through `producer`.
async fn start(
    env: &Env,
    broker: RedisBroker,
    shutdown: Duration,
    (source, producer): (impl Source<Broker = RedisBroker>, RedisBroker),
    handler: &Endless,
) -> RunningApp {
    let h = handler.clone();
    let app = RustStream::new(AppInfo::new("steps-stop", "0"))
        .shutdown_timeout(shutdown)
        .with_broker(broker, move |b| {
            b.include(subscriber(source, h).uses_steps().build());
        });
    let running = env.start(app).await;
    producer.connect().await.expect("connect");
    producer
        .publisher()
        .message(&Order { n: 7 })
        .to("{stops}")
        .id("order-1")
        .publish()
        .await
        .expect("publish");
    running
}

/// Stops `running`, failing the test unless that takes less than `within`; how long it took.
async fn stop_within(running: RunningApp, within: Duration) -> Duration {
    let began = Instant::now();
    harness::bounded("the stop", within, running.shutdown())
        .await
        .expect("stopped");
    began.elapsed()
}

/// A second app on `source` resumes the message at `endless`'s last checkpoint, with the
/// attempt `attempt`, and acknowledges it, which removes the record.
async fn resumes(
    env: &Env,
    source: impl Source<Broker = RedisBroker>,
    endless: &Endless,
    attempt: u32,
) {
    let h = endless.clone();
    let second = env
        .start_with(move |b| {
            b.include(subscriber(source, h).uses_steps().build());
        })
        .await;
    env.eventually("resumed", async || endless.runs().len() == 2)
        .await;
    env.eventually("acknowledged", async || {
        !env.exists("{stops}.steps:order-1").await
    })
    .await;
    env.stop(second).await;
    let last = endless.last().expect("a checkpoint before the stop");
    assert_eq!(endless.runs(), [(1, None), (attempt, Some(last))]);
}

fn list() -> RedisList {
    RedisList::new("{stops}").reliable().min_idle(NO_RECOVERY)
}

/// Cut off at the shutdown timeout: right after the stop the message is back on the list, not
/// in the processing list, its claim record gone, its attempt unchanged and its record kept.
async fn a_cut_off_import_goes_back_to_its_list_at_once(env: &Env) {
    let endless = Endless::default();
    let timeout = Duration::from_millis(500);
    let running = start(env, env.broker(), timeout, (list(), env.broker()), &endless).await;
    env.eventually("at page 3", async || endless.last() == Some(3))
        .await;
    stop_within(running, timeout + Duration::from_secs(1)).await;
    assert_eq!(env.llen("{stops}.processing").await, 0, "not claimed");
    assert_eq!(
        env.zcard("{stops}.claims").await,
        0,
        "its claim record gone"
    );
    let back = env.frames("{stops}").await;
    assert_eq!(back.len(), 1, "back on the list");
    assert_eq!(back[0].attempt, 1, "no attempt spent");
    assert!(env.exists("{stops}.steps:order-1").await, "its record kept");
    resumes(env, list(), &endless, 1).await;
}

/// The same on a stream group: the entry is acknowledged and added again, so nothing is
/// pending right after the stop.
async fn a_cut_off_import_goes_back_to_its_stream_at_once(env: &Env) {
    let stream = || RedisStream::new("{stops}").group("g").min_idle(NO_RECOVERY);
    let producer = env.broker_with(|b| b.route("{stops}", ruststream::stream::Publish::new()));
    let endless = Endless::default();
    let timeout = Duration::from_millis(500);
    let running = start(env, env.broker(), timeout, (stream(), producer), &endless).await;
    env.eventually("at page 3", async || endless.last() == Some(3))
        .await;
    stop_within(running, timeout + Duration::from_secs(1)).await;
    assert_eq!(env.pending("{stops}", "g").await, 0, "not pending");
    assert!(env.exists("{stops}.steps:order-1").await, "its record kept");
    resumes(env, stream(), &endless, 1).await;
}

/// The handler sees the stop and returns after its checkpoint: the stop does not wait for the
/// shutdown timeout, and the message is back on the list at once.
async fn an_import_that_sees_the_stop_returns_and_goes_back_at_once(env: &Env) {
    let endless = Endless {
        heeds: true,
        ..Endless::default()
    };
    let timeout = Duration::from_secs(20);
    let running = start(env, env.broker(), timeout, (list(), env.broker()), &endless).await;
    env.eventually("at page 3", async || endless.last() >= Some(3))
        .await;
    let took = stop_within(running, timeout).await;
    assert!(
        took < timeout / 4,
        "the handler returned at the stop: {took:?}"
    );
    assert_eq!(env.llen("{stops}.processing").await, 0, "not claimed");
    let back = env.frames("{stops}").await;
    assert_eq!(back.len(), 1, "back on the list");
    assert_eq!(back[0].attempt, 1, "no attempt spent");
    resumes(env, list(), &endless, 1).await;
}

/// The put-back's settle never reaches Redis (the connection is cut and Redis stays away for
/// 3 s): the stop still ends within the shutdown timeout and two seconds, the message stays
/// claimed, and another worker recovers it after `min_idle` (an attempt spent, as after a
/// crash) and resumes at the last checkpoint.
async fn a_put_back_that_cannot_reach_redis_leaves_the_message_to_recovery(env: &Env) {
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    let broker = RedisBroker::standalone(proxy.url())
        .prefix(&env.prefix)
        .command_timeout(Duration::from_millis(300));
    let list = || {
        RedisList::new("{stops}")
            .reliable()
            .min_idle(Duration::from_secs(1))
    };
    let endless = Endless {
        heeds: true,
        ..Endless::default()
    };
    let timeout = Duration::from_millis(500);
    let running = start(env, broker, timeout, (list(), env.broker()), &endless).await;
    env.eventually("at page 3", async || endless.last() >= Some(3))
        .await;
    // The settle that puts the entry back: a retry now (`r`) onto the list's one level.
    proxy.outage_on(
        &resp_args(&[b"list", b"1", b"0", b"r"]),
        Duration::from_secs(3),
    );
    // The bound: the timeout, the settle's grace, and the history's last write (at most 1 s).
    let took = stop_within(running, timeout + Duration::from_secs(2)).await;
    println!("the stop took {took:?}");
    assert!(!proxy.outage_armed(), "the put-back was sent, and held");
    assert_eq!(env.llen("{stops}.processing").await, 1, "still claimed");
    assert_eq!(env.llen("{stops}").await, 0);
    resumes(env, list(), &endless, 2).await;
}
