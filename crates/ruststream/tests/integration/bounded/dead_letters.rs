//! Dead-letter lists: `.dead_letter_max_len(n)` trims the oldest past `n` exactly, on a
//! reliable list with priorities, a stream group, a simple list and a batch handler on
//! partitions, counted in `ruststream_dead_letters_trimmed_total`; `.dead_letter_max_age(d)` drops
//! those that died longer ago; zero bounds are refused at startup.

use crate::harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::metrics::{prometheus, sample};
use harness::{Env, on};
use ruststream::list;
use ruststream::prelude::*;
use ruststream::{BatchContext, BatchOutcome, HandleBatch};

use super::{Job, jobs};

on!(
    [memory, standalone, cluster] multi_thread:
    dead_letters_past_max_len_are_trimmed_oldest_first_on_a_list_with_priorities,
    dead_letters_past_max_len_are_trimmed_oldest_first_on_a_stream,
    dead_letters_past_max_len_are_trimmed_oldest_first_on_a_simple_list,
    dead_letters_past_max_age_are_trimmed,
    a_batch_handler_on_partitions_keeps_each_partitions_dead_letters_within_the_bound,
);

on!([memory] zero_dead_letter_bounds_are_refused_at_startup);

// -- dead-letter lists -------------------------------------------------------------------------

/// Drops every message it gets (each becomes a dead letter) and counts them.
#[derive(Clone, Default)]
struct Dropper {
    seen: Arc<Mutex<Vec<u32>>>,
}

impl Dropper {
    fn count(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }
}

impl Handle<Job> for Dropper {
    async fn handle(&self, job: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.seen.lock().expect("lock").push(job.n);
        Err(HandlerOutcome::drop())
    }
}

/// The jobs of the dead-letter list `dead` (a name without the prefix), newest first.
async fn dead_jobs(env: &Env, dead: &str) -> Vec<u32> {
    env.frames(dead)
        .await
        .into_iter()
        .map(|f| serde_json::from_slice::<Job>(&f.payload).expect("a Job").n)
        .collect()
}

/// `ruststream_dead_letters_trimmed_total` of the queue `queue` (its full name).
fn trimmed_metric(queue: &str) -> f64 {
    let label = format!("queue=\"{queue}\"");
    sample(
        &prometheus().render(),
        "ruststream_dead_letters_trimmed_total",
        &[&label],
    )
    .unwrap_or(0.0)
}

/// Starts `source` into a [`Dropper`], publishes jobs `0..12` one by one (each dead-lettered
/// before the next), and checks the dead-letter list `dead` keeps the newest 5 and the metric
/// of `queue` (a name without the prefix) counts the 7 trimmed.
async fn trims_past_max_len(
    env: &Env,
    source: impl ruststream::Source<Broker = RedisBroker>,
    queue: &str,
    dead: &str,
) {
    prometheus();
    let dropper = Dropper::default();
    let handler = dropper.clone();
    let app = env
        .start_with(move |b| {
            b.include(subscriber(source, handler).build());
        })
        .await;
    let publisher = env.broker().publisher();
    for n in 0..12_u32 {
        publisher
            .message(&Job { n })
            .to(queue)
            .publish()
            .await
            .expect("publish");
        let want = usize::try_from(n).expect("n") + 1;
        env.eventually(&format!("job {n} dead-lettered"), async || {
            dropper.count() == want && dead_jobs(env, dead).await.first() == Some(&n)
        })
        .await;
    }
    env.stop(app).await;
    assert_eq!(
        dead_jobs(env, dead).await,
        vec![11, 10, 9, 8, 7],
        "the newest 5 are kept, the oldest trimmed"
    );
    for f in env.frames(dead).await {
        let at: u64 = f
            .headers
            .get(ruststream::redis::DEAD_AT_HEADER)
            .and_then(|t| t.parse().ok())
            .expect("each dead letter has its dead-at");
        assert!(at > 0, "dead-at {at}");
    }
    assert_eq!(trimmed_metric(&env.key(queue)), 7.0, "7 trims counted");
}

async fn dead_letters_past_max_len_are_trimmed_oldest_first_on_a_list_with_priorities(env: &Env) {
    let source = RedisList::new("{dl}")
        .reliable()
        .priorities(3)
        .concurrency(1)
        .dead_letter_max_len(5);
    trims_past_max_len(env, source, "{dl}", "{dl}.dead").await;
}

async fn dead_letters_past_max_len_are_trimmed_oldest_first_on_a_stream(env: &Env) {
    let source = RedisStream::new("{ds}")
        .group("g")
        .concurrency(1)
        .dead_letter_max_len(5);
    trims_past_max_len(env, source, "{ds}", "{ds}.dead").await;
}

async fn dead_letters_past_max_len_are_trimmed_oldest_first_on_a_simple_list(env: &Env) {
    let source = RedisList::new("{dsimple}")
        .concurrency(1)
        .dead_letter_max_len(5);
    trims_past_max_len(env, source, "{dsimple}", "{dsimple}.dead").await;
}

/// Starts a reliable list `{dage}` whose dead letters are kept `age`, publishes `jobs` to it
/// and waits until its dead-letter list holds `then` (newest first), then stops it.
async fn dead_letter_aged(env: &Env, age: Duration, jobs: &[Job], then: &[u32]) {
    let handler = Dropper::default();
    let app = env
        .start_with(move |b| {
            let source = RedisList::new("{dage}")
                .reliable()
                .concurrency(1)
                .dead_letter_max_age(age);
            b.include(subscriber(source, handler).build());
        })
        .await;
    env.broker()
        .publisher()
        .messages(jobs)
        .to("{dage}")
        .publish()
        .await
        .expect("publish");
    env.eventually(&format!("the dead letters {then:?}"), async || {
        dead_jobs(env, "{dage}.dead").await == then
    })
    .await;
    env.stop(app).await;
}

async fn dead_letters_past_max_age_are_trimmed(env: &Env) {
    // The default (30 days) on the model's virtual clock; a short age on a server, long enough
    // that a loaded machine's app start (between the last two dead letters) stays well inside
    // its half. The app is stopped while the time passes: on the virtual clock its timers would
    // fire for 30 days.
    let age = if env.is_memory() {
        ruststream::redis::DEFAULT_DEAD_LETTER_MAX_AGE
    } else {
        Duration::from_secs(2)
    };
    prometheus();
    let metric = || trimmed_metric(&env.key("{dage}"));
    dead_letter_aged(env, age, &jobs(0, 3), &[2, 1, 0]).await;
    env.advance(age / 2).await;
    dead_letter_aged(env, age, &jobs(3, 1), &[3, 2, 1, 0]).await;
    assert_eq!(metric(), 0.0, "none is older than the age yet");
    env.advance(age / 2 + Duration::from_millis(50)).await;
    dead_letter_aged(env, age, &jobs(4, 1), &[4, 3]).await;
    assert_eq!(
        metric(),
        3.0,
        "the first 3 trimmed for their age, and counted"
    );
}

async fn zero_dead_letter_bounds_are_refused_at_startup(env: &Env) {
    let refused = |source: RedisList| {
        env.app(move |b| {
            b.include(subscriber(source, Dropper::default()).build());
        })
    };
    let e = env
        .refusal(refused(RedisList::new("{z}").dead_letter_max_len(0)))
        .await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("dead_letter_max_len", Some("{z}"))
    );
    assert!(e.fix.contains(".dead_letter_max_len(1_000_000)"), "{e}");
    let e = env
        .refusal(refused(
            RedisList::new("{z}").dead_letter_max_age(Duration::ZERO),
        ))
        .await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("dead_letter_max_age", Some("{z}"))
    );
    assert!(e.fix.contains("Duration::from_secs"), "{e}");
}

/// Drops every batch whole, counting the items.
#[derive(Clone, Default)]
struct BatchDropper(Arc<Mutex<usize>>);

impl HandleBatch<Job> for BatchDropper {
    async fn handle_batch(&self, jobs: &[Job], _: &mut BatchContext<'_>) -> BatchOutcome {
        *self.0.lock().expect("lock") += jobs.len();
        BatchOutcome::all(HandlerOutcome::drop())
    }
}

async fn a_batch_handler_on_partitions_keeps_each_partitions_dead_letters_within_the_bound(
    env: &Env,
) {
    prometheus();
    let broker = env.broker_with(|b| b.route("dbp", list::Publish::new().partitions(2)));
    let handler = BatchDropper::default();
    let h = handler.clone();
    let app = env
        .start(
            RustStream::new(AppInfo::new("bounded", "0.0.0"))
                .shutdown_timeout(Duration::from_secs(1))
                .with_broker(broker.clone(), move |b| {
                    let source = RedisList::new("dbp")
                        .reliable()
                        .partitions(2)
                        .dead_letter_max_len(3);
                    b.include(subscriber(source, h).batch(4).build());
                }),
        )
        .await;
    broker
        .publisher()
        .messages(&jobs(0, 20))
        .to("dbp")
        .publish()
        .await
        .expect("publish");
    env.eventually(
        "every job dead-lettered, each partition trimmed to 3",
        async || {
            *handler.0.lock().expect("lock") == 20
                && env.llen("{dbp:0}.dead").await == 3
                && env.llen("{dbp:1}.dead").await == 3
        },
    )
    .await;
    env.stop(app).await;
    let trims: f64 = ["{dbp:0}", "{dbp:1}"]
        .iter()
        .map(|p| trimmed_metric(&env.key(p)))
        .sum();
    assert_eq!(trims, 14.0, "20 dead letters, 6 kept: 14 trims counted");
}
