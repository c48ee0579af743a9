//! A concurrency cap across workers: `.max_in_flight(n)` on a reliable list
//! and a stream group, a gate of the claim. Three app instances share one capped queue; their
//! handlers count how many run at once (one counter for all three): its peak is at most `n`
//! and reaches `n`, and every message is handled exactly once. Also: a handler that fails and
//! retries (the retry frees the cap), a worker that dies holding capped work (its claims hold
//! the cap until the sweep brings them back, then the cap frees), and the refusals (a simple
//! list, partitions, zero). The cap with priorities, a rate limit, pause, a batch handler,
//! delays and recovery is in `combinations/`'s matrix.

use crate::harness;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Env, Stuck, WAIT, on, start, stop, wait_until};
use ruststream::prelude::*;
use ruststream::{Mount, RunningApp, Source};

on!(
    [memory, standalone, cluster] multi_thread:
    three_apps_on_a_capped_list_hold_the_cap_and_reach_it,
    three_apps_on_a_capped_stream_hold_the_cap_and_reach_it,
    retries_free_the_cap,
    a_dead_workers_claims_hold_the_cap_until_swept,
);

on!([memory] a_cap_that_cannot_hold_is_refused_with_the_fix);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

/// How long each handler runs: long enough for the claims of three apps to overlap.
const WORK: Duration = Duration::from_millis(40);

/// Counts the handlers running at once, across every app that shares it (clones share it),
/// and how many times each job was handled; fails the first attempt of the jobs `fail` says.
#[derive(Clone, Default)]
struct Overlaps {
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    handled: Arc<Mutex<BTreeMap<u32, u32>>>,
    fail: Option<fn(u32) -> bool>,
}

impl Overlaps {
    fn failing(fail: fn(u32) -> bool) -> Self {
        Self {
            fail: Some(fail),
            ..Self::default()
        }
    }

    fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// Jobs handled to the end (an ack).
    fn done(&self) -> usize {
        self.handled.lock().expect("lock").len()
    }

    /// The jobs of `0..n` acknowledged other than exactly once.
    fn not_once(&self, n: u32) -> Vec<(u32, u32)> {
        let handled = self.handled.lock().expect("lock");
        (0..n)
            .map(|i| (i, handled.get(&i).copied().unwrap_or(0)))
            .filter(|(_, c)| *c != 1)
            .collect()
    }
}

impl Handle<Job> for Overlaps {
    async fn handle(&self, m: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(WORK).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        if ctx.attempt() == 1 && self.fail.is_some_and(|f| f(m.n)) {
            return Err(HandlerOutcome::retry());
        }
        *self.handled.lock().expect("lock").entry(m.n).or_default() += 1;
        Ok(())
    }
}

/// An app on a broker of its own (its own connections, as another process would have).
fn app(env: &Env, mount: impl FnOnce(&mut Mount<RedisBroker>)) -> RustStream {
    RustStream::new(AppInfo::new("cap", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(env.broker_with(|b| b), mount)
}

/// `count` apps reading `source` into `handler`.
async fn apps(
    env: &Env,
    source: impl Source<Broker = RedisBroker> + Clone,
    handler: &Overlaps,
    count: usize,
) -> Vec<RunningApp> {
    let mut running = Vec::new();
    for _ in 0..count {
        let (source, h) = (source.clone(), handler.clone());
        running.push(
            start(app(env, move |b| {
                b.include(subscriber(source, h).build());
            }))
            .await,
        );
    }
    running
}

async fn publish(broker: &RedisBroker, to: &str, jobs: std::ops::Range<u32>) {
    broker.connect().await.expect("connect");
    for n in jobs {
        broker
            .publisher()
            .message(&Job { n })
            .to(to)
            .publish()
            .await
            .expect("publish");
    }
}

/// Three apps of 4 permits each on `source` (capped at 3), `jobs` published: every job is
/// handled once, at most 3 ran at once, and 3 did.
async fn three_apps_hold_the_cap(
    env: &Env,
    source: impl Source<Broker = RedisBroker> + Clone,
    producer: RedisBroker,
    to: &str,
    handler: Overlaps,
) {
    const JOBS: u32 = 30;
    let running = apps(env, source, &handler, 3).await;
    publish(&producer, to, 0..JOBS).await;
    wait_until("every job handled", WAIT, async || {
        handler.done() == JOBS as usize
    })
    .await;
    for a in running {
        stop(a).await;
    }
    assert_eq!(handler.not_once(JOBS), [], "each job handled once");
    assert!(
        handler.peak() <= 3,
        "{} handlers ran at once under a cap of 3",
        handler.peak()
    );
    assert_eq!(handler.peak(), 3, "the cap was reached");
}

async fn three_apps_on_a_capped_list_hold_the_cap_and_reach_it(env: &Env) {
    let list = RedisList::new("{capped}")
        .reliable()
        .concurrency(4)
        .max_in_flight(3);
    let producer = env.broker();
    three_apps_hold_the_cap(env, list, producer, "{capped}", Overlaps::default()).await;
    assert_eq!(
        env.llen("{capped}.processing").await,
        0,
        "nothing left claimed"
    );
    assert_eq!(env.llen("{capped}").await, 0, "nothing left queued");
}

async fn three_apps_on_a_capped_stream_hold_the_cap_and_reach_it(env: &Env) {
    let stream = RedisStream::new("{cstream}")
        .group("g")
        .concurrency(4)
        .max_in_flight(3);
    let producer = env.broker_with(|b| b.route("{cstream}", ruststream::stream::Publish::new()));
    three_apps_hold_the_cap(env, stream, producer, "{cstream}", Overlaps::default()).await;
    assert_eq!(
        env.pending("{cstream}", "g").await,
        0,
        "nothing left pending"
    );
}

/// Every third job fails its first attempt and is retried at once: the retry puts it back and
/// frees the cap, so every job is acknowledged once and the cap holds throughout.
async fn retries_free_the_cap(env: &Env) {
    let list = RedisList::new("{cretry}")
        .reliable()
        .concurrency(4)
        .max_in_flight(3)
        .retry(ruststream::Backoff::immediate());
    let handler = Overlaps::failing(|n| n % 3 == 0);
    three_apps_hold_the_cap(env, list, env.broker(), "{cretry}", handler).await;
    assert_eq!(
        env.llen("{cretry}.processing").await,
        0,
        "nothing left claimed"
    );
    assert_eq!(env.llen("{cretry}.dead").await, 0, "nothing dead");
}

/// A first app claims 2 jobs of a queue capped at 2 and dies holding them. A second app gets
/// nothing while the dead claims hold the cap; once they are idle longer than `min_idle`, its
/// claim sweeps them back and the cap frees: all 6 jobs are handled once, the 2 on attempt 2.
async fn a_dead_workers_claims_hold_the_cap_until_swept(env: &Env) {
    let min_idle = Duration::from_secs(2);
    let list = RedisList::new("{cdead}")
        .reliable()
        .concurrency(4)
        .max_in_flight(2)
        .block(Duration::from_millis(200))
        .min_idle(min_idle);
    let producer = env.broker();
    publish(&producer, "{cdead}", 0..6).await;
    let stuck = Stuck::default();
    let dying = {
        let (list, s) = (list.clone(), stuck.clone());
        app(env, move |b| {
            b.include(subscriber(list, s).build::<Job>());
        })
        .shutdown_timeout(Duration::from_millis(100))
    };
    let dying = start(dying).await;
    wait_until("2 claimed", WAIT, async || stuck.started() == 2).await;
    stop(dying).await;
    assert_eq!(stuck.started(), 2, "the cap let the dying app take 2 only");
    assert_eq!(env.llen("{cdead}.processing").await, 2, "its claims stay");

    let handler = Overlaps::default();
    let running = apps(env, list, &handler, 1).await;
    // Less than min_idle after the dying app's last lease: its claims still hold the cap.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        handler.done(),
        0,
        "a claim went past the dead worker's capped work"
    );
    wait_until("every job handled", WAIT, async || handler.done() == 6).await;
    for a in running {
        stop(a).await;
    }
    assert_eq!(handler.not_once(6), [], "each job handled once");
    assert!(
        handler.peak() <= 2,
        "{} ran at once under a cap of 2",
        handler.peak()
    );
    assert_eq!(
        env.llen("{cdead}.processing").await,
        0,
        "nothing left claimed"
    );
}

/// Why an app reading `source` does not start.
async fn refusal(env: &Env, source: impl Source<Broker = RedisBroker>) -> ruststream::ConfigError {
    env.refusal(env.app(move |m| {
        m.include(subscriber(source, Overlaps::default()).build());
    }))
    .await
}

async fn a_cap_that_cannot_hold_is_refused_with_the_fix(env: &Env) {
    let cap_of = |e: &ruststream::ConfigError, key: &str| {
        assert_eq!(e.option, "max_in_flight", "{e}");
        assert_eq!(e.subject.as_deref(), Some(key), "{e}");
    };
    let e = refusal(env, RedisList::new("{s}").max_in_flight(2)).await;
    cap_of(&e, "{s}");
    assert!(e.problem.contains("needs a reliable list"), "{e}");
    assert_eq!(e.fix, "add `.reliable()`", "{e}");
    let list = RedisList::new("p")
        .reliable()
        .partitions(2)
        .max_in_flight(2);
    let e = refusal(env, list).await;
    cap_of(&e, "p");
    assert!(e.problem.contains("cannot span partitions"), "{e}");
    let stream = RedisStream::new("p")
        .group("g")
        .partitions(2)
        .max_in_flight(2);
    let e = refusal(env, stream).await;
    cap_of(&e, "p");
    assert!(e.problem.contains("cannot span partitions"), "{e}");
    let e = refusal(env, RedisList::new("{z}").reliable().max_in_flight(0)).await;
    cap_of(&e, "{z}");
    assert!(e.problem.contains("needs at least 1"), "{e}");
}
