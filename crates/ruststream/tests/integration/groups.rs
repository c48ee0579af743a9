//! Fair groups on a list queue (`RedisList::new(k).reliable().groups()`, `.group(tenant)` on a
//! publish): on the in-memory model (what `TestApp` runs on), the standalone server and the
//! cluster. Readers take round robin over the non-empty groups, so a small group is served while
//! a large backlog waits; every way back (a retry, the recovery sweep, a delayed message, a
//! requeued dead letter) returns a message to its own group; a per-group rate limit and an
//! operator's group pause pass one group over and serve the others; `inspect` lists the largest
//! groups; a per-group cap passes a group at its cap over and each settle frees its place; a key
//! of another type changes nothing; bad settings are refused with a fix.

use crate::harness;

use std::time::Duration;

use harness::{Env, Stuck, WAIT, on, start, stop, wait_until};
use ruststream::prelude::*;
use ruststream::redis::operate::Select;
use ruststream::{RedisSource, list, subscriber};

on!(
    [memory, memory_cluster, standalone, cluster] multi_thread:
    groups_are_served_round_robin,
    a_small_group_is_served_while_a_large_backlog_waits,
    a_waiting_reader_wakes_for_a_new_group,
    retries_and_recovered_claims_keep_their_group,
    delayed_and_requeued_messages_go_back_to_their_group,
    a_paused_group_is_passed_over,
    a_group_over_its_rate_limit_is_passed_over,
    a_group_at_its_cap_is_passed_over,
    a_settle_frees_a_group_s_place,
    inspect_lists_the_largest_groups_first,
);

on!([memory, standalone, cluster] a_key_of_another_type_changes_nothing, a_queued_message_of_a_group_is_cancelled);

on!([memory] groups_and_priorities_are_refused_with_a_fix, a_group_cap_it_cannot_hold_is_refused);

/// The queue of every test: in a hash tag, so its groups share its slot on a cluster.
const JOBS: &str = "{jobs}";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    group: String,
    n: u32,
}

outgoing!(Job);

type Seen = harness::Seen<Job>;

/// The groups of the jobs `seen` handled, in handling order; each delivery's `rs.group` header
/// is its job's group, on every attempt.
fn groups(seen: &Seen) -> Vec<String> {
    seen.seen()
        .iter()
        .map(|d| {
            assert_eq!(
                d.header("rs.group"),
                Some(d.group.as_str()),
                "{:?}",
                d.message
            );
            d.group.clone()
        })
        .collect()
}

/// An app on a broker of its own (its own connections, as another process would have) with one
/// subscriber; a 1 s shutdown timeout.
fn app(env: &Env, source: RedisList, handler: impl Handle<Job>) -> RustStream {
    RustStream::new(AppInfo::new("groups", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(env.broker_with(|b| b), move |b| {
            b.include(subscriber(source, handler).build());
        })
}

/// A producer-only broker that knows `JOBS` has groups.
async fn producer(env: &Env) -> RedisBroker {
    let broker = env.broker_with(|b| b.route(JOBS, list::Publish::new().groups()));
    broker.connect().await.expect("connect");
    broker
}

/// A reliable grouped list read one message at a time.
fn grouped() -> RedisList {
    RedisList::new(JOBS).reliable().groups().concurrency(1)
}

/// Publishes `count` jobs of `group`, numbered from `first`, in one call.
async fn publish(broker: &RedisBroker, group: &str, first: u32, count: u32) {
    let jobs: Vec<Job> = (first..first + count)
        .map(|n| Job {
            group: group.to_owned(),
            n,
        })
        .collect();
    broker
        .publisher()
        .messages(&jobs)
        .to(JOBS)
        .group(group)
        .publish()
        .await
        .expect("publish");
}

fn sub(group: &str) -> String {
    format!("{JOBS}.groups:{group}")
}

async fn groups_are_served_round_robin(env: &Env) {
    let broker = producer(env).await;
    publish(&broker, "x", 0, 3).await;
    publish(&broker, "y", 3, 3).await;
    publish(&broker, "z", 6, 2).await;
    assert_eq!(env.llen(&sub("x")).await, 3);
    assert_eq!(
        env.llen(&format!("{JOBS}.groups")).await,
        3,
        "one ring entry a group"
    );
    assert_eq!(env.llen(JOBS).await, 0, "nothing in the inbox");
    let seen = Seen::acking();
    let running = start(app(env, grouped(), seen.clone())).await;
    wait_until("8 handled", WAIT, async || seen.count() == 8).await;
    stop(running).await;
    assert_eq!(groups(&seen), ["x", "y", "z", "x", "y", "z", "x", "y"]);
    assert!(
        !env.exists(&format!("{JOBS}.groups")).await,
        "the ring empties"
    );
}

async fn a_small_group_is_served_while_a_large_backlog_waits(env: &Env) {
    let broker = producer(env).await;
    publish(&broker, "big", 0, 200).await;
    for (i, small) in ["a", "b", "c"].into_iter().enumerate() {
        publish(&broker, small, 1000 + u32::try_from(i).expect("small"), 1).await;
    }
    let seen = Seen::acking();
    let source = || RedisList::new(JOBS).reliable().groups().concurrency(2);
    let apps = [
        start(app(env, source(), seen.clone())).await,
        start(app(env, source(), seen.clone())).await,
    ];
    wait_until("the small groups handled", WAIT, async || {
        groups(&seen).iter().filter(|g| *g != "big").count() == 3
    })
    .await;
    let order = groups(&seen);
    let last_small = order.iter().rposition(|g| g != "big").expect("seen");
    assert!(last_small < 12, "{order:?}");
    wait_until("203 handled", WAIT, async || seen.count() == 203).await;
    for running in apps {
        stop(running).await;
    }
    let mut ns: Vec<u32> = seen.jobs().iter().map(|(j, _)| j.n).collect();
    ns.sort_unstable();
    assert_eq!(ns.len(), 203);
    ns.dedup();
    assert_eq!(ns.len(), 203, "each once");
}

async fn a_waiting_reader_wakes_for_a_new_group(env: &Env) {
    // Readers block on the queue for a minute: only the ring's announcement brings them back.
    let block = Duration::from_secs(60);
    let seen = Seen::acking();
    let source = grouped().block(block).schedule_interval(block);
    let apps = [
        start(app(env, source.clone(), seen.clone())).await,
        start(app(env, source, seen.clone())).await,
    ];
    let broker = producer(env).await;
    env.advance(Duration::from_millis(200)).await;
    for (i, group) in ["a", "b", "a"].into_iter().enumerate() {
        let asked = tokio::time::Instant::now();
        publish(&broker, group, u32::try_from(i).expect("small"), 1).await;
        wait_until("handled", WAIT, async || seen.count() == i + 1).await;
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "{:?}",
            asked.elapsed()
        );
        env.advance(Duration::from_millis(200)).await;
    }
    for running in apps {
        stop(running).await;
    }
}

async fn retries_and_recovered_claims_keep_their_group(env: &Env) {
    const MIN_IDLE: Duration = Duration::from_millis(500);
    let broker = producer(env).await;
    publish(&broker, "a", 0, 2).await;
    publish(&broker, "b", 2, 2).await;
    // A worker that dies with all four claimed: its claims come back after min_idle.
    let stuck = Stuck::default();
    let source = |c| grouped().min_idle(MIN_IDLE).concurrency(c);
    let first =
        start(app(env, source(4), stuck.clone()).shutdown_timeout(Duration::from_millis(100)))
            .await;
    wait_until("4 claimed", WAIT, async || stuck.started() == 4).await;
    stop(first).await;
    assert_eq!(env.llen(&format!("{JOBS}.processing")).await, 4);
    // Group a's messages retry once more (no backoff: the settle puts them back at once).
    let seen = Seen::new(|job, attempt| match (job.group.as_str(), attempt) {
        ("a", 2) => Err(HandlerOutcome::retry()),
        _ => Ok(()),
    });
    let second = start(app(
        env,
        source(1).retry(Backoff::immediate()),
        seen.clone(),
    ))
    .await;
    wait_until("6 handled", WAIT, async || seen.count() == 6).await;
    wait_until("settled", WAIT, async || {
        env.llen(&format!("{JOBS}.processing")).await == 0
    })
    .await;
    stop(second).await;
    let attempts: Vec<(String, u32)> = seen
        .seen()
        .iter()
        .map(|d| (d.group.clone(), d.attempt))
        .collect();
    let _ = groups(&seen);
    assert_eq!(
        attempts.iter().filter(|(g, a)| g == "a" && *a == 3).count(),
        2,
        "{attempts:?}"
    );
    assert_eq!(env.zcard(&format!("{JOBS}.claims")).await, 0);
    assert!(!env.exists(&format!("{JOBS}.groups")).await);
}

async fn delayed_and_requeued_messages_go_back_to_their_group(env: &Env) {
    let broker = producer(env).await;
    let op = broker.operator(&[RedisSource::from(grouped())]);
    op.connect().await.expect("operator");
    // Group a is paused: whatever comes back to it waits in its sub-queue.
    op.pause_group(JOBS, "a").await.expect("pause group");
    broker
        .publisher()
        .message(&Job {
            group: "a".into(),
            n: 0,
        })
        .to(JOBS)
        .group("a")
        .delay(Duration::from_millis(300))
        .publish()
        .await
        .expect("publish");
    // Group b dies on its first attempt, then is requeued.
    let seen = Seen::new(|job, attempt| match (job.group.as_str(), attempt) {
        ("b", 1) => Err(HandlerOutcome::drop()),
        _ => Ok(()),
    });
    publish(&broker, "b", 1, 1).await;
    let running = start(app(env, grouped(), seen.clone())).await;
    wait_until("b dead", WAIT, async || {
        env.llen(&format!("{JOBS}.dead")).await == 1
    })
    .await;
    wait_until("the delayed one sorted onto a", WAIT, async || {
        env.llen(&sub("a")).await == 1
    })
    .await;
    let moved = op
        .requeue(JOBS, &Select::All { limit: None })
        .await
        .expect("requeue");
    assert_eq!(moved, 1);
    wait_until("b handled again", WAIT, async || seen.count() == 2).await;
    assert_eq!(env.llen(&sub("a")).await, 1, "a stays paused");
    assert_eq!(env.llen(JOBS).await, 0, "the inbox is sorted");
    op.resume_group(JOBS, "a").await.expect("resume");
    wait_until("a handled", WAIT, async || seen.count() == 3).await;
    stop(running).await;
    assert_eq!(groups(&seen), ["b", "b", "a"]);
}

async fn a_paused_group_is_passed_over(env: &Env) {
    let broker = producer(env).await;
    let op = broker.operator(&[RedisSource::from(grouped())]);
    op.connect().await.expect("operator");
    op.pause_group(JOBS, "big").await.expect("pause");
    publish(&broker, "big", 0, 5).await;
    publish(&broker, "small", 5, 3).await;
    let seen = Seen::acking();
    let running = start(app(env, grouped(), seen.clone())).await;
    wait_until("small handled", WAIT, async || seen.count() == 3).await;
    env.advance(Duration::from_millis(300)).await;
    assert_eq!(seen.count(), 3, "big waits while paused");
    assert_eq!(env.llen(&sub("big")).await, 5);
    let inspected = op.inspect(Some(JOBS)).await.expect("inspect");
    let g = inspected[0].groups.clone().expect("groups");
    assert_eq!((g.paused, g.largest[0].paused), (1, true));
    op.resume_group(JOBS, "big").await.expect("resume");
    wait_until("all handled", WAIT, async || seen.count() == 8).await;
    stop(running).await;
    assert!(groups(&seen)[..3].iter().all(|g| g == "small"));
}

async fn a_group_over_its_rate_limit_is_passed_over(env: &Env) {
    let broker = producer(env).await;
    publish(&broker, "big", 0, 10).await;
    publish(&broker, "small", 10, 2).await;
    let seen = Seen::acking();
    // Two a minute a group: big's third waits, small's two are served.
    let source = RedisList::new(JOBS)
        .reliable()
        .concurrency(4)
        .group_rate_limit(2, Duration::from_secs(60));
    let running = start(app(env, source, seen.clone())).await;
    wait_until("4 handled", WAIT, async || seen.count() == 4).await;
    env.advance(Duration::from_millis(500)).await;
    assert_eq!(seen.count(), 4, "{:?}", groups(&seen));
    let mut order = groups(&seen);
    order.sort();
    assert_eq!(order, ["big", "big", "small", "small"]);
    assert_eq!(env.llen(&sub("big")).await, 8);
    stop(running).await;
}

/// A cap of one a group, four permits: of each group one handler runs (they never finish), the
/// rest of the group waits while the others are served.
async fn a_group_at_its_cap_is_passed_over(env: &Env) {
    let broker = producer(env).await;
    publish(&broker, "big", 0, 5).await;
    publish(&broker, "small", 5, 2).await;
    let stuck = Stuck::default();
    let source = RedisList::new(JOBS)
        .reliable()
        .concurrency(4)
        .group_max_in_flight(1);
    let running =
        start(app(env, source, stuck.clone()).shutdown_timeout(Duration::from_millis(100))).await;
    wait_until("one of each group", WAIT, async || stuck.started() == 2).await;
    env.advance(Duration::from_millis(300)).await;
    assert_eq!(stuck.started(), 2, "a group at its cap waits");
    assert_eq!(env.llen(&sub("big")).await, 4);
    assert_eq!(env.llen(&sub("small")).await, 1);
    assert_eq!(env.llen(&format!("{JOBS}.processing")).await, 2);
    stop(running).await;
}

/// A cap of two a group: every job is handled, as each settle frees its group's place (were
/// the places not freed, the claims would stop at two of each group: four).
async fn a_settle_frees_a_group_s_place(env: &Env) {
    let broker = producer(env).await;
    publish(&broker, "big", 0, 8).await;
    publish(&broker, "small", 8, 3).await;
    let seen = Seen::acking();
    let source = RedisList::new(JOBS)
        .reliable()
        .concurrency(8)
        .group_max_in_flight(2);
    let running = start(app(env, source, seen.clone())).await;
    wait_until("all handled", WAIT, async || seen.count() == 11).await;
    stop(running).await;
    assert_eq!(env.llen(&format!("{JOBS}.processing")).await, 0);
    assert!(
        !env.exists(&format!("{JOBS}.groups")).await,
        "the ring empties"
    );
}

async fn inspect_lists_the_largest_groups_first(env: &Env) {
    let broker = producer(env).await;
    publish(&broker, "one", 0, 1).await;
    publish(&broker, "three", 1, 3).await;
    publish(&broker, "two", 4, 2).await;
    env.lpush_raw(JOBS, "{\"group\":\"\",\"n\":9}").await;
    let op = broker.operator(&[RedisSource::from(grouped())]);
    op.connect().await.expect("operator");
    let inspected = op.inspect(Some(JOBS)).await.expect("inspect");
    assert_eq!(inspected[0].ready, Some(7), "the groups and the inbox");
    let g = inspected[0].groups.clone().expect("groups");
    assert_eq!((g.inbox, g.groups, g.waiting, g.paused), (1, 3, 6, 0));
    let names: Vec<(&str, u64)> = g
        .largest
        .iter()
        .map(|l| (l.name.as_str(), l.waiting))
        .collect();
    assert_eq!(names, [("three", 3), ("two", 2), ("one", 1)]);
}

async fn a_key_of_another_type_changes_nothing(env: &Env) {
    let broker = producer(env).await;
    // A group's key holding a string: its messages go to the default group, and are served.
    env.cmd("SET", vec![env.key(&sub("bad")).into(), "x".into()])
        .await
        .expect("set");
    publish(&broker, "bad", 0, 1).await;
    publish(&broker, "good", 1, 2).await;
    assert_eq!(env.llen(&sub("")).await, 1, "in the default group");
    let seen = Seen::acking();
    let running = start(app(env, grouped(), seen.clone())).await;
    wait_until("all handled", WAIT, async || seen.count() == 3).await;
    stop(running).await;
    let mut order = groups(&seen);
    order.sort();
    assert_eq!(order, ["bad", "good", "good"]);
    let raw = env
        .cmd("GET", vec![env.key(&sub("bad")).into()])
        .await
        .expect("get");
    assert_eq!(raw.as_str().as_deref(), Some("x"), "left alone");
    // The ring holding a string: the publish is refused and writes nothing.
    env.cmd(
        "SET",
        vec![env.key(&format!("{JOBS}.groups")).into(), "x".into()],
    )
    .await
    .expect("set");
    let refused = broker
        .publisher()
        .message(&Job {
            group: "good".into(),
            n: 3,
        })
        .to(JOBS)
        .group("good")
        .publish()
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(env.llen(&sub("good")).await, 0);
    assert_eq!(env.llen(JOBS).await, 0);
}

async fn groups_and_priorities_are_refused_with_a_fix(env: &Env) {
    let source = RedisList::new(JOBS).reliable().groups().priorities(2);
    let e = env.refusal(app(env, source, Seen::acking())).await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("groups", Some(JOBS))
    );
    assert!(e.problem.contains("do not combine"), "{e}");
}

async fn a_group_cap_it_cannot_hold_is_refused(env: &Env) {
    let zero = RedisList::new(JOBS).reliable().group_max_in_flight(0);
    let e = env.refusal(app(env, zero, Seen::acking())).await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("group_max_in_flight", Some(JOBS))
    );
    assert!(e.problem.contains("at least 1"), "{e}");
    let simple = RedisList::new(JOBS).group_max_in_flight(2);
    let e = env.refusal(app(env, simple, Seen::acking())).await;
    assert_eq!(e.option, "group_max_in_flight", "{e}");
    assert_eq!(e.fix, "add `.reliable()`", "{e}");
    let split = RedisList::new("jobs")
        .reliable()
        .partitions(2)
        .group_max_in_flight(2);
    let e = env.refusal(app(env, split, Seen::acking())).await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("group_max_in_flight", Some("jobs"))
    );
    assert!(e.problem.contains("cannot span partitions"), "{e}");
}

async fn a_queued_message_of_a_group_is_cancelled(env: &Env) {
    let broker = producer(env).await;
    let publisher = broker.publisher();
    for n in 0..3 {
        let job = Job {
            group: "a".into(),
            n,
        };
        publisher
            .message(&job)
            .to(JOBS)
            .group("a")
            .id(format!("job-{n}"))
            .publish()
            .await
            .expect("publish");
    }
    // Queued in its group (the queue's own key is empty): recorded, dropped at its claim.
    let outcome = publisher.cancel(JOBS, "job-1").await.expect("cancel");
    assert_eq!(outcome, ruststream::CancelOutcome::Marked);
    let seen = Seen::acking();
    let running = start(app(env, grouped(), seen.clone())).await;
    wait_until("2 handled", WAIT, async || seen.count() == 2).await;
    wait_until("the group emptied", WAIT, async || {
        !env.exists(&format!("{JOBS}.groups")).await
    })
    .await;
    stop(running).await;
    let ns: Vec<u32> = seen.jobs().iter().map(|(j, _)| j.n).collect();
    assert_eq!(ns, [0, 2]);
}
