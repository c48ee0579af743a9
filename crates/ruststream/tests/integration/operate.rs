//! The operator's tools (issue 13): `inspect`, dead letters (list, show, requeue, purge), delayed
//! entries (list, promote, cancel) and pause/resume, through `ruststream::operate` (the library
//! the CLI and the dashboard share) and through its command words (`run_args`, what `run_main`
//! runs), on the stand's standalone server and cluster.

use std::future::Future;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ruststream::Mount;
use ruststream::operate::{operators, run_args};
use ruststream::prelude::*;
use ruststream::redis::operate::{Operator, Select};

use crate::harness;
use harness::{Env, on};

on!(
    [standalone, cluster]
    a_poisoned_message_is_found_read_fixed_and_requeued_with_attempt_1,
    requeue_all_on_a_stream_and_purge_on_a_simple_list,
    delayed_entries_are_listed_promoted_and_cancelled,
    a_pause_holds_every_reader_until_resume_and_outlives_a_restart,
    inspect_shows_sizes_keys_and_group_state,
    inspect_shows_how_old_the_oldest_claim_is,
    the_command_words_and_their_exit_codes,
    a_queue_with_partitions_is_seen_and_paused_per_partition_or_whole
);

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Job {
    n: u32,
    poison: bool,
}
outgoing!(Job);

/// What a handler saw of one delivery.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    n: u32,
    attempt: u32,
    history: Option<String>,
}

/// Retries poisoned jobs while `broken`; records every delivery.
#[derive(Clone, Default)]
struct Poisonable {
    seen: Arc<Mutex<Vec<Seen>>>,
    broken: Arc<AtomicBool>,
}

impl Handle<Job> for Poisonable {
    fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        self.seen.lock().unwrap().push(Seen {
            n: job.n,
            attempt: ctx.attempt(),
            history: ctx.header("dead-history").map(str::to_owned),
        });
        let fail = job.poison && self.broken.load(Ordering::SeqCst);
        async move {
            if fail {
                Err(HandlerOutcome::retry())
            } else {
                Ok(())
            }
        }
    }
}

impl Poisonable {
    fn broken() -> Self {
        let p = Self::default();
        p.broken.store(true, Ordering::SeqCst);
        p
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn job(n: u32, poison: bool) -> Job {
    Job { n, poison }
}

/// The operator of `app` (its one broker), connected.
async fn operator_of(app: &RustStream) -> Operator {
    let op = operators(app).pop().expect("the app has a Redis broker");
    op.connect().await.expect("the operator connects");
    op
}

async fn dead_count(op: &Operator, name: &str) -> usize {
    op.dead_letters(name, 1000)
        .await
        .expect("dead letters")
        .len()
}

async fn a_poisoned_message_is_found_read_fixed_and_requeued_with_attempt_1(env: &Env) {
    let handler = Poisonable::broken();
    let source = || {
        RedisList::new("{orders}")
            .reliable()
            .max_attempts(2)
            .retry(Backoff::fixed(Duration::from_millis(10)))
    };
    let mount = |h: Poisonable| {
        move |b: &mut Mount<RedisBroker>| {
            b.include(subscriber(source(), h).build());
        }
    };
    let op = operator_of(&env.app(mount(handler.clone()))).await;
    let running = env.start_with(mount(handler.clone())).await;
    let publisher = env.broker().publisher();
    publisher
        .message(&job(1, true))
        .to("{orders}")
        .publish()
        .await
        .unwrap();
    publisher
        .message(&job(2, false))
        .to("{orders}")
        .publish()
        .await
        .unwrap();
    env.eventually("the poisoned job is dead", async || {
        dead_count(&op, "{orders}").await == 1
    })
    .await;

    // Found and read: decoded, with its reason and its payload as JSON.
    let dead = op.dead_letters("{orders}", 10).await.unwrap();
    let letter = &dead[0];
    assert_eq!(letter.attempt, 2);
    assert_eq!(letter.reason.as_deref(), Some("max-attempts"));
    assert_eq!(letter.payload, serde_json::json!({"n": 1, "poison": true}));
    assert!(!letter.headers.contains_key("reason"), "{letter:?}");
    let shown = op.dead_letter("{orders}", &letter.id).await.unwrap();
    assert_eq!(shown.map(|d| d.id), Some(letter.id.clone()));
    assert!(
        op.dead_letter("{orders}", "no-such-id")
            .await
            .unwrap()
            .is_none()
    );

    // Fixed, then requeued: the handler sees it again with attempt 1 and the history.
    handler.broken.store(false, Ordering::SeqCst);
    let moved = op
        .requeue("{orders}", &Select::Id(letter.id.clone()))
        .await
        .unwrap();
    assert_eq!(moved, 1);
    env.eventually("the requeued job is handled", async || {
        handler
            .seen()
            .iter()
            .any(|s| s.n == 1 && s.history.is_some())
    })
    .await;
    let again: Vec<Seen> = handler
        .seen()
        .into_iter()
        .filter(|s| s.history.is_some())
        .collect();
    assert_eq!(
        again,
        vec![Seen {
            n: 1,
            attempt: 1,
            history: Some("max-attempts".into())
        }]
    );
    assert_eq!(dead_count(&op, "{orders}").await, 0);
    assert_eq!(
        op.requeue("{orders}", &Select::Id(letter.id.clone()))
            .await
            .unwrap(),
        0,
        "an id requeued already matches nothing"
    );
    env.stop(running).await;
}

async fn requeue_all_on_a_stream_and_purge_on_a_simple_list(env: &Env) {
    let handler = Poisonable::broken();
    let h = handler.clone();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(
            subscriber(
                RedisStream::new("{events}").group("g").max_attempts(1),
                h.clone(),
            )
            .build(),
        );
        b.include(subscriber(RedisList::new("{cache}"), Poisonable::default()).build());
    };
    let op = operator_of(&env.app(mount.clone())).await;
    let running = env.start_with(mount).await;
    let publisher = env.broker().publisher();
    for n in 0..5 {
        publisher
            .message(&job(n, true))
            .to("{events}")
            .publish()
            .await
            .unwrap();
    }
    env.eventually("five stream entries are dead", async || {
        dead_count(&op, "{events}").await == 5
    })
    .await;
    handler.broken.store(false, Ordering::SeqCst);
    let moved = op
        .requeue("{events}", &Select::All { limit: Some(3) })
        .await
        .unwrap();
    assert_eq!(moved, 3);
    assert_eq!(dead_count(&op, "{events}").await, 2);
    assert_eq!(
        op.requeue("{events}", &Select::All { limit: None })
            .await
            .unwrap(),
        2
    );
    env.eventually("every requeued entry is handled once more", async || {
        handler
            .seen()
            .iter()
            .filter(|s| s.history.is_some())
            .count()
            == 5
    })
    .await;
    assert!(
        handler
            .seen()
            .iter()
            .filter(|s| s.history.is_some())
            .all(|s| s.attempt == 1)
    );

    // A simple list's dead letters: an id-less raw value is `#N`; purge by id, then the rest.
    let dead = "{cache}.dead";
    env.lpush_raw(dead, "not a frame").await;
    env.lpush_raw(dead, "second").await;
    env.lpush_raw(dead, "third").await;
    let letters = op.dead_letters("{cache}", 10).await.unwrap();
    let ids: Vec<&str> = letters.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["#1", "#2", "#3"]);
    assert_eq!(letters[0].payload, serde_json::json!("not a frame"));
    assert_eq!(
        op.purge("{cache}", &Select::Id("#2".into())).await.unwrap(),
        1
    );
    let left: Vec<serde_json::Value> = op
        .dead_letters("{cache}", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.payload)
        .collect();
    assert_eq!(
        left,
        [serde_json::json!("not a frame"), serde_json::json!("third")]
    );
    assert_eq!(
        op.purge("{cache}", &Select::All { limit: Some(1) })
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        op.purge("{cache}", &Select::All { limit: None })
            .await
            .unwrap(),
        1
    );
    assert_eq!(env.llen(dead).await, 0);
    env.stop(running).await;
}

async fn delayed_entries_are_listed_promoted_and_cancelled(env: &Env) {
    let handler = Poisonable::default();
    let h = handler.clone();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(subscriber(RedisList::new("{later}").reliable(), h.clone()).build());
    };
    let op = operator_of(&env.app(mount.clone())).await;
    let running = env.start_with(mount).await;
    let publisher = env.broker().publisher();
    for n in 0..3 {
        publisher
            .message(&job(n, false))
            .to("{later}")
            .id(format!("job-{n}"))
            .delay(Duration::from_secs(3600 + u64::from(n)))
            .publish()
            .await
            .unwrap();
    }
    let listed = op.delayed("{later}", 10).await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["job-0", "job-1", "job-2"]);
    assert!(listed[0].due_in_ms > 3_500_000, "{:?}", listed[0]);
    assert_eq!(
        listed[1].payload,
        serde_json::json!({"n": 1, "poison": false})
    );

    assert_eq!(
        op.promote("{later}", &Select::Id("job-1".into()))
            .await
            .unwrap(),
        1
    );
    env.eventually("the promoted job is handled", async || {
        handler.seen().iter().any(|s| s.n == 1)
    })
    .await;
    assert_eq!(
        op.cancel("{later}", &Select::Id("job-0".into()))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        op.cancel("{later}", &Select::Id("job-0".into()))
            .await
            .unwrap(),
        0
    );
    let left: Vec<String> = op
        .delayed("{later}", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(left, ["job-2"]);
    assert_eq!(env.hlen("{later}.delayed.payloads").await, 1);
    assert_eq!(
        op.promote("{later}", &Select::All { limit: None })
            .await
            .unwrap(),
        1
    );
    env.eventually("every promoted job is handled", async || {
        handler.seen().iter().any(|s| s.n == 2)
    })
    .await;
    assert!(
        handler.seen().iter().all(|s| s.n != 0),
        "a cancelled job ran"
    );
    env.stop(running).await;
}

async fn a_pause_holds_every_reader_until_resume_and_outlives_a_restart(env: &Env) {
    let handler = Poisonable::default();
    let h = handler.clone();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(
            subscriber(
                RedisList::new("{paused}")
                    .reliable()
                    .block(Duration::from_millis(200)),
                h.clone(),
            )
            .build(),
        );
    };
    let op = operator_of(&env.app(mount.clone())).await;
    let publisher = env.broker().publisher();

    // Paused before the instances start: they read the pause key when they open.
    op.pause("{paused}", "test").await.unwrap();
    assert_eq!(
        op.inspect(Some("{paused}")).await.unwrap()[0].paused,
        Some(true)
    );
    let first = env.start_with(mount.clone()).await;
    let second = env.start_with(mount.clone()).await;
    publisher
        .message(&job(7, false))
        .to("{paused}")
        .publish()
        .await
        .unwrap();
    // A negative observation needs a window: two reads and a pause poll.
    tokio::time::sleep(ruststream::redis::operate::PAUSE_POLL + Duration::from_millis(400)).await;
    assert!(handler.seen().is_empty(), "a paused subscription claimed");
    assert_eq!(env.llen("{paused}").await, 1);

    // Resumed: both instances read again at once (the PUBLISH wakes their gates).
    op.resume("{paused}").await.unwrap();
    env.eventually("the job is handled after resume", async || {
        handler.seen().len() == 1
    })
    .await;

    // Paused while running: within one read (200 ms) and the gate's wake-up, nothing more is
    // claimed, in either instance.
    op.pause("{paused}", "test").await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    publisher
        .message(&job(8, false))
        .to("{paused}")
        .publish()
        .await
        .unwrap();
    tokio::time::sleep(ruststream::redis::operate::PAUSE_POLL).await;
    assert_eq!(handler.seen().len(), 1, "a paused subscription claimed");

    // The pause is in Redis: a restarted instance stays paused too.
    env.stop(first).await;
    env.stop(second).await;
    let restarted = env.start_with(mount).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        handler.seen().len(),
        1,
        "a restarted paused subscription claimed"
    );
    op.resume("{paused}").await.unwrap();
    env.eventually("the second job is handled after resume", async || {
        handler.seen().len() == 2
    })
    .await;
    env.stop(restarted).await;
}

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

async fn the_command_words_and_their_exit_codes(env: &Env) {
    let mount = |b: &mut Mount<RedisBroker>| {
        b.include(subscriber(RedisList::new("{cli}").reliable(), Poisonable::default()).build());
        b.include(subscriber(RedisChannel::new("ticks"), Poisonable::default()).build());
    };
    let app = || env.app(mount);
    env.lpush_raw("{cli}.dead", "a").await;
    env.lpush_raw("{cli}.dead", "b").await;
    let code = |words: &'static [&'static str]| async move { run_args(app(), words).await };
    assert_eq!(code(&["inspect", "--json"]).await, ExitCode::SUCCESS);
    assert_eq!(
        code(&["dead", "list", "{cli}", "--json"]).await,
        ExitCode::SUCCESS
    );
    assert_eq!(
        code(&["inspect", "nope"]).await,
        ExitCode::from(2),
        "unknown subscription"
    );
    assert_eq!(
        code(&["dead", "frobnicate", "{cli}"]).await,
        ExitCode::from(2),
        "bad usage"
    );
    assert_eq!(
        code(&["dead", "requeue", "{cli}"]).await,
        ExitCode::from(2),
        "no --id/--all"
    );
    assert_eq!(
        code(&["dead", "show", "{cli}", "--id", "missing"]).await,
        ExitCode::from(3),
        "nothing matched"
    );
    assert_eq!(
        code(&["flow", "show", "missing"]).await,
        ExitCode::from(3),
        "no flow on any queue"
    );
    assert_eq!(
        code(&["flow", "show", "missing", "--subscription", "{cli}"]).await,
        ExitCode::from(3),
        "no flow on {{cli}}"
    );
    // Tests have no terminal: a purge without --yes is refused and deletes nothing.
    assert_eq!(
        code(&["dead", "purge", "{cli}", "--all"]).await,
        ExitCode::from(2)
    );
    assert_eq!(env.llen("{cli}.dead").await, 2);
    assert_eq!(
        code(&["dead", "purge", "{cli}", "--id", "#1", "--yes"]).await,
        ExitCode::SUCCESS
    );
    assert_eq!(env.llen("{cli}.dead").await, 1);
    assert_eq!(
        code(&["pause", "ticks"]).await,
        ExitCode::FAILURE,
        "Pub/Sub cannot pause"
    );
    assert_eq!(code(&["pause", "{cli}"]).await, ExitCode::SUCCESS);
    assert!(env.exists("{cli}.paused").await);
    assert_eq!(code(&["resume", "{cli}"]).await, ExitCode::SUCCESS);
    assert!(!env.exists("{cli}.paused").await);
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

/// Through the sentinels: the operator finds the primary the sentinels name, as the app does.
#[tokio::test]
async fn the_operator_works_through_the_sentinels() {
    let (Some(service), Some(hosts)) = (
        harness::stand_var("RUSTSTREAM_SENTINEL_SERVICE"),
        harness::stand_var("RUSTSTREAM_SENTINEL_HOSTS"),
    ) else {
        return;
    };
    let hosts: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    let prefix = format!("{}:", harness::unique("sentinel-operate"));
    let broker = RedisBroker::sentinel(service, hosts).prefix(&prefix);
    let app = RustStream::new(AppInfo::new("sentinel", "0.0.0")).with_broker(broker.clone(), |b| {
        b.include(subscriber(RedisList::new("{s}").reliable(), Poisonable::default()).build());
    });
    let op = operator_of(&app).await;
    broker.connect().await.unwrap();
    broker
        .publisher()
        .message(&job(1, false))
        .to("{s}")
        .delay(Duration::from_secs(600))
        .id("d1")
        .publish()
        .await
        .unwrap();
    let i = op.inspect(Some("{s}")).await.unwrap().remove(0);
    assert_eq!(
        (i.ready, i.delayed, i.paused),
        (Some(0), Some(1), Some(false))
    );
    op.pause("{s}", "test").await.unwrap();
    assert_eq!(op.inspect(Some("{s}")).await.unwrap()[0].paused, Some(true));
    op.resume("{s}").await.unwrap();
    assert_eq!(op.cancel("{s}", &Select::Id("d1".into())).await.unwrap(), 1);
    assert_eq!(op.inspect(Some("{s}")).await.unwrap()[0].delayed, Some(0));
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

/// A queue spread over partitions: `inspect` by its name shows each partition, `dead` works on
/// one partition by its key, `pause`/`resume` by its name act on every partition.
async fn a_queue_with_partitions_is_seen_and_paused_per_partition_or_whole(env: &Env) {
    let mount = |b: &mut Mount<RedisBroker>| {
        let jobs = RedisList::new("jobs").reliable().partitions(3);
        b.include(subscriber(jobs, Poisonable::default()).build());
    };
    let app = || env.app(mount);
    let op = operator_of(&app()).await;
    let names: Vec<&str> = op.subscriptions().iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, ["{jobs:0}", "{jobs:1}", "{jobs:2}"]);
    env.lpush_raw("{jobs:1}", "x").await;
    let seen = op.inspect(Some("jobs")).await.expect("inspect");
    let ready: Vec<(String, Option<u64>)> = seen
        .iter()
        .map(|i| (i.keys.name.clone(), i.ready))
        .collect();
    assert_eq!(
        ready,
        [
            ("{jobs:0}".into(), Some(0)),
            ("{jobs:1}".into(), Some(1)),
            ("{jobs:2}".into(), Some(0))
        ]
    );
    let code = |words: &'static [&'static str]| async move { run_args(app(), words).await };
    assert_eq!(
        code(&["inspect", "jobs", "--json"]).await,
        ExitCode::SUCCESS
    );
    assert_eq!(code(&["dead", "list", "{jobs:2}"]).await, ExitCode::SUCCESS);
    assert_eq!(code(&["pause", "jobs"]).await, ExitCode::SUCCESS);
    for i in 0..3 {
        assert!(
            env.exists(&format!("{{jobs:{i}}}.paused")).await,
            "partition {i}"
        );
    }
    assert_eq!(code(&["resume", "{jobs:1}"]).await, ExitCode::SUCCESS);
    assert!(!env.exists("{jobs:1}.paused").await);
    assert!(env.exists("{jobs:0}.paused").await);
    assert_eq!(code(&["resume", "jobs"]).await, ExitCode::SUCCESS);
    for i in 0..3 {
        assert!(
            !env.exists(&format!("{{jobs:{i}}}.paused")).await,
            "partition {i}"
        );
    }
}
