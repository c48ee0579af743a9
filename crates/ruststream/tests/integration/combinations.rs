//! Features that compose (issue 21): a claim is one script built from parts (where entries come
//! from, the gates that hold it back, what it records), so the queue features combine.
//!
//! - A pause is a gate of the claim: once `pause` has returned, a job published is not claimed
//!   (for twice the read's block), by either of two instances whose readers were already in
//!   their blocking wait, on a simple list, a reliable list and a stream; `resume` lets it
//!   through.
//! - The matrix: every pair of priorities, rate limit, per-key limit, partitions, pause, batch
//!   handler, delays, recovery after a killed claim, a concurrency cap, a deadline (some first
//!   calls hang until it), snoozes and fair groups runs on one queue,
//!   asserting every message handled exactly once and nothing left queued or claimed (with the
//!   cap, also that no more than it ran at once); the pairs not supported are refused at
//!   startup, saying why.
//! - The stream matrix: every pair of the features a [`RedisStream`] has (rate limit,
//!   partitions, pause, batch handler, delays, recovery after a killed claim) on one stream
//!   read by a group, asserting every message handled exactly once and nothing left pending,
//!   unread or delayed. A stream has no priority levels and no per-key limit (a group reads in
//!   order and cannot skip a held key): `RedisStream` has no such method, so those pairs are
//!   refused when the app is compiled, and every pair of the other six runs (the README's table).

use crate::harness;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Env, Stuck, WAIT, on, start, stop, wait_until};
use ruststream::Mount;
use ruststream::operate::operators;
use ruststream::prelude::*;
use ruststream::redis::operate::Operator;
use ruststream::{BatchContext, BatchOutcome, HandleBatch};
use tokio::time::Instant;

on!(
    [memory, standalone, cluster]
    a_pause_holds_a_waiting_simple_list,
    a_pause_holds_a_waiting_reliable_list,
    a_pause_holds_a_waiting_stream,
    every_supported_pair_of_features_loses_and_duplicates_nothing,
    a_rate_limit_holds_over_all_partitions_of_a_list,
    a_rate_limit_holds_over_all_partitions_of_a_stream,
    every_pair_of_stream_features_loses_and_duplicates_nothing,
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

/// Every reader's block: a pause must hold for two of them.
const BLOCK: Duration = Duration::from_millis(300);

/// How many times each job was handled, by any app (clones share it), and the most handlers
/// that ran at once; each handler takes `linger`.
#[derive(Clone, Default)]
struct Tally {
    seen: Arc<Mutex<BTreeMap<u32, u32>>>,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    linger: Duration,
    /// [`Deadline`]: every fifth job's first call hangs until its deadline.
    hang: bool,
    /// [`Snooze`]: every third job snoozes once.
    snooze: bool,
}

impl Tally {
    /// The tally of `pair`'s handlers.
    fn of(pair: &[Feature]) -> Self {
        Self {
            linger: if pair.contains(&Cap) {
                Duration::from_millis(20)
            } else {
                Duration::ZERO
            },
            hang: pair.contains(&Deadline),
            snooze: pair.contains(&Snooze),
            ..Self::default()
        }
    }

    /// Whether job `n`'s call hangs, on attempt `attempt`.
    fn hangs(&self, n: u32, attempt: u32) -> bool {
        self.hang && n % 5 == 1 && attempt == 1
    }

    /// Whether job `n` snoozes, snoozed `snoozes` times before.
    fn snoozes(&self, n: u32, snoozes: u32) -> bool {
        self.snooze && n % 3 == 2 && snoozes == 0
    }

    fn add(&self, n: u32) {
        *self.seen.lock().expect("lock").entry(n).or_default() += 1;
    }

    fn handled(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }

    fn has(&self, n: u32) -> bool {
        self.seen.lock().expect("lock").contains_key(&n)
    }

    /// The jobs handled other than exactly once, of `0..n`.
    fn not_once(&self, n: u32) -> Vec<(u32, u32)> {
        let seen = self.seen.lock().expect("lock");
        (0..n)
            .map(|i| (i, seen.get(&i).copied().unwrap_or(0)))
            .filter(|(_, c)| *c != 1)
            .collect()
    }

    /// Counts `n` jobs running for `linger`.
    async fn run(&self, n: usize) {
        let now = self.running.fetch_add(n, Ordering::SeqCst) + n;
        self.peak.fetch_max(now, Ordering::SeqCst);
        if !self.linger.is_zero() {
            tokio::time::sleep(self.linger).await;
        }
        self.running.fetch_sub(n, Ordering::SeqCst);
    }
}

impl Handle<Job> for Tally {
    async fn handle(&self, m: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        if self.hangs(m.n, ctx.attempt()) {
            std::future::pending::<()>().await;
        }
        if self.snoozes(m.n, ctx.snoozes()) {
            return Err(HandlerOutcome::snooze(SNOOZE));
        }
        self.run(1).await;
        self.add(m.n);
        Ok(())
    }
}

impl HandleBatch<Job> for Tally {
    async fn handle_batch(&self, jobs: &[Job], ctx: &mut BatchContext<'_>) -> BatchOutcome {
        let infos: Vec<_> = ctx.infos().collect();
        if jobs
            .iter()
            .zip(&infos)
            .any(|(j, i)| self.hangs(j.n, i.attempt))
        {
            std::future::pending::<()>().await;
        }
        self.run(jobs.len()).await;
        let outcomes = jobs
            .iter()
            .zip(&infos)
            .map(|(j, i)| {
                if self.snoozes(j.n, i.snoozes) {
                    HandlerOutcome::snooze(SNOOZE)
                } else {
                    self.add(j.n);
                    HandlerOutcome::ack()
                }
            })
            .collect();
        BatchOutcome::each(outcomes)
    }
}

async fn operator_of(env: &Env, mount: impl FnOnce(&mut Mount<RedisBroker>)) -> Operator {
    let op = operators(&env.app(mount))
        .pop()
        .expect("the app has a Redis broker");
    op.connect().await.expect("the operator connects");
    op
}

/// Two instances of `mount` read `key`; one job is handled (so both readers are back in their
/// blocking wait); then `pause` returns, a job is published, and for two blocks nobody claims
/// it (`waiting` says it still waits); after `resume` it is handled.
async fn a_pause_holds_waiting_readers(
    env: &Env,
    key: &str,
    mount: impl Fn(&mut Mount<RedisBroker>) + Clone,
    tally: &Tally,
    producer: RedisBroker,
    waiting: impl AsyncFn() -> bool,
) {
    let op = operator_of(env, mount.clone()).await;
    let first = start(own_app(env, mount.clone())).await;
    let second = start(own_app(env, mount)).await;
    producer.connect().await.expect("connect");
    let publisher = producer.publisher();
    publisher
        .message(&Job { n: 0 })
        .to(key)
        .publish()
        .await
        .unwrap();
    env.eventually("the first job is handled", async || tally.has(0))
        .await;

    op.pause(key, "test").await.unwrap();
    publisher
        .message(&Job { n: 1 })
        .to(key)
        .publish()
        .await
        .unwrap();
    // A negative observation needs a window: two blocking reads.
    tokio::time::sleep(2 * BLOCK).await;
    assert!(!tally.has(1), "a paused subscription claimed");
    assert!(waiting().await, "the job still waits on the queue");

    op.resume(key).await.unwrap();
    env.eventually("the job is handled after resume", async || tally.has(1))
        .await;
    assert_eq!(tally.not_once(2), [], "each job handled once");
    stop(first).await;
    stop(second).await;
}

async fn a_pause_holds_a_waiting_simple_list(env: &Env) {
    pause_on_a_list(env, RedisList::new("{ps}")).await;
}

async fn a_pause_holds_a_waiting_reliable_list(env: &Env) {
    pause_on_a_list(env, RedisList::new("{pr}").reliable()).await;
}

async fn pause_on_a_list(env: &Env, list: RedisList) {
    let key = list.key().to_owned();
    let tally = Tally::default();
    let t = tally.clone();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(subscriber(list.clone().block(BLOCK), t.clone()).build());
    };
    let producer = env.broker_with(|b| b);
    a_pause_holds_waiting_readers(env, &key, mount, &tally, producer, async || {
        env.llen(&key).await == 1
    })
    .await;
}

async fn a_pause_holds_a_waiting_stream(env: &Env) {
    let tally = Tally::default();
    let t = tally.clone();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(subscriber(RedisStream::new("{pst}").group("g").block(BLOCK), t.clone()).build());
    };
    let producer = env.broker_with(|b| b.route("{pst}", stream::Publish::new()));
    a_pause_holds_waiting_readers(env, "{pst}", mount, &tally, producer, async || {
        env.pending("{pst}", "g").await == 0
    })
    .await;
}

/// One queue feature of the matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Feature {
    /// `.priorities(3)`, jobs spread over the levels.
    Priorities,
    /// `.rate_limit(20, 100 ms)`.
    Rate,
    /// `.rate_limit_by("customer", 5, 100 ms)`, three customers.
    KeyRate,
    /// `.partitions(2)`.
    Partitions,
    /// Paused while the jobs are published, resumed after two blocks.
    Pause,
    /// A batch handler, 5 a batch.
    Batch,
    /// Every fourth job published with a delay of 200 ms.
    Delays,
    /// A first app claims 4 and dies with them; the next sweeps them back (`min_idle` 300 ms).
    Recovery,
    /// `.max_in_flight(CAP)`, each handler taking 20 ms: at most `CAP` run at once.
    Cap,
    /// `.timeout(TIMEOUT)`; every fifth job's first call hangs until it (then is retried).
    Deadline,
    /// Every third job snoozes once for [`SNOOZE`].
    Snooze,
    /// `.groups()`, the jobs spread over three groups.
    Groups,
}

use Feature::*;

const FEATURES: [Feature; 12] = [
    Priorities, Rate, KeyRate, Partitions, Pause, Batch, Delays, Recovery, Cap, Deadline, Snooze,
    Groups,
];

/// The deadline of [`Deadline`].
const TIMEOUT: Duration = Duration::from_millis(150);

/// A snooze of [`Snooze`].
const SNOOZE: Duration = Duration::from_millis(100);

/// The cap of [`Cap`]: the 4 claims [`Recovery`]'s dying app holds fill it.
const CAP: u32 = 4;

/// Jobs per pair.
const N: u32 = 24;

/// Why a pair does not start, for the pairs that are refused (the README's table says why).
fn refusal(pair: [Feature; 2]) -> Option<&'static str> {
    match pair {
        [Rate, KeyRate] | [KeyRate, Rate] => Some("one rate limit a queue"),
        [Partitions, KeyRate] | [KeyRate, Partitions] => {
            Some("per-key rate limit cannot span partitions")
        }
        [Partitions, Cap] | [Cap, Partitions] => Some("max_in_flight cannot span partitions"),
        [Priorities, Groups] | [Groups, Priorities] => {
            Some("fair groups and priority levels do not combine")
        }
        _ => None,
    }
}

async fn every_supported_pair_of_features_loses_and_duplicates_nothing(env: &Env) {
    for (i, &a) in FEATURES.iter().enumerate() {
        for &b in &FEATURES[i + 1..] {
            let pair = [a, b];
            match refusal(pair) {
                // One option holds the queue's limit: there is no pair to build.
                Some("one rate limit a queue") => {}
                Some(says) => {
                    let source = source(&format!("combo{i}"), &pair);
                    let app = env.app(move |m| {
                        m.include(subscriber(source, Tally::default()).build());
                    });
                    let e = env.refusal(app).await;
                    assert!(e.contains(says), "{pair:?}: {e}");
                }
                None => run_pair(env, &format!("{a:?}{b:?}").to_lowercase(), &pair).await,
            }
        }
    }
}

/// The queue of `pair` named `name`: reliable, 8 at once, with the pair's options.
fn source(name: &str, pair: &[Feature]) -> RedisList {
    let key = if pair.contains(&Partitions) {
        name.to_owned()
    } else {
        format!("{{{name}}}")
    };
    let mut list = RedisList::new(key)
        .reliable()
        .block(BLOCK)
        .concurrency(8)
        .min_idle(Duration::from_millis(300));
    for f in pair {
        list = match f {
            Priorities => list.priorities(3),
            Rate => list.rate_limit(20, Duration::from_millis(100)),
            KeyRate => list.rate_limit_by("customer", 5, Duration::from_millis(100)),
            Partitions => list.partitions(2),
            Cap => list.max_in_flight(CAP),
            Deadline => list.timeout(TIMEOUT),
            Groups => list.groups(),
            Pause | Batch | Delays | Recovery | Snooze => list,
        };
    }
    list
}

/// Runs `pair` on its own queue: every job handled once, nothing left in any of its lists.
async fn run_pair(env: &Env, name: &str, pair: &[Feature]) {
    let list = source(name, pair);
    let key = list.key().to_owned();
    let tally = Tally::of(pair);
    let mount = {
        let (list, t, batch) = (list.clone(), tally.clone(), pair.contains(&Batch));
        move |b: &mut Mount<RedisBroker>| {
            if batch {
                b.include(subscriber(list.clone(), t.clone()).batch(5).build());
            } else {
                b.include(subscriber(list.clone(), t.clone()).build());
            }
        }
    };
    let mut route = list::Publish::new();
    if pair.contains(&Priorities) {
        route = route.priorities(3);
    }
    if pair.contains(&Partitions) {
        route = route.partitions(2);
    }
    if pair.contains(&Groups) {
        route = route.groups();
    }
    let producer = env.broker_with(|b| b.route(&key, route));
    producer.connect().await.expect("connect");
    let publisher = producer.publisher();
    let publish = async |range: std::ops::Range<u32>| {
        for n in range {
            let job = Job { n };
            let mut m = publisher.message(&job).to(&key);
            if pair.contains(&Priorities) {
                m = m.priority((n % 3) as u8);
            }
            if pair.contains(&KeyRate) {
                m = m.header("customer", format!("c{}", n % 3));
            }
            if pair.contains(&Groups) {
                m = m.group(format!("t{}", n % 3));
            }
            if pair.contains(&Delays) && n % 4 == 0 {
                m = m.delay(Duration::from_millis(200));
            }
            m.publish().await.expect("publish");
        }
    };

    let mut first = 0;
    if pair.contains(&Recovery) {
        // Four jobs claimed by an app that dies holding them.
        publish(0..4).await;
        let stuck = Stuck::default();
        let s = (list.clone().concurrency(4), stuck.clone());
        let dying = own_app(env, move |b| {
            b.include(subscriber(s.0.clone(), s.1.clone()).build::<Job>());
        })
        .shutdown_timeout(Duration::from_millis(100));
        let dying = start(dying).await;
        wait_until("4 claimed", WAIT, async || stuck.started() == 4).await;
        stop(dying).await;
        first = 4;
    }
    let op = operator_of(env, mount.clone()).await;
    if pair.contains(&Pause) {
        op.pause(&key, "test").await.expect("pause");
    }
    let apps = [
        start(own_app(env, mount.clone())).await,
        start(own_app(env, mount)).await,
    ];
    publish(first..N).await;
    if pair.contains(&Pause) {
        tokio::time::sleep(2 * BLOCK).await;
        assert_eq!(tally.handled(), 0, "{pair:?}: a paused queue was claimed");
        op.resume(&key).await.expect("resume");
    }
    wait_until(&format!("{pair:?}: all handled"), WAIT, async || {
        tally.handled() == N as usize
    })
    .await;
    let lists = queue_lists(&key, pair);
    wait_until(&format!("{pair:?}: all settled"), WAIT, async || {
        let mut left = 0;
        for l in &lists {
            left += env.llen(l).await;
        }
        left == 0
    })
    .await;
    for app in apps {
        stop(app).await;
    }
    assert_eq!(
        tally.not_once(N),
        [],
        "{pair:?}: jobs handled other than once"
    );
    if pair.contains(&Cap) {
        let peak = tally.peak.load(Ordering::SeqCst);
        assert!(
            peak <= CAP as usize,
            "{pair:?}: {peak} ran at once, over the cap"
        );
    }
}

/// An app mounted by `mount` on a broker of its own (its own connections, as another process
/// would have); a 1 s shutdown timeout.
fn own_app(env: &Env, mount: impl FnOnce(&mut Mount<RedisBroker>)) -> RustStream {
    RustStream::new(AppInfo::new("combinations", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(env.broker_with(|b| b), mount)
}

/// Every list a queue of `pair` keeps entries in: each partition's levels and processing list.
fn queue_lists(key: &str, pair: &[Feature]) -> Vec<String> {
    let queues = if pair.contains(&Partitions) {
        (0..2).map(|i| format!("{{{key}:{i}}}")).collect()
    } else {
        vec![key.to_owned()]
    };
    let mut lists = Vec::new();
    for q in queues {
        if pair.contains(&Priorities) {
            lists.extend((1..3).map(|l| format!("{q}.p{l}")));
        }
        if pair.contains(&Groups) {
            lists.extend((0..3).map(|t| format!("{q}.groups:t{t}")));
            lists.push(format!("{q}.groups"));
        }
        lists.push(format!("{q}.processing"));
        lists.push(q);
    }
    lists
}

async fn a_rate_limit_holds_over_all_partitions_of_a_list(env: &Env) {
    let list = RedisList::new("limited")
        .reliable()
        .partitions(4)
        .block(BLOCK)
        .rate_limit(5, Duration::from_secs(1));
    let route = ruststream::PublishPolicy::List(list::Publish::new().partitions(4));
    rate_over_partitions(env, list, route).await;
}

async fn a_rate_limit_holds_over_all_partitions_of_a_stream(env: &Env) {
    let stream = RedisStream::new("limited")
        .group("g")
        .partitions(4)
        .block(BLOCK)
        .rate_limit(5, Duration::from_secs(1));
    let route = ruststream::PublishPolicy::Stream(stream::Publish::new().partitions(4));
    rate_over_partitions(env, stream, route).await;
}

/// A rate limit of 5 a second on a queue of 4 partitions read by two apps: the limiter is the
/// logical queue's, so the burst is 5 in all (a limit per partition would let 20 through at
/// once), and within any window W at most 5 + 5 W/s pass (one more for the clocks), and all
/// 20 jobs are handled once.
async fn rate_over_partitions(
    env: &Env,
    source: impl ruststream::Source<Broker = RedisBroker> + Clone,
    route: ruststream::PublishPolicy,
) {
    let stamps: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let tally = Tally::default();
    #[derive(Clone)]
    struct Stamped(Tally, Arc<Mutex<Vec<Instant>>>);
    impl Handle<Job> for Stamped {
        async fn handle(&self, m: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
            self.1.lock().expect("lock").push(Instant::now());
            self.0.add(m.n);
            Ok(())
        }
    }
    let handler = Stamped(tally.clone(), stamps.clone());
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(subscriber(source.clone(), handler.clone()).build());
    };
    let producer = env.broker_with(|b| b.route("limited", route));
    producer.connect().await.expect("connect");
    for n in 0..20 {
        producer
            .publisher()
            .message(&Job { n })
            .to("limited")
            .publish()
            .await
            .expect("publish");
    }
    let apps = [
        start(own_app(env, mount.clone())).await,
        start(own_app(env, mount)).await,
    ];
    wait_until("all 20 handled", WAIT, async || tally.handled() == 20).await;
    for app in apps {
        stop(app).await;
    }
    assert_eq!(tally.not_once(20), [], "each handled once");
    let stamps = stamps.lock().expect("lock").clone();
    for (i, first) in stamps.iter().enumerate() {
        for (j, last) in stamps.iter().enumerate().skip(i) {
            let w = last.duration_since(*first).as_secs_f64();
            let bound = 5.0 + 5.0 * w + 1.0;
            assert!(
                (j - i + 1) as f64 <= bound,
                "{} passed within {w:.3} s, over the limit's {bound}",
                j - i + 1
            );
        }
    }
}

/// The features of a [`RedisStream`]: those of the list matrix but priorities and the per-key
/// limit, which a stream does not have.
const STREAM_FEATURES: [Feature; 6] = [Rate, Partitions, Pause, Batch, Delays, Recovery];

/// The stream's consumer group.
const GROUP: &str = "g";

async fn every_pair_of_stream_features_loses_and_duplicates_nothing(env: &Env) {
    for (i, &a) in STREAM_FEATURES.iter().enumerate() {
        for &b in &STREAM_FEATURES[i + 1..] {
            let pair = [a, b];
            run_stream_pair(env, &format!("s{a:?}{b:?}").to_lowercase(), &pair).await;
        }
    }
}

/// The stream of `pair` named `name`: read by [`GROUP`], 8 at once, with the pair's options.
fn stream_source(name: &str, pair: &[Feature]) -> RedisStream {
    let key = if pair.contains(&Partitions) {
        name.to_owned()
    } else {
        format!("{{{name}}}")
    };
    let mut stream = RedisStream::new(key)
        .group(GROUP)
        .block(BLOCK)
        .concurrency(8)
        .min_idle(Duration::from_millis(300));
    for f in pair {
        stream = match f {
            Rate => stream.rate_limit(20, Duration::from_millis(100)),
            Partitions => stream.partitions(2),
            Pause | Batch | Delays | Recovery => stream,
            other => unreachable!("{other:?} is not in the stream matrix"),
        };
    }
    stream
}

/// Runs `pair` on its own stream: every job handled once; nothing pending in the group,
/// unread by it or waiting in a delayed set, on any partition.
async fn run_stream_pair(env: &Env, name: &str, pair: &[Feature]) {
    let stream = stream_source(name, pair);
    let key = stream.key().to_owned();
    let tally = Tally::default();
    let mount = {
        let (stream, t, batch) = (stream.clone(), tally.clone(), pair.contains(&Batch));
        move |b: &mut Mount<RedisBroker>| {
            if batch {
                b.include(subscriber(stream.clone(), t.clone()).batch(5).build());
            } else {
                b.include(subscriber(stream.clone(), t.clone()).build());
            }
        }
    };
    let mut route = stream::Publish::new();
    if pair.contains(&Partitions) {
        route = route.partitions(2);
    }
    let producer = env.broker_with(|b| b.route(&key, route));
    producer.connect().await.expect("connect");
    let publisher = producer.publisher();
    let publish = async |range: std::ops::Range<u32>| {
        for n in range {
            let job = Job { n };
            let mut m = publisher.message(&job).to(&key);
            if pair.contains(&Delays) && n % 4 == 0 {
                m = m.delay(Duration::from_millis(200));
            }
            m.publish().await.expect("publish");
        }
    };

    let mut first = 0;
    if pair.contains(&Recovery) {
        // Four jobs read by a consumer that dies holding them.
        publish(0..4).await;
        let stuck = Stuck::default();
        let s = (stream.clone().concurrency(4), stuck.clone());
        let dying = own_app(env, move |b| {
            b.include(subscriber(s.0.clone(), s.1.clone()).build::<Job>());
        })
        .shutdown_timeout(Duration::from_millis(100));
        let dying = start(dying).await;
        wait_until("4 read", WAIT, async || stuck.started() == 4).await;
        stop(dying).await;
        first = 4;
    }
    let op = operator_of(env, mount.clone()).await;
    if pair.contains(&Pause) {
        op.pause(&key, "test").await.expect("pause");
    }
    let apps = [
        start(own_app(env, mount.clone())).await,
        start(own_app(env, mount)).await,
    ];
    publish(first..N).await;
    if pair.contains(&Pause) {
        tokio::time::sleep(2 * BLOCK).await;
        assert_eq!(tally.handled(), 0, "{pair:?}: a paused stream was read");
        op.resume(&key).await.expect("resume");
    }
    wait_until(&format!("{pair:?}: all handled"), WAIT, async || {
        tally.handled() == N as usize
    })
    .await;
    let streams = if pair.contains(&Partitions) {
        stream.partition_keys()
    } else {
        vec![key.clone()]
    };
    wait_until(&format!("{pair:?}: all settled"), WAIT, async || {
        let mut left = 0;
        for s in &streams {
            let (pending, unread) = group_state(env, s).await;
            left += pending + unread + env.zcard(&format!("{s}.delayed")).await;
        }
        left == 0
    })
    .await;
    for app in apps {
        stop(app).await;
    }
    assert_eq!(
        tally.not_once(N),
        [],
        "{pair:?}: jobs handled other than once"
    );
}

/// The group's entries pending and not yet read (`XINFO GROUPS`' `pending` and `lag`) on the
/// stream `key`.
async fn group_state(env: &Env, key: &str) -> (i64, i64) {
    use fred::prelude::*;
    let groups: Vec<Value> = env
        .client
        .custom(
            fred::cmd!("XINFO", hash: fred::types::ClusterHash::from(env.key(key).as_str())),
            vec!["GROUPS".to_owned(), env.key(key)],
        )
        .await
        .expect("XINFO GROUPS");
    groups
        .into_iter()
        .find_map(|g| {
            // A record is a flat array of names and values (RESP2) or a map (RESP3).
            let fields: Vec<(String, Value)> = match g {
                Value::Array(flat) => flat
                    .chunks(2)
                    .filter_map(|kv| Some((kv.first()?.as_string()?, kv.get(1)?.clone())))
                    .collect(),
                Value::Map(map) => map
                    .inner()
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v)))
                    .collect(),
                _ => Vec::new(),
            };
            let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);
            (field("name")?.as_string()? == GROUP).then_some(())?;
            Some((field("pending")?.as_i64()?, field("lag")?.as_i64()?))
        })
        .unwrap_or_else(|| panic!("no group {GROUP} on {key}"))
}
