//! The servers RustStream runs on. One older than Redis 7.0 (the stand's Redis 6.2,
//! `RUSTSTREAM_REDIS62_URL`) is refused at startup, in words that name it, its version and the
//! minimum. A script the server will not run (a server of the test's own, with `LTRIM` renamed
//! away as a managed service may do) stops its subscription: the error is logged once and names
//! the script, `/readyz` says why, and the queued message stays where it was.

use crate::harness;

use std::time::{Duration, Instant};

use fred::prelude::*;
use harness::metrics::prometheus;
use harness::stand::{Stand, node_client};
use harness::{Seen, bounded, http, logs, stand_var, unique, wait_until};
use ruststream::http::metrics::MetricsServer;
use ruststream::prelude::*;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Job {
    n: u32,
}
outgoing!(Job);

fn app(broker: RedisBroker, key: &str, seen: &Seen<Job>) -> RustStream {
    let (key, seen) = (key.to_owned(), seen.clone());
    RustStream::new(AppInfo::new("servers", "0")).with_broker(broker, move |b| {
        b.include(subscriber(RedisList::new(key).reliable(), seen).build());
    })
}

#[tokio::test]
async fn an_older_server_is_refused_at_startup_in_words() {
    let Some(url) = stand_var("RUSTSTREAM_REDIS62_URL") else {
        return;
    };
    let started = Instant::now();
    let broker = RedisBroker::standalone(&url).prefix(format!("{}:", unique("old")));
    let e = bounded(
        "the app's start on Redis 6.2",
        Duration::from_secs(5),
        app(broker, "{old}", &Seen::acking()).start(),
    )
    .await
    .expect_err("Redis 6.2 is refused");
    assert_eq!(e.kind(), ruststream::ErrorKind::Unsupported, "{e}");
    let text = e.to_string();
    for part in [
        "runs Redis 6.2.14",
        "needs Redis 7.0 or newer",
        "Valkey 7.2",
        "allow-oom",
        "upgrade the server",
    ] {
        assert!(text.contains(part), "`{part}` missing from: {text}");
    }
    assert!(started.elapsed() < Duration::from_secs(5));

    // `check` (the CLI's subcommand) says the same.
    let e = app(RedisBroker::standalone(&url), "{old}", &Seen::acking())
        .check()
        .await
        .expect_err("`check` refuses Redis 6.2");
    assert_eq!(e.kind(), ruststream::ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("runs Redis 6.2.14"), "{e}");

    // A publisher outside an app (and so the CLI, which connects the same way) is refused too,
    // and nothing was written.
    let broker = RedisBroker::standalone(&url);
    let e = broker.connect().await.expect_err("Redis 6.2 is refused");
    assert_eq!(e.kind(), ruststream::ErrorKind::Unsupported, "{e}");
    let e = broker
        .publisher()
        .message(&Job { n: 1 })
        .to("{old}")
        .publish()
        .await
        .expect_err("nothing is published to Redis 6.2");
    assert_eq!(e.kind(), ruststream::ErrorKind::Unsupported, "{e}");
}

#[tokio::test]
async fn a_script_the_server_refuses_is_reported_once_and_unreadies_the_app() {
    logs::capture();
    let stand = Stand::start(
        "stand_server --rename-command LTRIM ''; export RUSTSTREAM_RENAMED_PORT=$STAND_PORT",
    );
    let addr = format!("127.0.0.1:{}", stand.var("RUSTSTREAM_RENAMED_PORT"));
    let url = format!("redis://{addr}");
    let key = format!("{{{}}}", unique("refused"));
    let metrics = MetricsServer::start("127.0.0.1:0".parse().unwrap(), prometheus().clone())
        .await
        .expect("the metrics server starts on a free port");
    let readyz = format!("http://{}/readyz", metrics.local_addr());

    let broker = RedisBroker::standalone(&url);
    let seen = Seen::acking();
    let running = harness::start(app(broker.clone(), &key, &seen)).await;
    metrics.watch(running.health());
    broker
        .publisher()
        .message(&Job { n: 7 })
        .to(key.as_str())
        .publish()
        .await
        .expect("the publish needs no script");

    let mut said = String::new();
    wait_until(
        "/readyz says the subscription was refused",
        Duration::from_secs(10),
        async || {
            let (status, body) = http::get(&readyz).await;
            said = body;
            status == 503 && said.contains(&format!("subscription `{key}`"))
        },
    )
    .await;
    for part in [
        "the server refused what it needs",
        "the server refused the script CLAIM",
        "Unknown Redis command",
        "needs Redis 7.0 or newer",
    ] {
        assert!(said.contains(part), "`{part}` missing from /readyz: {said}");
    }

    // Reported once, though the claim loop would have run many times over since.
    let refusal = "the server refused this subscription's read";
    wait_until(
        "the refusal is logged",
        Duration::from_secs(10),
        async || !logs::lines_with(&[refusal, &key]).is_empty(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(logs::lines_with(&[refusal, &key]).len(), 1);
    assert!(logs::lines_with(&["receive failed", &key]).is_empty());

    // Nothing was taken: the message waits in its queue, unhandled.
    assert_eq!(seen.count(), 0);
    let raw = node_client(&addr).await;
    let queued: i64 = raw.llen(&key).await.expect("LLEN");
    assert_eq!(queued, 1);

    harness::stop(running).await;
    metrics.stop().await;
    let _ = raw.quit().await;
    drop(stand);
}
