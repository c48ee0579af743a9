//! Periodic jobs: several app instances with the same job publish each tick once
//! (ids `<name>@<tick ms>`, consecutive ticks, no gap, no duplicate), the catch-up policy after
//! a gap (stored last tick set into the past), the operator's listing, failures (a destination
//! of the wrong type, a registry key of the wrong type) and bad declarations refused at start;
//! on the model (virtual clock), the standalone server and the cluster, and in `TestApp`.

use crate::harness;

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use harness::{Env, on};
use ruststream::operate::{operators, run_args};
use ruststream::periodic::Tz;
use ruststream::prelude::*;
use ruststream::testing::TestApp;

on!(
    [memory, memory_cluster, standalone, cluster] multi_thread:
    three_instances_publish_every_tick_exactly_once,
    run_once_fires_the_latest_missed_tick_once_across_instances,
    skip_fires_no_missed_tick_and_a_new_job_fires_nothing_for_the_past,
    the_operator_lists_every_registered_job,
    a_failed_publish_is_retried_until_the_destination_takes_it,
    a_registry_of_the_wrong_type_stops_the_app_with_a_fix,
);

on!([memory] bad_declarations_stop_the_app_with_a_fix);
on!([memory, standalone] a_refused_publish_drops_its_tick_and_the_job_goes_on);
on!([standalone] a_tick_whose_reply_was_lost_is_enqueued_once);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Tick {
    /// The tick's time, ms since the epoch, as the job saw it.
    at: u64,
}

outgoing!(Tick);

/// A job `name` on `cron` (UTC) publishing a [`Tick`] with its time to `to`.
fn job(name: &str, cron: &str, to: &str) -> Periodic {
    Periodic::new(name, cron, Tz::UTC)
        .to(to)
        .message_async(|at: SystemTime| async move { Tick { at: ms_of(at) } })
}

fn ms_of(t: SystemTime) -> u64 {
    u64::try_from(
        t.duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("u64")
}

/// An app on a broker of its own (own connections) on the test's server, with `jobs` mounted.
fn instance(env: &Env, jobs: impl FnOnce() -> Vec<Periodic>) -> RustStream {
    let jobs = jobs();
    RustStream::new(AppInfo::new("periodic", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(env.broker_with(|b| b), move |b| {
            for j in jobs {
                b.periodic(j);
            }
        })
}

/// The ticks on the list `key`, oldest first: (id, payload's tick).
async fn ticks(env: &Env, key: &str) -> Vec<(String, u64)> {
    let mut frames = env.frames(key).await;
    frames.reverse();
    frames
        .into_iter()
        .map(|f| {
            let tick: Tick = serde_json::from_slice(&f.payload).expect("a Tick");
            (f.id, tick.at)
        })
        .collect()
}

/// The last-tick hash's full name: in the registry's slot on a cluster.
fn last_key(env: &Env) -> String {
    let registry = env.key("ruststream:periodic");
    if env.is_cluster() {
        format!("{{{registry}}}.last")
    } else {
        format!("{registry}.last")
    }
}

/// The server's (or model's) clock, ms since the epoch.
async fn server_ms(env: &Env) -> u64 {
    let t: Vec<u64> = env
        .client
        .custom(fred::cmd!("TIME"), Vec::<Value>::new())
        .await
        .expect("TIME");
    t[0] * 1000 + t[1] / 1000
}

async fn three_instances_publish_every_tick_exactly_once(env: &Env) {
    let mut apps = Vec::new();
    for _ in 0..3 {
        let app = instance(env, || vec![job("beat", "*/1 * * * * *", "beats")]);
        apps.push(env.start(app).await);
    }
    // At least four ticks land while all three run.
    env.eventually("four ticks are published", async || {
        env.llen("beats").await >= 4
    })
    .await;
    env.advance(Duration::from_millis(1500)).await;
    for app in apps {
        env.stop(app).await;
    }
    let seen = ticks(env, "beats").await;
    assert!(seen.len() >= 4, "{seen:?}");
    for (id, at) in &seen {
        assert_eq!(id, &format!("beat@{at}"), "the id is the tick's time");
        assert_eq!(at % 1000, 0, "ticks are on whole seconds: {at}");
    }
    let mut times: Vec<u64> = seen.iter().map(|(_, at)| *at).collect();
    times.sort_unstable();
    times.dedup();
    assert_eq!(times.len(), seen.len(), "no tick twice: {seen:?}");
    for pair in times.windows(2) {
        assert_eq!(pair[1] - pair[0], 1000, "no gap between ticks: {times:?}");
    }
    let last: Option<u64> = env
        .client
        .hget(last_key(env), "beat")
        .await
        .expect("HGET last");
    assert_eq!(last, times.last().copied(), "the last tick is recorded");
}

async fn run_once_fires_the_latest_missed_tick_once_across_instances(env: &Env) {
    let now = server_ms(env).await;
    let hour = 3_600_000;
    // The job last fired three hours ago; its latest missed tick is this hour's start.
    let _: i64 = env
        .client
        .hset(last_key(env), ("hourly", now - 3 * hour))
        .await
        .expect("HSET last");
    // Three instances start together: each reads the same last tick and fires the missed one.
    let app = || {
        instance(env, || {
            vec![job("hourly", "0 0 * * * *", "reports").catch_up(CatchUp::RunOnce)]
        })
    };
    let (a, b, c) = tokio::join!(env.start(app()), env.start(app()), env.start(app()));
    let apps = [a, b, c];
    let latest = now - now % hour;
    env.eventually("the missed tick is recorded", async || {
        let last: Option<u64> = env
            .client
            .hget(last_key(env), "hourly")
            .await
            .expect("HGET");
        last == Some(latest)
    })
    .await;
    env.advance(Duration::from_millis(500)).await;
    for app in apps {
        env.stop(app).await;
    }
    assert_eq!(
        ticks(env, "reports").await,
        vec![(format!("hourly@{latest}"), latest)],
        "one message for the latest missed tick, whatever the number of instances"
    );
}

async fn skip_fires_no_missed_tick_and_a_new_job_fires_nothing_for_the_past(env: &Env) {
    let now = server_ms(env).await;
    let hour = 3_600_000;
    let before = now - 3 * hour;
    let _: i64 = env
        .client
        .hset(last_key(env), ("hourly", before))
        .await
        .expect("HSET last");
    let mut apps = Vec::new();
    for _ in 0..2 {
        let app = instance(env, || {
            vec![
                job("hourly", "0 0 * * * *", "skipped"),
                // Never fired: run-once has nothing to catch up.
                job("fresh", "0 0 * * * *", "fresh").catch_up(CatchUp::RunOnce),
            ]
        });
        apps.push(env.start(app).await);
    }
    let registry = env.key("ruststream:periodic");
    env.eventually("both jobs are registered", async || {
        env.client.hlen::<i64, _>(&registry).await.expect("HLEN") == 2
    })
    .await;
    env.advance(Duration::from_secs(1)).await;
    for app in apps {
        env.stop(app).await;
    }
    assert_eq!(env.llen("skipped").await, 0, "skip fires no missed tick");
    assert_eq!(
        env.llen("fresh").await,
        0,
        "a new job fires nothing for the past"
    );
    let last: Option<u64> = env
        .client
        .hget(last_key(env), "hourly")
        .await
        .expect("HGET");
    assert_eq!(last, Some(before), "nothing fired, nothing recorded");
    let fresh: Option<u64> = env.client.hget(last_key(env), "fresh").await.expect("HGET");
    assert_eq!(fresh, None);
}

async fn the_operator_lists_every_registered_job(env: &Env) {
    let mount = || {
        vec![
            job("beat", "*/1 * * * * *", "beats"),
            job("nightly", "0 0 2 * * *", "reports").catch_up(CatchUp::RunOnce),
        ]
    };
    let running = env.start(instance(env, mount)).await;
    let app = instance(env, mount);
    let op = &operators(&app)[0];
    op.connect().await.expect("connect");
    env.eventually("the every-second job has fired", async || {
        op.periodic()
            .await
            .expect("list")
            .iter()
            .any(|j| j.name == "beat" && j.last_ms.is_some())
    })
    .await;
    let jobs = op.periodic().await.expect("list");
    let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["beat", "nightly"]);
    let beat = &jobs[0];
    assert_eq!(beat.cron, "*/1 * * * * *");
    assert_eq!(beat.tz, "UTC");
    assert_eq!(beat.destination.as_deref(), Some("beats"));
    assert_eq!(beat.catch_up, CatchUp::Skip);
    let next = beat.next_in_ms.expect("a next tick");
    assert!(
        (0..=1000).contains(&next),
        "next due within a second: {next}"
    );
    let nightly = &jobs[1];
    assert_eq!(nightly.catch_up, CatchUp::RunOnce);
    assert_eq!(nightly.last_ms, None, "never fired");
    let next = nightly.next_ms.expect("a next tick");
    assert_eq!(next % 86_400_000, 2 * 3_600_000, "at 02:00 UTC");
    assert_eq!(
        run_args(instance(env, mount), ["periodic"]).await,
        ExitCode::SUCCESS
    );
    assert_eq!(
        run_args(instance(env, mount), ["periodic", "--json"]).await,
        ExitCode::SUCCESS
    );
    env.stop(running).await;
}

async fn a_failed_publish_is_retried_until_the_destination_takes_it(env: &Env) {
    // Strings where the jobs' lists should be: every LPUSH fails with WRONGTYPE.
    for key in ["skipping", "catching"] {
        let () = env
            .client
            .set(env.key(key), "not a list", None, None, false)
            .await
            .expect("SET");
    }
    let running = env
        .start(instance(env, || {
            vec![
                job("skipping", "*/1 * * * * *", "skipping"),
                job("catching", "*/1 * * * * *", "catching").catch_up(CatchUp::RunOnce),
            ]
        }))
        .await;
    env.advance(Duration::from_millis(2500)).await;
    for name in ["skipping", "catching"] {
        let last: Option<u64> = env.client.hget(last_key(env), name).await.expect("HGET");
        assert_eq!(last, None, "{name}: no tick was published, none recorded");
    }
    let freed = server_ms(env).await;
    for key in ["skipping", "catching"] {
        let _: i64 = env.client.del(env.key(key)).await.expect("DEL");
    }
    env.eventually("both jobs publish once their keys are free", async || {
        env.llen("skipping").await >= 2 && env.llen("catching").await >= 2
    })
    .await;
    env.stop(running).await;
    for key in ["skipping", "catching"] {
        let seen = ticks(env, key).await;
        let times: Vec<u64> = seen.iter().map(|(_, at)| *at).collect();
        // No backlog of the ticks that failed: the first tick published is at most a period
        // older than the moment the key was freed (the retry's latest due tick, or a later one).
        assert!(
            times[0] + 1200 > freed,
            "{key}: the failed ticks are not replayed: {times:?}, freed at {freed}"
        );
        for pair in times.windows(2) {
            assert_eq!(
                pair[1] - pair[0],
                1000,
                "{key}: then every tick once: {times:?}"
            );
        }
    }
}

async fn a_registry_of_the_wrong_type_stops_the_app_with_a_fix(env: &Env) {
    let () = env
        .client
        .set(env.key("ruststream:periodic"), "x", None, None, false)
        .await
        .expect("SET");
    let err = env
        .try_start(instance(env, || {
            vec![job("beat", "*/1 * * * * *", "beats")]
        }))
        .await
        .expect_err("the app is refused");
    let text = err.to_string();
    assert_eq!(err.kind(), ruststream::ErrorKind::WrongType, "{text}");
    assert!(text.contains("rename or delete that key"), "{text}");
    assert_eq!(env.llen("beats").await, 0);
}

async fn a_refused_publish_drops_its_tick_and_the_job_goes_on(env: &Env) {
    let logs = harness::logs::captured();
    // A Pub/Sub channel cannot take unique publishes: every tick is refused, none retried.
    let broker = env.broker_with(|b| b.route("chan", pubsub::Publish::new()));
    let app = RustStream::new(AppInfo::new("periodic", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(broker, |b| {
            b.periodic(job("shout", "*/1 * * * * *", "chan"))
                .periodic(job("beat", "*/1 * * * * *", "beats"));
        });
    let running = env.start(app).await;
    env.eventually("the other job publishes two ticks", async || {
        env.llen("beats").await >= 2
    })
    .await;
    env.stop(running).await;
    let shout: Option<u64> = env.client.hget(last_key(env), "shout").await.expect("HGET");
    assert_eq!(shout, None, "no refused tick is recorded");
    let text = String::from_utf8_lossy(&logs.lock().expect("logs")).into_owned();
    let refused = text
        .lines()
        .filter(|l| l.contains("periodic publish refused") && l.contains("shout"))
        .count();
    assert!(
        refused >= 2,
        "each tick is refused once and dropped: {refused}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.contains("trying again") && l.contains("shout")),
        "a refusal is not retried"
    );
}

async fn a_tick_whose_reply_was_lost_is_enqueued_once(env: &Env) {
    let proxy = harness::proxy::Proxy::start(env.url().expect("standalone")).await;
    let through_proxy = RedisBroker::standalone(proxy.url()).prefix(env.prefix.clone());
    let app = RustStream::new(AppInfo::new("periodic-cut", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(through_proxy, |b| {
            b.periodic(job("beat", "*/1 * * * * *", "beats"));
        });
    // The first tick's publish runs, its reply is lost, and it is sent again (by fred, or by
    // the job's retry): the tick's id makes the second one a duplicate.
    let needle = b"beat@";
    proxy.cut_after(needle);
    let running = env.start(app).await;
    env.eventually("three ticks are published", async || {
        env.llen("beats").await >= 3
    })
    .await;
    env.stop(running).await;
    assert_eq!(proxy.cuts(), 1, "the reply was cut");
    assert!(proxy.sent_count(needle) >= 2, "the publish was sent again");
    let times: Vec<u64> = ticks(env, "beats")
        .await
        .iter()
        .map(|(_, at)| *at)
        .collect();
    for pair in times.windows(2) {
        assert_eq!(pair[1] - pair[0], 1000, "every tick once: {times:?}");
    }
}

async fn bad_declarations_stop_the_app_with_a_fix(env: &Env) {
    let refused = async |p: Periodic| -> ruststream::ConfigError {
        env.refusal(instance(env, move || vec![p])).await
    };
    let e = refused(job("x", "*/5 * * * *", "k")).await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("cron", Some("x"))
    );
    assert!(e.fix.contains("seconds first"), "{e}");
    let e = refused(job("x", "*/5 * * * * *", "k").tz_named("Mars/Olympus")).await;
    assert_eq!((e.option.as_ref(), e.subject.as_deref()), ("tz", Some("x")));
    assert!(e.fix.contains("Europe/Paris"), "{e}");
    let publisher = env.broker().publisher();
    let e = refused(
        publisher
            .every("*/5 * * * * *")
            .name("x")
            .message(|| Tick { at: 0 }),
    )
    .await;
    assert_eq!((e.option.as_ref(), e.subject.as_deref()), ("tz", Some("x")));
    assert_eq!(e.problem, "no time zone", "{e}");
    let e = refused(
        publisher
            .every("*/5 * * * * *")
            .tz(Tz::UTC)
            .message(|| Tick { at: 0 }),
    )
    .await;
    assert_eq!((e.option.as_ref(), e.subject.as_deref()), ("name", None));
    assert!(e.fix.contains(".name("), "{e}");
    let e = refused(Periodic::new("x", "*/5 * * * * *", Tz::UTC)).await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("message", Some("x"))
    );
    assert!(e.fix.contains(".message("), "{e}");
    let app = RustStream::new(AppInfo::new("periodic", "0.0.0")).with_broker(env.broker(), |b| {
        b.periodic(job("twice", "* * * * * *", "a"))
            .periodic(job("twice", "* * * * * *", "b"));
    });
    let e = env.refusal(app).await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("name", Some("twice"))
    );
    assert!(e.fix.contains("own name"), "{e}");
}

// -- TestApp, on the virtual clock ------------------------------------------------------------

/// Every five minutes, UTC.
#[ruststream::periodic("0 */5 * * * *", tz = "UTC", to = "reports")]
fn report() -> Tick {
    Tick { at: 5 }
}

/// Every hour, Paris time, async, catching up once.
#[ruststream::periodic(
    "0 0 * * * *",
    tz = "Europe/Paris",
    to = "hourly",
    name = "paris-hourly",
    catch_up = "run-once"
)]
async fn hourly() -> Tick {
    Tick { at: 60 }
}

fn macro_app() -> RustStream {
    RustStream::new(AppInfo::new("reports", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379").prefix("t:"),
        |b| {
            b.periodic(report).periodic(hourly);
        },
    )
}

#[tokio::test(start_paused = true)]
async fn testapp_counts_ticks_exactly_on_the_virtual_clock() {
    let t = TestApp::start(macro_app()).await.expect("start");
    t.advance(Duration::from_secs(10 * 60))
        .await
        .expect("advance");
    let reports = t.broker::<RedisBroker>().published::<Tick>("reports");
    assert_eq!(
        reports.values(),
        vec![Tick { at: 5 }; 2],
        "two ticks in ten minutes"
    );
    let start = ms_of(t.now()) - 10 * 60 * 1000;
    for m in reports.messages() {
        let (name, at) = m.id.split_once('@').expect("name@tick");
        assert_eq!(name, "report");
        let at: u64 = at.parse().expect("ms");
        assert_eq!(at % 300_000, 0, "on a five-minute boundary");
        assert!(at > start, "a tick after the start");
    }
    t.advance(Duration::from_secs(60 * 60))
        .await
        .expect("advance");
    assert_eq!(
        t.broker::<RedisBroker>()
            .published::<Tick>("reports")
            .values()
            .len(),
        14
    );
    // Paris is a whole number of hours off UTC: its hours start with UTC's.
    let hour = 3_600_000;
    let end = start + 70 * 60 * 1000;
    let hours = usize::try_from(end / hour - start / hour).expect("small");
    let paris = t.broker::<RedisBroker>().published::<Tick>("hourly");
    assert_eq!(
        paris.values(),
        vec![Tick { at: 60 }; hours],
        "every hour start once"
    );
    assert!(
        paris
            .messages()
            .iter()
            .all(|m| m.id.starts_with("paris-hourly@"))
    );
    t.shutdown().await.expect("shutdown");
}

#[test]
fn the_asyncapi_document_shows_each_job_as_a_send_operation() {
    let doc = ruststream::asyncapi::document(&macro_app());
    let op = &doc["operations"]["send_periodic_report"];
    assert_eq!(op["action"], "send", "{doc:#}");
    assert_eq!(op["channel"]["$ref"], "#/channels/reports");
    assert!(
        op["description"]
            .as_str()
            .expect("a description")
            .contains("`0 */5 * * * *` (UTC)"),
        "{op}"
    );
    assert_eq!(doc["channels"]["reports"]["address"], "reports");
    assert_eq!(
        doc["operations"]["send_periodic_paris-hourly"]["action"], "send",
        "{doc:#}"
    );
}
