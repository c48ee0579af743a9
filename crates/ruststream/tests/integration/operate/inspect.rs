//! `inspect`: sizes, keys and a group's state, how old the oldest claim is, and message rates read
//! off a metrics endpoint (`--metrics-url`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ruststream::Mount;
use ruststream::prelude::*;

use crate::harness;
use harness::{Env, on};

use super::{Job, Poisonable, job, operator_of};

on!(
    [standalone, cluster]
    inspect_shows_sizes_keys_and_group_state,
    inspect_shows_how_old_the_oldest_claim_is,
);

async fn inspect_shows_sizes_keys_and_group_state(env: &Env) {
    let mount = |b: &mut Mount<RedisBroker>| {
        b.include(subscriber(RedisList::new("{jobs}").reliable(), Poisonable::default()).build());
        b.include(
            subscriber(
                RedisStream::new("{feed}").group("readers"),
                Poisonable::default(),
            )
            .build(),
        );
        b.include(subscriber(RedisChannel::new("news"), Poisonable::default()).build());
    };
    let app = env.app(mount);
    let op = operator_of(&app).await;
    // Nothing runs: what is published waits.
    let publisher = env.broker().publisher();
    for n in 0..3 {
        publisher
            .message(&job(n, false))
            .to("{jobs}")
            .publish()
            .await
            .unwrap();
    }
    publisher
        .message(&job(9, false))
        .to("{jobs}")
        .delay(Duration::from_secs(60))
        .publish()
        .await
        .unwrap();
    env.lpush_raw("{jobs}.dead", "x").await;
    let all = op.inspect(None).await.unwrap();
    let names: Vec<&str> = all.iter().map(|i| i.keys.name.as_str()).collect();
    assert_eq!(names, ["{jobs}", "{feed}", "news"]);
    let jobs = &all[0];
    assert_eq!(jobs.keys.queue, env.key("{jobs}"));
    assert_eq!(jobs.keys.processing, Some(env.key("{jobs}.processing")));
    assert_eq!(jobs.keys.mode, "reliable");
    assert_eq!(
        (
            jobs.ready,
            jobs.in_flight,
            jobs.delayed,
            jobs.dead,
            jobs.paused
        ),
        (Some(3), Some(0), Some(1), Some(1), Some(false))
    );
    assert!(
        jobs.next_due_in_ms
            .is_some_and(|ms| ms > 50_000 && ms <= 60_000)
    );
    assert_eq!(all[1].keys.transport, "stream");
    assert_eq!(all[2].keys.transport, "pubsub");
    assert_eq!(all[2].paused, None);
    let json = serde_json::to_value(&all).unwrap();
    assert_eq!(json[0]["ready"], 3);
    assert_eq!(json[0]["keys"]["dead"], env.key("{jobs}.dead"));

    // A started stream group reports its consumers, lag and pending.
    let running = env.start(env.app(mount)).await;
    publisher
        .message(&job(1, false))
        .to("{feed}")
        .publish()
        .await
        .unwrap();
    env.eventually("the group has read the entry", async || {
        let i = op.inspect(Some("{feed}")).await.unwrap().remove(0);
        i.group
            .is_some_and(|g| g.lag == Some(0) && !g.consumers.is_empty())
    })
    .await;
    env.stop(running).await;
}

/// `inspect --metrics-url`: two scrapes of a metrics endpoint a window apart give the rates. The
/// endpoint here counts up by 5 acks and 2 retries per scrape, as a busy service's would.
#[tokio::test]
async fn inspect_reads_rates_off_a_metrics_endpoint() {
    use std::sync::atomic::AtomicU64;
    let scrapes = Arc::new(AtomicU64::new(0));
    let counter = scrapes.clone();
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                format!(
                    "ruststream_handled_total{{subscription=\"{{jobs}}\",outcome=\"ack\"}} {}\n\
                     ruststream_handled_total{{subscription=\"{{jobs}}\",outcome=\"retry\"}} {}\n",
                    5 * n,
                    2 * n
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let rates = ruststream::operate::rates::sample(&url).await.unwrap();
    let window = ruststream::operate::rates::WINDOW.as_secs_f64();
    assert_eq!(
        rates["{jobs}"],
        ruststream::operate::Rates {
            handled_per_s: 5.0 / window,
            failed_per_s: 2.0 / window
        }
    );
    assert_eq!(scrapes.load(Ordering::SeqCst), 2);
    let err = ruststream::operate::rates::sample("http://127.0.0.1:1/metrics")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot reach"), "{err}");
    server.abort();
}

/// Holds every job until the test opens the gate.
#[derive(Clone)]
struct Held(Arc<tokio::sync::Semaphore>);

impl Handle<Job> for Held {
    fn handle(
        &self,
        _job: &Job,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        let gate = self.0.clone();
        async move {
            let _ = gate.acquire().await;
            Ok(())
        }
    }
}

async fn inspect_shows_how_old_the_oldest_claim_is(env: &Env) {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = Held(gate.clone());
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(subscriber(RedisList::new("{held}").reliable(), held.clone()).build());
    };
    let op = operator_of(&env.app(mount.clone())).await;
    let running = env.start_with(mount).await;
    let published = std::time::Instant::now();
    env.broker()
        .publisher()
        .message(&job(1, false))
        .to("{held}")
        .publish()
        .await
        .unwrap();
    let mut seen = None;
    env.eventually("the claim is in flight", async || {
        let i = op.inspect(Some("{held}")).await.unwrap().remove(0);
        let found = i.in_flight == Some(1) && i.oldest_claim_age_ms.is_some();
        seen = Some(i);
        found
    })
    .await;
    let i = seen.expect("an inspection");
    let age = i.oldest_claim_age_ms.expect("an age");
    let bound = u64::try_from(published.elapsed().as_millis()).unwrap() + 50;
    assert!(
        age <= bound,
        "claimed {age} ms ago, published {bound} ms ago"
    );
    assert!(i.oldest_claim_idle_ms.is_some_and(|idle| idle <= bound));
    gate.add_permits(1);
    env.stop(running).await;
}
