//! How a subscription runs its handlers, on a reliable list: the concurrency limit, the batch
//! runners (`dispatch/runners.rs`), and what a stop leaves behind (an unfinished entry claimed,
//! no open connection). On the in-memory model, the standalone server and the cluster, as
//! `lists.rs`, whose job type and helpers these tests share.

use crate::harness;
use crate::lists::{Job, Probe, info, job_json, publish};

use std::future::pending;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use harness::{Env, WAIT, bounded, on, stand, start, stop, wait_until, with_db};
use ruststream::prelude::*;
use tokio::time::Instant;

on!(
    [memory, standalone, cluster] multi_thread:
    shutdown_leaves_an_unfinished_entry_claimed,
    batches_of_every_size_run_side_by_side_once_each_and_idle_runners_stop_at_once,
);

// Not on the model: the concurrency test samples the processing list in a loop that never
// waits (the model answers at once, so on the paused clock it would starve the app).
on!([standalone, cluster] multi_thread: the_concurrency_limit_is_never_exceeded);

// Standalone only: it counts the connections on a database, and a cluster has no databases.
on!([standalone] multi_thread: shutdown_closes_every_connection);

/// A handler that never finishes.
#[derive(Clone, Default)]
struct Stuck(Arc<AtomicUsize>);

impl Handle<Job> for Stuck {
    async fn handle(&self, _: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.0.fetch_add(1, Ordering::SeqCst);
        pending::<()>().await;
        Ok(())
    }
}

async fn shutdown_leaves_an_unfinished_entry_claimed(env: &Env) {
    let broker = env.broker();
    let stuck = Stuck::default();
    let handler = stuck.clone();
    let app = RustStream::new(info())
        .shutdown_timeout(Duration::from_millis(200))
        .with_broker(broker.clone(), move |b| {
            b.include(subscriber(RedisList::new("{jobs}").reliable(), handler).build());
        });
    let app = start(app).await;
    publish(&broker, "{jobs}", 1).await;
    wait_until("the handler to start", WAIT, async || {
        stuck.0.load(Ordering::SeqCst) == 1
    })
    .await;

    let began = Instant::now();
    bounded(
        "shutdown with a stuck handler",
        Duration::from_secs(2),
        app.shutdown(),
    )
    .await
    .expect("shutdown");
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(200),
        "did not wait for the handler: {took:?}"
    );

    assert_eq!(env.llen("{jobs}").await, 0);
    let claimed = env.frames("{jobs}.processing").await;
    assert_eq!(claimed.len(), 1, "the unfinished entry stays claimed");
    assert_eq!((claimed[0].attempt, &claimed[0].payload), (1, &job_json(1)));
    assert!(!env.exists("{jobs}.dead").await);
}

/// Records each job it handles; the jobs below `gate` wait until `gate` of them have started.
#[derive(Clone, Default)]
struct Gated {
    gate: u32,
    started: Arc<AtomicUsize>,
    all_in: Arc<tokio::sync::Notify>,
    seen: Arc<Mutex<Vec<u32>>>,
}

impl Handle<Job> for Gated {
    async fn handle(&self, job: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        if job.n < self.gate {
            let waiting = self.all_in.notified();
            tokio::pin!(waiting);
            waiting.as_mut().enable();
            if self.started.fetch_add(1, Ordering::SeqCst) + 1 == self.gate as usize {
                self.all_in.notify_waiters();
            } else {
                waiting.await;
            }
        }
        self.seen.lock().expect("seen").push(job.n);
        Ok(())
    }
}

// A subscription's batch runners (`dispatch/runners.rs`): two claimed batches run side by side
// (the first 8 jobs, at concurrency 8 and claims of at most 4, each wait until all 8 have
// started, so a batch queued behind a busy runner hangs the test); batches of every size then
// reuse the runners' slots, each job handled once; and at stop the idle runners end at once,
// not at `shutdown_timeout`.
async fn batches_of_every_size_run_side_by_side_once_each_and_idle_runners_stop_at_once(env: &Env) {
    let broker = env.broker();
    let handler = Gated {
        gate: 8,
        ..Gated::default()
    };
    let seen = handler.seen.clone();
    let source = RedisList::new("{jobs}").reliable().concurrency(8);
    let app = RustStream::new(info())
        .shutdown_timeout(Duration::from_secs(60))
        .with_broker(broker.clone(), move |b| {
            b.include(subscriber(source, handler).build());
        });
    let app = start(app).await;
    for n in 0..8 {
        publish(&broker, "{jobs}", n).await;
    }
    wait_until("the 8 gated jobs, side by side", WAIT, async || {
        seen.lock().expect("seen").len() == 8
    })
    .await;
    let mut next = 8;
    for size in [1, 4, 2, 3, 1, 4] {
        for n in next..next + size {
            publish(&broker, "{jobs}", n).await;
        }
        next += size;
        wait_until("a batch handled", WAIT, async || {
            seen.lock().expect("seen").len() == next as usize
        })
        .await;
    }
    wait_until("the processing list to empty", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;

    let began = Instant::now();
    bounded("the stop", Duration::from_secs(30), app.shutdown())
        .await
        .expect("shutdown");
    let took = began.elapsed();
    assert!(took < Duration::from_secs(10), "the stop waited {took:?}");
    let mut handled = seen.lock().expect("seen").clone();
    handled.sort_unstable();
    assert_eq!(handled, (0..next).collect::<Vec<_>>());
    assert_eq!(env.llen("{jobs}").await, 0);
    assert_eq!(env.llen("{jobs}.processing").await, 0);
}

/// Client connections (of any type) whose selected database is `db`.
async fn connections_on(client: &Client, db: u8) -> usize {
    let list: String = client
        .custom(fred::cmd!("CLIENT"), vec!["LIST"])
        .await
        .expect("CLIENT LIST");
    let tag = format!(" db={db} ");
    list.lines().filter(|l| l.contains(&tag)).count()
}

async fn shutdown_closes_every_connection(env: &Env) {
    // A database no other test of this file selects, so its connections can be counted.
    const DB: u8 = 13;
    let url = with_db(env.url().expect("the standalone server"), DB);
    let client = stand::connect(Config::from_url(&url).expect("a valid URL")).await;
    let before = connections_on(&client, DB).await;
    for _ in 0..2 {
        let broker = RedisBroker::standalone(url.clone()).prefix(env.prefix.clone());
        let app = RustStream::new(info()).with_broker(broker, |b| {
            b.include(subscriber(RedisList::new("a").reliable(), Probe::acking()).build());
            b.include(subscriber(RedisList::new("b"), Probe::acking()).build());
        });
        let app = start(app).await;
        let running = connections_on(&client, DB).await;
        assert!(
            running >= before + 3,
            "a pool and two readers: {running} connections, {before} before"
        );
        stop(app).await;
        wait_until("the app's connections to close", WAIT, async || {
            connections_on(&client, DB).await == before
        })
        .await;
    }
    let _ = client.quit().await;
}

/// Counts handlers running at once.
#[derive(Clone, Default)]
pub(crate) struct Busy {
    now: Arc<AtomicUsize>,
    pub(crate) max: Arc<AtomicUsize>,
    pub(crate) done: Arc<AtomicUsize>,
}

impl Handle<Job> for Busy {
    async fn handle(&self, _: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        // The work itself.
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        self.done.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn the_concurrency_limit_is_never_exceeded(env: &Env) {
    const N: u32 = 200;
    let broker = env.broker();
    broker.connect().await.expect("connect");
    let jobs: Vec<Job> = (0..N).map(|n| Job { n }).collect();
    broker
        .publisher()
        .messages(&jobs)
        .to("{jobs}")
        .publish()
        .await
        .expect("publish");
    assert_eq!(env.llen("{jobs}").await, i64::from(N));

    // Samples the processing list's length while the app runs.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let client = env.client.clone();
        let key = env.key("{jobs}.processing");
        let sampling = sampling.clone();
        tokio::spawn(async move {
            let (mut max, mut samples) = (0_i64, 0_u32);
            while sampling.load(Ordering::SeqCst) {
                let len: i64 = client.llen(&key).await.expect("LLEN");
                max = max.max(len);
                samples += 1;
            }
            (max, samples)
        })
    };

    let busy = Busy::default();
    let handler = busy.clone();
    let app = RustStream::new(info()).with_broker(broker.clone(), move |b| {
        b.include(subscriber(RedisList::new("{jobs}").reliable().concurrency(4), handler).build());
    });
    let app = start(app).await;
    wait_until("every entry handled", Duration::from_secs(30), async || {
        busy.done.load(Ordering::SeqCst) == N as usize
    })
    .await;
    wait_until("the processing list to empty", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;
    sampling.store(false, Ordering::SeqCst);
    let (max_processing, samples) = bounded("the sampler", WAIT, sampler)
        .await
        .expect("sampler");
    stop(app).await;

    let max = busy.max.load(Ordering::SeqCst);
    assert_eq!(max, 4, "most handlers at once");
    // Four being handled (or handed to the settler), and at most one batch of four being settled
    // while the next claim runs.
    assert!(
        (1..=8).contains(&max_processing),
        "most entries in the processing list: {max_processing} ({samples} samples)"
    );
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}
