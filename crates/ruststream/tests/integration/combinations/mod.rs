//! Features that compose: a claim is one script built from parts (where entries come
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
//!   startup, saying why. With durable steps (two steps a job, a durable sleep between them for
//!   every fourth), each step's effect also ran once and no step record is left; a batch handler
//!   has no steps, so that pair does not exist.
//! - The stream matrix: every pair of the features a [`RedisStream`] has (rate limit,
//!   partitions, pause, batch handler, delays, recovery after a killed claim) on one stream
//!   read by a group, asserting every message handled exactly once and nothing left pending,
//!   unread or delayed. A stream has no priority levels and no per-key limit (a group reads in
//!   order and cannot skip a held key): `RedisStream` has no such method, so those pairs are
//!   refused when the app is compiled, and every pair of the other six runs (the README's table).
//!
//! This file holds the list matrix; `pause.rs` the pause, `rate.rs` a rate limit over partitions,
//! `streams.rs` the stream matrix.

mod pause;
mod rate;
pub(crate) mod streams;

use crate::harness;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Env, Stuck, WAIT, on, start, stop, wait_until};
use ruststream::operate::operators;
use ruststream::prelude::*;
use ruststream::redis::operate::Operator;
use ruststream::{BatchContext, BatchOutcome, HandleBatch};
use ruststream::{Mount, RunningApp, Source};

on!(
    [memory, standalone, cluster]
    every_supported_pair_of_features_loses_and_duplicates_nothing,
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

/// Every reader's block: a pause must hold for two of them.
const BLOCK: Duration = Duration::from_millis(300);

/// How many times each step's effect ran, by `(job, step)`.
type StepEffects = Arc<Mutex<BTreeMap<(u32, u8), u32>>>;

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
    /// [`Steps`]: each job's step effects.
    steps: Option<StepEffects>,
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
            steps: pair.contains(&Steps).then(Arc::default),
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

    /// The step effects that did not run exactly once, of `0..n`'s two steps.
    fn steps_not_once(&self, n: u32) -> Vec<((u32, u8), u32)> {
        let Some(steps) = &self.steps else {
            return Vec::new();
        };
        let steps = steps.lock().expect("lock");
        (0..n)
            .flat_map(|i| [(i, 0), (i, 1)])
            .map(|k| (k, steps.get(&k).copied().unwrap_or(0)))
            .filter(|(_, c)| *c != 1)
            .collect()
    }

    /// With [`Steps`]: job `n`'s two steps, a durable sleep between them for every fourth job.
    async fn run_steps(&self, n: u32, ctx: &Context<'_>) -> Result<(), HandlerOutcome> {
        let Some(steps) = &self.steps else {
            return Ok(());
        };
        let effect = |step: u8| async move {
            *steps.lock().expect("lock").entry((n, step)).or_default() += 1;
            Ok::<_, String>(step)
        };
        ctx.step("first", || effect(0)).await?;
        if n % 4 == 3 {
            ctx.sleep(STEP_SLEEP).await?;
        }
        ctx.step("second", || effect(1)).await?;
        Ok(())
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
        self.run_steps(m.n, ctx).await?;
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
    /// Durable steps in the handler (see [`Tally::run_steps`]).
    Steps,
}

use Feature::*;

const FEATURES: [Feature; 13] = [
    Priorities, Rate, KeyRate, Partitions, Pause, Batch, Delays, Recovery, Cap, Deadline, Snooze,
    Groups, Steps,
];

/// The deadline of [`Deadline`].
const TIMEOUT: Duration = Duration::from_millis(150);

/// A snooze of [`Snooze`].
const SNOOZE: Duration = Duration::from_millis(100);

/// The durable sleep of [`Steps`].
const STEP_SLEEP: Duration = Duration::from_millis(100);

/// The cap of [`Cap`]: the 4 claims [`Recovery`]'s dying app holds fill it.
const CAP: u32 = 4;

/// Jobs per pair.
const N: u32 = 24;

/// Why a pair does not run, for the pairs that do not (the README's table says why).
enum NoRun {
    /// There is no way to build the pair.
    Unbuilt,
    /// The app is refused with a configuration error naming this option, whose problem says
    /// this.
    Refused(&'static str, &'static str),
}

/// Why `pair` does not run, or `None` for a pair that runs.
fn refusal(pair: [Feature; 2]) -> Option<NoRun> {
    match pair {
        // One option holds the queue's limit.
        [Rate, KeyRate] | [KeyRate, Rate] => Some(NoRun::Unbuilt),
        [Partitions, KeyRate] | [KeyRate, Partitions] => Some(NoRun::Refused(
            "rate_limit_by",
            "per-key rate limit cannot span partitions",
        )),
        [Partitions, Cap] | [Cap, Partitions] => {
            Some(NoRun::Refused("max_in_flight", "cannot span partitions"))
        }
        [Priorities, Groups] | [Groups, Priorities] => Some(NoRun::Refused(
            "groups",
            "fair groups and priority levels do not combine",
        )),
        // A batch handler's context has no steps.
        [Batch, Steps] | [Steps, Batch] => Some(NoRun::Unbuilt),
        _ => None,
    }
}

async fn every_supported_pair_of_features_loses_and_duplicates_nothing(env: &Env) {
    for (i, &a) in FEATURES.iter().enumerate() {
        for &b in &FEATURES[i + 1..] {
            let pair = [a, b];
            match refusal(pair) {
                Some(NoRun::Unbuilt) => {}
                Some(NoRun::Refused(option, says)) => {
                    let source = source(&format!("combo{i}"), &pair);
                    let app = env.app(move |m| {
                        m.include(subscriber(source, Tally::default()).build());
                    });
                    let e = env.refusal(app).await;
                    assert_eq!(e.option, option, "{pair:?}: {e}");
                    assert!(e.problem.contains(says), "{pair:?}: {e}");
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
            Pause | Batch | Delays | Recovery | Snooze | Steps => list,
        };
    }
    list
}

/// Runs `pair` on its own queue: every job handled once, nothing left in any of its lists.
async fn run_pair(env: &Env, name: &str, pair: &[Feature]) {
    let list = source(name, pair);
    let key = list.key().to_owned();
    let tally = Tally::of(pair);
    let mount = mount_of(list.clone(), &tally, pair);
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
    let dying = move |b: &mut Mount<RedisBroker>, stuck: Stuck| {
        b.include(subscriber(list.concurrency(4), stuck).build::<Job>());
    };
    let apps = handle_every_job(env, pair, &key, &tally, mount, dying, publish).await;
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
    assert_eq!(
        tally.steps_not_once(N),
        [],
        "{pair:?}: step effects run other than once"
    );
    if pair.contains(&Steps) {
        let records: Vec<String> = env
            .keys()
            .await
            .into_iter()
            .filter(|k| k.contains(".steps:"))
            .collect();
        assert_eq!(records, Vec::<String>::new(), "{pair:?}: step records left");
    }
    if pair.contains(&Cap) {
        let peak = tally.peak.load(Ordering::SeqCst);
        assert!(
            peak <= CAP as usize,
            "{pair:?}: {peak} ran at once, over the cap"
        );
    }
}

/// What both matrices do between building a pair's source and checking what is left: with
/// [`Recovery`], four jobs taken first by an app that dies holding them (`dying` mounts the
/// source on its stuck handler); with [`Pause`], the source paused by an operator before the
/// other jobs are published, nothing handled for two blocks, then resumed; two apps mounted by
/// `mount` handle every job. Returns the two apps, running.
async fn handle_every_job(
    env: &Env,
    pair: &[Feature],
    key: &str,
    tally: &Tally,
    mount: impl FnOnce(&mut Mount<RedisBroker>) + Clone + Send + Sync + 'static,
    dying: impl FnOnce(&mut Mount<RedisBroker>, Stuck) + Send + Sync + 'static,
    publish: impl AsyncFn(std::ops::Range<u32>),
) -> [RunningApp; 2] {
    let mut first = 0;
    if pair.contains(&Recovery) {
        publish(0..4).await;
        let stuck = Stuck::default();
        let s = stuck.clone();
        let app = own_app(env, move |b| dying(b, s)).shutdown_timeout(Duration::from_millis(100));
        let app = start(app).await;
        wait_until("4 taken", WAIT, async || stuck.started() == 4).await;
        stop(app).await;
        first = 4;
    }
    let op = operator_of(env, mount.clone()).await;
    if pair.contains(&Pause) {
        op.pause(key, "test").await.expect("pause");
    }
    let apps = [
        start(own_app(env, mount.clone())).await,
        start(own_app(env, mount)).await,
    ];
    publish(first..N).await;
    if pair.contains(&Pause) {
        tokio::time::sleep(2 * BLOCK).await;
        assert_eq!(
            tally.handled(),
            0,
            "{pair:?}: a paused source was taken from"
        );
        op.resume(key).await.expect("resume");
    }
    wait_until(&format!("{pair:?}: all handled"), WAIT, async || {
        tally.handled() == N as usize
    })
    .await;
    apps
}

/// What mounts `pair`'s subscription of `source` on `tally`: a batch handler, 5 a batch, with
/// [`Batch`], else one message a call.
fn mount_of<S>(
    source: S,
    tally: &Tally,
    pair: &[Feature],
) -> impl FnOnce(&mut Mount<RedisBroker>) + Clone + Send + Sync + 'static
where
    S: Source<Broker = RedisBroker> + Clone + Sync,
{
    let (t, batch) = (tally.clone(), pair.contains(&Batch));
    move |b: &mut Mount<RedisBroker>| {
        if batch {
            b.include(subscriber(source, t).batch(5).build());
        } else {
            b.include(subscriber(source, t).build());
        }
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
