//! Priority levels on a list queue (`RedisList::new(k).priorities(n)`, `.priority(i)` on a
//! publish): several apps read one queue, on the in-memory model (what `TestApp` runs on), the
//! standalone server and the cluster. The highest non-empty level is always taken first, a dead
//! reader's claims, retries and requeued dead letters come back onto their own level, a reader
//! waiting on an empty queue wakes for any level, and bad settings are refused with a fix.

use crate::harness;

use std::time::Duration;

use harness::{Env, Stuck, WAIT, on, start, stop, wait_until};
use ruststream::prelude::*;
use ruststream::testing::TestApp;
use ruststream::{RedisSource, list, subscriber};

on!(
    [memory, memory_cluster, standalone, cluster] multi_thread:
    a_backlog_is_taken_highest_level_first_by_every_app,
    a_simple_list_pops_the_highest_level_first,
    a_waiting_reader_wakes_for_a_message_on_any_level,
    a_dead_readers_claims_come_back_onto_their_level,
    retries_and_requeued_dead_letters_keep_their_level,
    every_partition_has_the_levels,
);

on!([memory, cluster] bad_priority_settings_are_refused_with_a_fix);

on!([memory, standalone, cluster] a_level_of_another_type_stops_the_claim_before_it_moves_anything);

/// The queue of every test: in a hash tag, so its levels share its slot on a cluster.
const JOBS: &str = "{jobs}";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    level: u8,
    n: u32,
}

outgoing!(Job);

type Seen = harness::Seen<Job>;

/// The levels of the jobs `seen` handled, in handling order. Each level travels with its
/// message as the `rs.priority` header (none on level 0), through retries and recovery too.
fn levels(seen: &Seen) -> Vec<u8> {
    let jobs = seen.jobs();
    for ((job, attempt), headers) in jobs.iter().zip(seen.headers()) {
        let expected = (job.level > 0).then(|| job.level.to_string());
        assert_eq!(
            headers.get("rs.priority"),
            expected.as_ref(),
            "{job:?} at {attempt}"
        );
    }
    jobs.iter().map(|(j, _)| j.level).collect()
}

/// An app on a broker of its own (its own connections, as another process would have) with one
/// subscriber; a 1 s shutdown timeout.
fn app(env: &Env, source: RedisList, handler: impl Handle<Job>) -> RustStream {
    RustStream::new(AppInfo::new("priorities", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(env.broker_with(|b| b), move |b| {
            b.include(subscriber(source, handler).build());
        })
}

/// A producer-only broker that knows `JOBS` has `n` levels.
fn producer(env: &Env, n: u8) -> RedisBroker {
    env.broker_with(|b| b.route(JOBS, list::Publish::new().priorities(n)))
}

/// Publishes one job per level of `levels` (job `n` is the n-th), one call each.
async fn publish(broker: &RedisBroker, levels: &[u8]) {
    for (n, &level) in (0..).zip(levels) {
        publish_one(broker, level, n).await;
    }
}

/// Ten jobs on each of three levels, interleaved.
fn mixed() -> Vec<u8> {
    (0..30).map(|n| (n % 3) as u8).collect()
}

/// Position of the last job of `level` and of the first of `other` in handling order.
fn last_and_first(levels: &[u8], level: u8, other: u8) -> (usize, usize) {
    let last = levels
        .iter()
        .rposition(|l| *l == level)
        .expect("level seen");
    let first = levels.iter().position(|l| *l == other).expect("other seen");
    (last, first)
}

async fn a_backlog_is_taken_highest_level_first_by_every_app(env: &Env) {
    let broker = producer(env, 3);
    broker.connect().await.expect("connect");
    publish(&broker, &mixed()).await;
    assert_eq!(env.llen(JOBS).await, 10, "level 0 is the key itself");
    assert_eq!(env.llen("{jobs}.p1").await, 10);
    assert_eq!(env.llen("{jobs}.p2").await, 10);
    let source = || RedisList::new(JOBS).reliable().priorities(3).concurrency(1);
    let operator = broker.operator(&[RedisSource::from(source())]);
    operator.connect().await.expect("operator");
    let inspected = operator.inspect(Some(JOBS)).await.expect("inspect");
    assert_eq!(inspected[0].levels, Some(vec![10, 10, 10]));
    assert_eq!(inspected[0].ready, Some(30));

    // Each app claims one job at a time (concurrency 1) and handles it before it claims the
    // next, so its own handling order is its claim order, whatever the load does to the others.
    let seen: [Seen; 3] = std::array::from_fn(|_| Seen::acking());
    let mut apps = Vec::new();
    for s in &seen {
        apps.push(start(app(env, source(), s.clone())).await);
    }
    let handled = || seen.iter().map(Seen::count).sum::<usize>();
    wait_until("30 handled", WAIT, async || handled() == 30).await;
    wait_until("settled", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;
    for running in apps {
        stop(running).await;
    }
    // Every claim takes the highest non-empty level, so each app's claims never go up a level.
    // (The apps' handlings interleave by timing, so their merged order proves less.)
    let mut ns = Vec::new();
    for s in &seen {
        let order = levels(s);
        assert!(
            order.windows(2).all(|w| w[0] >= w[1]),
            "an app took a higher level after a lower one: {order:?}"
        );
        ns.extend(s.jobs().iter().map(|(j, _)| j.n));
    }
    ns.sort_unstable();
    assert_eq!(ns, (0..30).collect::<Vec<_>>(), "each once");
}

async fn a_simple_list_pops_the_highest_level_first(env: &Env) {
    let broker = producer(env, 3);
    broker.connect().await.expect("connect");
    publish(&broker, &mixed()).await;
    let seen = Seen::acking();
    let source = || RedisList::new(JOBS).priorities(3).concurrency(1);
    let apps = [
        start(app(env, source(), seen.clone())).await,
        start(app(env, source(), seen.clone())).await,
    ];
    wait_until("30 handled", WAIT, async || seen.count() == 30).await;
    for running in apps {
        stop(running).await;
    }
    let order = levels(&seen);
    let (last_high, first_low) = last_and_first(&order, 2, 0);
    assert!(last_high < first_low, "{order:?}");
    assert!(order[..9].iter().all(|l| *l == 2), "{order:?}");
    for key in [JOBS, "{jobs}.p1", "{jobs}.p2"] {
        assert_eq!(env.llen(key).await, 0, "{key}");
    }
}

async fn a_waiting_reader_wakes_for_a_message_on_any_level(env: &Env) {
    // Readers block on level 0 for a minute: only the level's wake-up brings them back sooner.
    let block = Duration::from_secs(60);
    let seen = Seen::acking();
    let reliable = RedisList::new(JOBS)
        .reliable()
        .priorities(4)
        .block(block)
        .schedule_interval(block);
    let apps = [
        start(app(env, reliable.clone(), seen.clone())).await,
        start(app(env, reliable, seen.clone())).await,
    ];
    let broker = producer(env, 4);
    broker.connect().await.expect("connect");
    // Let both readers run into their blocking read.
    env.advance(Duration::from_millis(200)).await;
    for (i, level) in [3u8, 1, 2, 0].into_iter().enumerate() {
        let asked = tokio::time::Instant::now();
        publish_one(&broker, level, u32::try_from(i).expect("small")).await;
        wait_until("handled", WAIT, async || seen.count() == i + 1).await;
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "level {level} took {:?}",
            asked.elapsed()
        );
        // Both readers are back in their blocking read before the next level is tried.
        env.advance(Duration::from_millis(200)).await;
    }
    for running in apps {
        stop(running).await;
    }
}

async fn publish_one(broker: &RedisBroker, level: u8, n: u32) {
    broker
        .publisher()
        .message(&Job { level, n })
        .to(JOBS)
        .priority(level)
        .publish()
        .await
        .expect("publish");
}

async fn a_dead_readers_claims_come_back_onto_their_level(env: &Env) {
    const MIN_IDLE: Duration = Duration::from_millis(500);
    let source = |c| {
        RedisList::new(JOBS)
            .reliable()
            .priorities(3)
            .min_idle(MIN_IDLE)
            .concurrency(c)
    };
    // Published before the first reader starts, so it claims all four in one run: one claim
    // time, so they fall stale (and are swept back) together.
    let broker = producer(env, 3);
    broker.connect().await.expect("connect");
    publish(&broker, &[2, 0, 2, 0]).await;
    let stuck = Stuck::default();
    let first =
        start(app(env, source(4), stuck.clone()).shutdown_timeout(Duration::from_millis(100)))
            .await;
    wait_until("4 claimed", WAIT, async || stuck.started() == 4).await;
    stop(first).await;
    assert_eq!(env.llen("{jobs}.processing").await, 4);
    // Fresh work on level 0 that the second reader takes while the claims are not stale yet.
    publish(&broker, &[0, 0, 0]).await;

    // One reader, one message at a time, so the handling order is the claim order (two readers
    // may record the claims on either side of a level's boundary in either order).
    let seen = Seen::acking();
    let second = start(app(env, source(1), seen.clone())).await;
    wait_until("7 handled", WAIT, async || seen.count() == 7).await;
    wait_until("settled", WAIT, async || {
        env.llen("{jobs}.processing").await == 0
    })
    .await;
    stop(second).await;
    // The sweep puts all four back before it claims: the two of level 2 are taken first, the
    // two of level 0 after the fresh ones queued before them.
    let recovered: Vec<u8> = seen
        .jobs()
        .iter()
        .filter(|(_, attempt)| *attempt == 2)
        .map(|(j, _)| j.level)
        .collect();
    assert_eq!(recovered, [2, 2, 0, 0], "{:?}", seen.jobs());
    assert_eq!(env.zcard("{jobs}.claims").await, 0);
}

async fn retries_and_requeued_dead_letters_keep_their_level(env: &Env) {
    // Level 2 retries at once (no backoff: `settle.lua` pushes it back) and level 1 dies on its first attempt: the retry goes back onto
    // level 2 (ahead of the level 0 backlog), the dead letters are requeued onto level 1.
    let seen = Seen::new(|job, attempt| match (job.level, attempt) {
        (2, 1) => Err(HandlerOutcome::retry()),
        (1, 1) => Err(HandlerOutcome::drop()),
        _ => Ok(()),
    });
    let broker = producer(env, 3);
    broker.connect().await.expect("connect");
    publish(&broker, &[0, 0, 0, 0, 0, 0, 2, 2, 1, 1]).await;
    let source = || {
        RedisList::new(JOBS)
            .reliable()
            .priorities(3)
            .concurrency(1)
            .retry(Backoff::immediate())
    };
    let apps = [
        start(app(env, source(), seen.clone())).await,
        start(app(env, source(), seen.clone())).await,
    ];
    wait_until("12 handled", WAIT, async || seen.count() == 12).await;
    let order = levels(&seen);
    let (last_high, first_low) = last_and_first(&order, 2, 0);
    assert!(last_high < first_low, "retries keep level 2: {order:?}");
    wait_until("2 dead", WAIT, async || env.llen("{jobs}.dead").await == 2).await;
    for running in apps {
        stop(running).await;
    }
    // Requeued with nobody reading: they wait on level 1, not level 0.
    let operator = broker.operator(&[RedisSource::from(source())]);
    operator.connect().await.expect("operator");
    let moved = operator
        .requeue(
            JOBS,
            &ruststream::redis::operate::Select::All { limit: None },
        )
        .await
        .expect("requeue");
    assert_eq!(moved, 2);
    assert_eq!(env.llen("{jobs}.p1").await, 2);
    assert_eq!(env.llen(JOBS).await, 0);
}

async fn every_partition_has_the_levels(env: &Env) {
    let broker =
        env.broker_with(|b| b.route("jobs", list::Publish::new().partitions(2).priorities(2)));
    broker.connect().await.expect("connect");
    for n in 0..8 {
        broker
            .publisher()
            .message(&Job { level: 1, n })
            .to("jobs")
            .priority(1)
            .publish()
            .await
            .expect("publish");
    }
    assert_eq!(env.llen("{jobs:0}.p1").await, 4);
    assert_eq!(env.llen("{jobs:1}.p1").await, 4);
    let seen = Seen::acking();
    let source = RedisList::new("jobs")
        .reliable()
        .partitions(2)
        .priorities(2);
    let running = start(app(env, source, seen.clone())).await;
    wait_until("8 handled", WAIT, async || seen.count() == 8).await;
    stop(running).await;
}

async fn bad_priority_settings_are_refused_with_a_fix(env: &Env) {
    for n in [0, 1, 17] {
        let e = env
            .try_start(app(
                env,
                RedisList::new(JOBS).reliable().priorities(n),
                Seen::acking(),
            ))
            .await
            .expect_err("refused");
        let config = harness::config_error(&e);
        assert_eq!(config.option, "priorities", "{n}: {e}");
        assert_eq!(config.subject.as_deref(), Some(JOBS), "{n}: {e}");
        assert!(config.problem.contains("between 2 and 16"), "{n}: {e}");
        assert!(config.fix.contains("leave priorities out"), "{n}: {e}");
    }
    let e = env
        .try_start(RustStream::new(AppInfo::new("p", "0")).with_broker(
            env.broker_with(|b| b.route(JOBS, list::Publish::new().priorities(40))),
            |_| {},
        ))
        .await
        .expect_err("a route with 40 levels is refused");
    let config = harness::config_error(&e);
    assert_eq!(config.option, "priorities", "{e}");
    assert_eq!(config.subject.as_deref(), Some(JOBS), "{e}");

    let broker = producer(env, 3);
    broker.connect().await.expect("connect");
    let publish = |to: &'static str, level: u8| {
        let broker = broker.clone();
        async move {
            broker
                .publisher()
                .message(&Job { level, n: 0 })
                .to(to)
                .priority(level)
                .publish()
                .await
                .expect_err("refused")
                .config_error()
                .cloned()
                .expect("a configuration error")
        }
    };
    let e = publish(JOBS, 3).await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        (".priority(..)", Some(JOBS))
    );
    assert!(e.problem.contains("above its highest level 2"), "{e}");
    let e = publish("{plain}", 1).await;
    assert_eq!(e.subject.as_deref(), Some("{plain}"));
    assert!(e.fix.contains("list::Publish::new().priorities(n)"), "{e}");
    assert_eq!(
        env.llen(JOBS).await + env.llen("{plain}").await,
        0,
        "nothing sent"
    );
    let streamed = env.broker_with(|b| b.route("events", ruststream::stream::Publish::new()));
    let e = streamed
        .publisher()
        .message(&Job { level: 1, n: 0 })
        .to("events")
        .priority(1)
        .publish()
        .await
        .expect_err("refused");
    let config = harness::config_error(&e);
    assert_eq!(config.option, ".priority(..)", "{e}");
    assert!(config.problem.contains("is a stream"), "{e}");
}

async fn a_level_of_another_type_stops_the_claim_before_it_moves_anything(env: &Env) {
    let _logs = harness::logs::captured();
    let stray = env.key("{jobs}.p1");
    env.cmd("SET", vec![stray.clone().into(), "not a list".into()])
        .await
        .expect("set");
    let broker = producer(env, 3);
    broker.connect().await.expect("connect");
    publish(&broker, &[0]).await;
    let seen = Seen::acking();
    let source = RedisList::new(JOBS).reliable().priorities(3);
    let running = start(app(env, source, seen.clone())).await;
    // The claim checks every level's type before its first write: it fails whole.
    let says = format!("WRONGTYPE key {stray} holds a string");
    wait_until("the claim's error is logged", WAIT, async || {
        harness::logs::text().contains(&says)
    })
    .await;
    assert_eq!(seen.count(), 0);
    assert_eq!(env.llen(JOBS).await, 1, "nothing claimed");
    assert_eq!(env.llen("{jobs}.processing").await, 0);
    env.cmd("DEL", vec![stray.clone().into()])
        .await
        .expect("del");
    wait_until("handled once the key is gone", WAIT, async || {
        seen.count() == 1
    })
    .await;
    stop(running).await;
}

/// On `TestApp`'s virtual clock: delayed messages of every level fall due together, and the
/// mover puts each onto its level, so the highest are handled first.
#[tokio::test(start_paused = true)]
async fn testapp_delayed_messages_fall_due_onto_their_level() -> ruststream::Result<()> {
    // Level 1 is retried an hour later: its retry keeps its level header through the delayed
    // set and is handled again on level 1.
    let seen = Seen::new(|job, attempt| match (job.level, attempt) {
        (1, 1) => Err(HandlerOutcome::retry_after(Duration::from_secs(3600))),
        _ => Ok(()),
    });
    let source = RedisList::new(JOBS).reliable().priorities(3).concurrency(1);
    let app = RustStream::new(AppInfo::new("p", "0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379"),
        |b| {
            b.include(subscriber(source, seen.clone()).build());
        },
    );
    let tb = TestApp::start(app).await?;
    for (n, level) in (0..).zip([0u8, 1, 2, 0, 1, 2]) {
        tb.broker::<RedisBroker>()
            .message(&Job { level, n })
            .to(JOBS)
            .priority(level)
            .delay(Duration::from_secs(3600))
            .publish()
            .await?;
    }
    tb.advance(Duration::from_secs(3599)).await?;
    assert_eq!(seen.count(), 0);
    tb.advance(Duration::from_secs(2)).await?;
    assert_eq!(levels(&seen), [2, 2, 1, 1, 0, 0]);
    tb.advance(Duration::from_secs(3601)).await?;
    let retried: Vec<(u8, u32)> = seen.jobs()[6..]
        .iter()
        .map(|(j, a)| (j.level, *a))
        .collect();
    assert_eq!(retried, [(1, 2), (1, 2)]);
    // A publish onto a level is a publish to the queue in the record.
    let urgent = Job { level: 2, n: 9 };
    let b = tb.broker::<RedisBroker>();
    b.message(&urgent).to(JOBS).priority(2).publish().await?;
    let published = b.published::<Job>(JOBS);
    published.assert_called(7);
    assert_eq!(levels(&seen).last(), Some(&2));
    tb.shutdown().await
}
