//! Rate limits: `.rate_limit(n, per)` on lists (simple, reliable) and streams, and
//! `.rate_limit_by(header, n, per)` on lists. Several apps share one limited queue; the limiter
//! lives in Redis, so what they handle together stays within the limit. Each test runs on the
//! model (`memory`, the `TestApp` server, on the virtual clock, which is also Redis's `TIME`
//! there), the standalone server and the cluster.
//!
//! The limit's rule (GCRA, see `ruststream_redis::RateLimit`): in any window of length W, at
//! most `n + n * W / per` messages pass. The tests assert that bound on handler timestamps, with
//! a tolerance of one message for the time between a claim (server clock) and its handler
//! (client clock), and that every message is handled in the end, none failed or dead-lettered.
//! They assert no lower bound on throughput.

use crate::harness;

use std::time::Duration;

use harness::metrics::prometheus;
use harness::proxy::Proxy;
use harness::{Env, WAIT, on, start, stop, wait_until};
use ruststream::prelude::*;
use ruststream::testing::TestApp;
use ruststream::{RunningApp, Source};
use tokio::time::Instant;

on!(
    [memory, standalone, cluster] multi_thread:
    three_apps_on_a_reliable_list_stay_within_the_limit,
    three_apps_on_a_simple_list_stay_within_the_limit,
    two_apps_on_a_stream_stay_within_the_limit,
    a_hot_key_is_held_while_another_key_passes,
    a_wrong_type_at_the_limiter_key_moves_nothing,
);

on!([memory] the_virtual_clock_gives_exact_counts);
on!([standalone] a_claim_whose_reply_is_lost_loses_nothing_and_keeps_the_limit);
// And `TestApp` itself, below: `test_app_counts_per_key_passes_on_the_virtual_clock`.
on!([memory] bad_limits_stop_the_app_with_a_fix);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    key: String,
    n: u32,
}

outgoing!(Job);

/// `ruststream_rate_limited_total` of the queue `key` (full name), 0 when not recorded.
fn held_back(env: &Env, key: &str) -> f64 {
    let label = format!("queue=\"{}\"", env.key(key));
    prometheus()
        .render()
        .lines()
        .filter(|l| l.starts_with("ruststream_rate_limited_total") && l.contains(&label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The harness's recorder (each delivery with the time its handler started), across the apps
/// that share it.
type Seen = harness::Seen<Job>;

impl Seen {
    fn count_of(&self, key: &str) -> usize {
        self.ns_of(key).len()
    }

    /// The numbers of `key`'s handled jobs, in handling order.
    fn ns_of(&self, key: &str) -> Vec<u32> {
        self.seen()
            .iter()
            .filter(|d| d.key == key)
            .map(|d| d.n)
            .collect()
    }
}

/// An app on a broker of its own (own connections) with one subscriber.
fn app(env: &Env, source: impl Source<Broker = RedisBroker>, seen: &Seen) -> RustStream {
    let seen = seen.clone();
    RustStream::new(AppInfo::new("rate", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(env.broker_with(|b| b), move |b| {
            b.include(subscriber(source, seen).build());
        })
}

/// Publishes `count` jobs of `key` to `to`, each with the header `customer: key`.
async fn publish(env: &Env, to: &str, key: &str, from: u32, count: u32) {
    let broker = env.broker();
    broker.connect().await.expect("connect");
    let p = broker.publisher();
    for n in from..from + count {
        let job = Job {
            key: key.to_owned(),
            n,
        };
        p.message(&job)
            .to(to)
            .header("customer", key)
            .publish()
            .await
            .expect("publish");
    }
}

/// Asserts that no window of the handler times holds more than `n + n * W / per` (+1).
fn assert_within(times: &mut [Instant], n: u32, per: Duration) {
    times.sort_unstable();
    let n = f64::from(n);
    for i in 0..times.len() {
        for j in i..times.len() {
            let w = (times[j] - times[i]).as_secs_f64();
            let passed = (j - i + 1) as f64;
            let most = n + n * w / per.as_secs_f64() + 1.0;
            assert!(
                passed <= most,
                "{passed} handled within {w:.3} s, the limit allows {most:.1}"
            );
        }
    }
}

async fn stop_all(apps: Vec<RunningApp>) {
    for a in apps {
        stop(a).await;
    }
}

/// `apps` apps on `source`, a backlog of `total`, and the bound checked once all are handled.
async fn run_limited(
    env: &Env,
    source: impl Source<Broker = RedisBroker> + Clone,
    to: &str,
    apps: usize,
    total: u32,
    n: u32,
    per: Duration,
) {
    prometheus();
    publish(env, to, "a", 0, total).await;
    let seen = Seen::default();
    let mut running = Vec::new();
    for _ in 0..apps {
        running.push(start(app(env, source.clone(), &seen)).await);
    }
    wait_until("every message handled", WAIT * 2, async || {
        seen.count() >= total as usize
    })
    .await;
    stop_all(running).await;
    let jobs = seen.seen();
    let mut ns: Vec<u32> = jobs.iter().map(|d| d.n).collect();
    ns.sort_unstable();
    ns.dedup();
    assert_eq!(ns.len(), total as usize, "each message handled");
    let mut times: Vec<Instant> = jobs.iter().map(|d| d.at).collect();
    assert_within(&mut times, n, per);
    let span = times[times.len() - 1] - times[0];
    // The limit allows `total` no sooner than (total - n) steps after the first.
    let least = per.mul_f64(f64::from(total - n) / f64::from(n));
    assert!(
        span + per / 10 >= least,
        "{total} handled in {span:?}: faster than the limit allows ({least:?})"
    );
    assert_eq!(env.llen(&format!("{to}.dead")).await, 0, "nothing dead");
    assert!(held_back(env, to) >= 1.0, "held-back reads are counted");
}

async fn three_apps_on_a_reliable_list_stay_within_the_limit(env: &Env) {
    let per = Duration::from_secs(1);
    let source = RedisList::new("{rl}")
        .reliable()
        .concurrency(8)
        .rate_limit(10, per);
    run_limited(env, source, "{rl}", 3, 40, 10, per).await;
    assert_eq!(env.llen("{rl}.processing").await, 0);
}

async fn three_apps_on_a_simple_list_stay_within_the_limit(env: &Env) {
    let per = Duration::from_millis(500);
    let source = RedisList::new("{sl}").concurrency(8).rate_limit(5, per);
    run_limited(env, source, "{sl}", 3, 25, 5, per).await;
}

async fn two_apps_on_a_stream_stay_within_the_limit(env: &Env) {
    let per = Duration::from_secs(1);
    let source = RedisStream::new("{st}")
        .group("g")
        .concurrency(8)
        .rate_limit(10, per);
    prometheus();
    let broker = env.broker_with(|b| b.route("{st}", ruststream::stream::Publish::new()));
    broker.connect().await.expect("connect");
    // The group exists before the backlog, so that it reads it all.
    let seen = Seen::default();
    let first = start(app(env, source.clone(), &seen)).await;
    let p = broker.publisher();
    let jobs: Vec<Job> = (0..30).map(|n| Job { key: "a".into(), n }).collect();
    p.messages(&jobs)
        .to("{st}")
        .publish()
        .await
        .expect("publish");
    let second = start(app(env, source, &seen)).await;
    wait_until("every entry handled", WAIT * 2, async || seen.count() >= 30).await;
    stop_all(vec![first, second]).await;
    let all = seen.seen();
    let mut ns: Vec<u32> = all.iter().map(|d| d.n).collect();
    ns.sort_unstable();
    assert_eq!(ns, (0..30).collect::<Vec<_>>(), "each entry once");
    let mut times: Vec<Instant> = all.iter().map(|d| d.at).collect();
    assert_within(&mut times, 10, per);
    assert_eq!(env.pending("{st}", "g").await, 0, "all acknowledged");
    assert!(held_back(env, "{st}") >= 1.0, "held-back reads are counted");
}

async fn a_hot_key_is_held_while_another_key_passes(env: &Env) {
    // 2 per 10 s per customer: the hot customer's backlog is ahead of the cold one's.
    let per = Duration::from_secs(10);
    publish(env, "{hk}", "hot", 0, 8).await;
    publish(env, "{hk}", "cold", 100, 2).await;
    let seen = Seen::default();
    let source = RedisList::new("{hk}")
        .reliable()
        .concurrency(4)
        .rate_limit_by("customer", 2, per);
    let a = start(app(env, source.clone(), &seen)).await;
    let b = start(app(env, source, &seen)).await;
    wait_until("the cold key passes the hot one", WAIT, async || {
        seen.count_of("cold") == 2
    })
    .await;
    let hot = seen.ns_of("hot");
    stop_all(vec![a, b]).await;
    assert!(
        hot.len() <= 3,
        "the hot key passed {hot:?} within its burst"
    );
    assert!(hot.is_sorted(), "in order within the key: {hot:?}");
    // The held entries stay queued, in order, not failed.
    let left: Vec<u32> = env
        .frames("{hk}")
        .await
        .iter()
        .rev()
        .map(|f| serde_json::from_slice::<Job>(&f.payload).expect("a job").n)
        .collect();
    assert_eq!(left.len(), 8 - hot.len(), "held entries stay in the queue");
    assert!(left.is_sorted(), "held in order: {left:?}");
    assert_eq!(env.llen("{hk}.dead").await, 0);
    assert_eq!(env.llen("{hk}.processing").await, 0);
}

async fn a_wrong_type_at_the_limiter_key_moves_nothing(env: &Env) {
    env.lpush_raw("{wt}.rate", "not a limiter").await;
    publish(env, "{wt}", "a", 0, 3).await;
    let seen = Seen::default();
    let source = RedisList::new("{wt}")
        .reliable()
        .rate_limit(100, Duration::from_secs(1));
    let running = start(app(env, source, &seen)).await;
    // The claim fails before its first write: the entries stay where they were.
    env.advance(Duration::from_millis(300)).await;
    assert_eq!(seen.count(), 0);
    assert_eq!(env.llen("{wt}").await, 3);
    assert_eq!(env.llen("{wt}.processing").await, 0);
    // Once the key is gone, the queue drains.
    env.cmd("DEL", vec![env.key("{wt}.rate").into()])
        .await
        .expect("DEL");
    wait_until("drained", WAIT, async || seen.count() == 3).await;
    stop(running).await;
}

async fn a_claim_whose_reply_is_lost_loses_nothing_and_keeps_the_limit(env: &Env) {
    // The first claim runs (takes the burst of 5 and charges for it) but its reply is lost;
    // fred sends it again, and that run charges only for what it takes. The 5 lost entries are
    // swept back after min_idle and pass the limit again.
    let per = Duration::from_secs(1);
    publish(env, "{lost}", "a", 0, 10).await;
    let proxy = Proxy::start(env.url().expect("the standalone server")).await;
    let rate_key = env.key("{lost}.rate");
    proxy.cut_after(rate_key.as_bytes());
    let broker = RedisBroker::standalone(proxy.url()).prefix(&env.prefix);
    let seen = Seen::default();
    let source = RedisList::new("{lost}")
        .reliable()
        .min_idle(Duration::from_millis(500))
        .rate_limit(5, per);
    let handler = seen.clone();
    let app = RustStream::new(AppInfo::new("rate", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(broker, move |b| {
            b.include(subscriber(source, handler).build());
        });
    let running = start(app).await;
    let distinct = || {
        let mut ns: Vec<u32> = seen.seen().iter().map(|d| d.n).collect();
        ns.sort_unstable();
        ns.dedup();
        ns.len()
    };
    wait_until("every message handled", WAIT * 2, async || distinct() == 10).await;
    stop(running).await;
    assert_eq!(proxy.cuts(), 1, "one reply was lost");
    assert!(
        proxy.sent_count(rate_key.as_bytes()) >= 2,
        "the claim was sent again"
    );
    let mut times: Vec<Instant> = seen.seen().iter().map(|d| d.at).collect();
    assert_within(&mut times, 5, per);
    assert_eq!(env.llen("{lost}.dead").await, 0);
    assert_eq!(env.llen("{lost}").await, 0);
}

async fn the_virtual_clock_gives_exact_counts(env: &Env) {
    // 5 a second: a burst of 5, then one every 200 ms.
    publish(env, "{vc}", "a", 0, 20).await;
    let seen = Seen::default();
    let source = RedisList::new("{vc}")
        .reliable()
        .rate_limit(5, Duration::from_secs(1));
    let a = start(app(env, source.clone(), &seen)).await;
    let b = start(app(env, source, &seen)).await;
    wait_until("the burst", WAIT, async || seen.count() == 5).await;
    let t0 = seen.seen()[0].at;
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    tokio::time::sleep_until(at(150)).await;
    assert_eq!(seen.count(), 5, "no more before the first step");
    tokio::time::sleep_until(at(250)).await;
    assert_eq!(seen.count(), 6, "one per step");
    tokio::time::sleep_until(at(1050)).await;
    assert_eq!(seen.count(), 10);
    tokio::time::sleep_until(at(3050)).await;
    assert_eq!(seen.count(), 20, "the rest, one per step");
    stop_all(vec![a, b]).await;
    assert_eq!(env.llen("{vc}").await, 0);
}

async fn bad_limits_stop_the_app_with_a_fix(env: &Env) {
    let second = Duration::from_secs(1);
    let cases: Vec<(RedisList, &str, &str, &str)> = vec![
        (
            RedisList::new("{q}").rate_limit(0, second),
            "rate_limit",
            "{q}",
            "n of at least 1",
        ),
        (
            RedisList::new("{q}")
                .reliable()
                .rate_limit(1, Duration::ZERO),
            "rate_limit",
            "{q}",
            "longer than zero",
        ),
        (
            RedisList::new("q")
                .partitions(2)
                .rate_limit_by("k", 1, second),
            "rate_limit_by",
            "q",
            "cannot span partitions",
        ),
        (
            RedisList::new("{q}").rate_limit_by("", 1, second),
            "rate_limit_by",
            "{q}",
            "header's name is empty",
        ),
    ];
    let seen = Seen::default();
    for (source, option, subject, says) in cases {
        let e = env.refusal(app(env, source, &seen)).await;
        assert_eq!(
            (e.option.as_ref(), e.subject.as_deref()),
            (option, Some(subject))
        );
        assert!(e.problem.contains(says), "{e}");
    }
    let stream = RedisStream::new("{s}")
        .group("g")
        .rate_limit(3, Duration::ZERO);
    let e = env.refusal(app(env, stream, &seen)).await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("rate_limit", Some("{s}"))
    );
    assert!(e.problem.contains("longer than zero"), "{e}");
}

/// `TestApp`: a per-key limit of 2 per 10 s (a burst of 2, then one every 5 s per key), counted
/// exactly as model time advances.
#[tokio::test(start_paused = true)]
async fn test_app_counts_per_key_passes_on_the_virtual_clock() -> ruststream::Result<()> {
    let seen = Seen::default();
    let source =
        RedisList::new("{jobs}")
            .reliable()
            .rate_limit_by("customer", 2, Duration::from_secs(10));
    let handler = seen.clone();
    let app = RustStream::new(AppInfo::new("rate", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379").prefix("t:"),
        move |b| {
            b.include(subscriber(source, handler).build());
        },
    );
    let tb = TestApp::start(app).await?;
    for (key, n) in [("hot", 6), ("cold", 2)] {
        for i in 0..n {
            let job = Job {
                key: key.into(),
                n: i,
            };
            tb.broker::<RedisBroker>()
                .message(&job)
                .to("{jobs}")
                .header("customer", key)
                .publish()
                .await?;
        }
    }
    // A reader held by the hot key reads again within 100 ms, and finds the cold key's entries.
    tb.advance(Duration::from_millis(200)).await?;
    assert_eq!((seen.count_of("hot"), seen.count_of("cold")), (2, 2));
    tb.advance(Duration::from_millis(4700)).await?;
    assert_eq!(seen.count_of("hot"), 2, "the next step is at 5 s");
    tb.advance(Duration::from_millis(200)).await?;
    assert_eq!(seen.count_of("hot"), 3);
    tb.advance(Duration::from_secs(10)).await?;
    assert_eq!(seen.count_of("hot"), 5, "at 10 s and 15 s");
    tb.advance(Duration::from_secs(5)).await?;
    assert_eq!(seen.count_of("hot"), 6);
    let hot = seen.ns_of("hot");
    assert_eq!(hot, (0..6).collect::<Vec<_>>(), "in order within the key");
    tb.shutdown().await
}
