//! The metrics RustStream records, read back through the Prometheus recorder
//! `run --metrics-addr` installs, while an app handles messages on a real Redis; and the
//! metrics server's routes (`/metrics`, `/healthz`, `/readyz`, 404), over HTTP. The recorder is
//! process-global: the tests share one ([`prometheus`]) and use subscriptions of their own.

use crate::harness;

use std::future::{Future, ready};
use std::time::Duration;

use harness::http;
use harness::metrics::{prometheus, sample};
use harness::proxy::Proxy;
use harness::{Env, on, start, stop, wait_until};
use ruststream::http::metrics::MetricsServer;
use ruststream::prelude::*;

// Standalone only: the labels name the subscription, not its prefixed key, so two topologies in
// one process would count into the same series (and the proxy is for one server).
on!([standalone] handled_dead_lettered_and_lateness_are_recorded, the_metrics_server_serves_metrics_health_and_readiness, steps_and_sleeps_are_counted, sleeping_and_parked_messages_are_gauged);

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
struct Job {
    n: u32,
}
outgoing!(Job);

/// Acks even numbers, drops odd ones.
struct EvenOnly;

impl Handle<Job> for EvenOnly {
    fn handle(
        &self,
        job: &Job,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        ready(if job.n.is_multiple_of(2) {
            Ok(())
        } else {
            Err(HandlerOutcome::drop())
        })
    }
}

async fn handled_dead_lettered_and_lateness_are_recorded(env: &Env) {
    let prometheus = prometheus();
    let _logs = harness::logs::captured();
    let app = RustStream::new(AppInfo::new("metrics", "0")).with_broker(env.broker(), |b| {
        b.include(subscriber(RedisList::new("{recorded}").reliable(), EvenOnly).build());
    });
    let running = start(app).await;
    let publisher = env.broker().publisher();
    let jobs: Vec<Job> = (0..6).map(|n| Job { n }).collect();
    publisher
        .messages(&jobs)
        .to("{recorded}")
        .publish()
        .await
        .unwrap();
    publisher
        .message(&Job { n: 10 })
        .to("{recorded}")
        .delay(Duration::from_millis(100))
        .publish()
        .await
        .unwrap();
    let sub = "subscription=\"{recorded}\"";
    wait_until("every job settled", Duration::from_secs(10), async || {
        let text = prometheus.render();
        sample(&text, "ruststream_handled_total", &[sub, "outcome=\"ack\""]) == Some(4.0)
            && sample(
                &text,
                "ruststream_handled_total",
                &[sub, "outcome=\"dead\""],
            ) == Some(3.0)
    })
    .await;
    stop(running).await;
    // Each dead letter's log line names its dead-letter list and the reason.
    let logs = harness::logs::text();
    let dead_key = format!("dead_letter={}{{recorded}}.dead", env.prefix);
    let dead_lines = logs
        .lines()
        .filter(|l| l.contains("message dead-lettered") && l.contains(&dead_key))
        .filter(|l| l.contains("reason=dropped"))
        .count();
    assert_eq!(dead_lines, 3, "{logs}");
    let text = prometheus.render();
    assert_eq!(
        sample(
            &text,
            "ruststream_dead_lettered_total",
            &[sub, "reason=\"dropped\""]
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "ruststream_handler_duration_seconds_count", &[sub]),
        Some(7.0),
        "{text}"
    );
    let queue = format!("queue=\"{}{{recorded}}\"", env.prefix);
    assert_eq!(
        sample(
            &text,
            "ruststream_delivery_lateness_seconds_count",
            &[&queue]
        ),
        Some(1.0),
        "{text}"
    );
    // Histograms, not summaries: cumulative buckets up to +Inf.
    assert_eq!(
        sample(
            &text,
            "ruststream_handler_duration_seconds_bucket",
            &[sub, "le=\"+Inf\""]
        ),
        Some(7.0),
        "{text}"
    );
    assert!(
        text.contains("ruststream_delivery_lateness_seconds_bucket{"),
        "{text}"
    );
    assert!(!text.contains("quantile=\""), "no summaries: {text}");
    assert_eq!(
        sample(&text, "ruststream_in_flight", &[sub]),
        Some(0.0),
        "{text}"
    );
}

/// Two steps, the second failing at the first run, then a short durable sleep.
struct TwoSteps;

impl Handle<Job> for TwoSteps {
    async fn handle(&self, _: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let first = ctx.attempt() == 1;
        ctx.step("charge", || async { Ok::<_, String>(1) }).await?;
        ctx.step("reserve", || async {
            if first {
                Err("the stock service is down".to_owned())
            } else {
                Ok(2)
            }
        })
        .await?;
        ctx.sleep(Duration::from_millis(50)).await?;
        Ok(())
    }
}

/// A step run, replayed and failed, and a sleep, each counted under the queue's name.
async fn steps_and_sleeps_are_counted(env: &Env) {
    let prometheus = prometheus();
    let list = RedisList::new("{msteps}")
        .reliable()
        .retry(Backoff::fixed(Duration::from_millis(20)));
    let app = RustStream::new(AppInfo::new("metrics", "0")).with_broker(env.broker(), |b| {
        b.include(subscriber(list, TwoSteps).build());
    });
    let running = start(app).await;
    env.broker()
        .publisher()
        .message(&Job { n: 1 })
        .to("{msteps}")
        .publish()
        .await
        .unwrap();
    let sub = "subscription=\"{msteps}\"";
    wait_until("the job acked", Duration::from_secs(10), async || {
        sample(
            &prometheus.render(),
            "ruststream_handled_total",
            &[sub, "outcome=\"ack\""],
        ) == Some(1.0)
    })
    .await;
    stop(running).await;
    let text = prometheus.render();
    let queue = "queue=\"{msteps}\"".to_owned();
    let steps = |outcome: &str| {
        sample(
            &text,
            "ruststream_steps_total",
            &[&queue, &format!("outcome=\"{outcome}\"")],
        )
    };
    // Run 1: charge run, reserve failed. Run 2: charge replayed, reserve run, the sleep begun.
    // Run 3: charge and reserve replayed, the sleep over.
    assert_eq!(steps("run"), Some(2.0), "{text}");
    assert_eq!(steps("replayed"), Some(3.0), "{text}");
    assert_eq!(steps("failed"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, "ruststream_sleeps_total", &[&queue]),
        Some(1.0),
        "{text}"
    );
}

async fn the_metrics_server_serves_metrics_health_and_readiness(env: &Env) {
    let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), prometheus().clone())
        .await
        .expect("the metrics server starts on a free port");
    let base = format!("http://{}", server.local_addr());
    // Before the app runs: alive, not ready.
    assert_eq!(http::get(&format!("{base}/healthz")).await.0, 200);
    assert_eq!(http::get(&format!("{base}/readyz")).await.0, 503);

    // The app reads through a proxy, so that its Redis can go away.
    let proxy = Proxy::start(env.url().expect("the standalone server")).await;
    let broker = RedisBroker::standalone(proxy.url()).prefix(&env.prefix);
    let app = RustStream::new(AppInfo::new("metrics", "0")).with_broker(broker, |b| {
        b.include(subscriber(RedisList::new("{served}").reliable(), EvenOnly).build());
    });
    let running = start(app).await;
    server.watch(running.health());
    let (status, body) = http::get(&format!("{base}/readyz")).await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));

    let publisher = env.broker().publisher();
    let jobs = [Job { n: 2 }, Job { n: 3 }];
    publisher
        .messages(&jobs)
        .to("{served}")
        .publish()
        .await
        .unwrap();
    let sub = "subscription=\"{served}\"";
    let mut text = String::new();
    wait_until(
        "both jobs show on /metrics",
        Duration::from_secs(10),
        async || {
            text = http::get(&format!("{base}/metrics")).await.1;
            sample(
                &text,
                "ruststream_handled_total",
                &[sub, "outcome=\"dead\""],
            ) == Some(1.0)
                && sample(&text, "ruststream_handled_total", &[sub, "outcome=\"ack\""]) == Some(1.0)
        },
    )
    .await;
    assert!(
        text.lines().any(
            |l| l.starts_with("ruststream_handler_duration_seconds_bucket{") && l.contains(sub)
        ),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ruststream_dead_lettered_total",
            &[sub, "reason=\"dropped\""]
        ),
        Some(1.0),
        "{text}"
    );
    let (status, body) = http::get(&format!("{base}/no/such/path")).await;
    assert_eq!(status, 404, "{body}");

    // Redis goes away (the proxy stops listening): the subscription cannot read.
    drop(proxy);
    wait_until(
        "/readyz says 503 naming the subscription",
        Duration::from_secs(10),
        async || {
            let (status, text) = http::get(&format!("{base}/readyz")).await;
            status == 503 && text.contains("subscription `{served}`")
        },
    )
    .await;
    assert_eq!(http::get(&format!("{base}/healthz")).await.0, 200);
    // Its Redis is gone for good: the app is dropped (its tasks end), not shut down.
    drop(running);
    server.stop().await;
}

/// Order 1 sleeps 12 s; order 2 waits for the signal `go` for at most a minute.
struct SleepOrWait;

impl Handle<Job> for SleepOrWait {
    async fn handle(&self, job: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        if job.n == 1 {
            ctx.sleep(Duration::from_secs(12)).await?;
        } else {
            let _ = ctx
                .wait_for::<String>("go", Duration::from_secs(60))
                .await?;
        }
        Ok(())
    }
}

/// A message in a durable sleep and one parked for a signal are gauged 1 and 1 (sampled from
/// Redis every 5 s), then 0 and 0 once the sleep is over and the signal came.
async fn sleeping_and_parked_messages_are_gauged(env: &Env) {
    let prometheus = prometheus();
    let list = RedisList::new("{mgauges}").reliable();
    let app = RustStream::new(AppInfo::new("metrics", "0")).with_broker(env.broker(), |b| {
        b.include(subscriber(list, SleepOrWait).build());
    });
    let running = start(app).await;
    let publisher = env.broker().publisher();
    for (n, id) in [(1, "sleeper"), (2, "parker")] {
        publisher
            .message(&Job { n })
            .to("{mgauges}")
            .id(id)
            .publish()
            .await
            .unwrap();
    }
    let queue = "{mgauges}\"";
    let gauged = |text: &str| {
        (
            sample(text, "ruststream_queue_sleeping", &[queue]),
            sample(text, "ruststream_queue_parked", &[queue]),
        )
    };
    wait_until(
        "one sleeping, one parked",
        Duration::from_secs(11),
        async || gauged(&prometheus.render()) == (Some(1.0), Some(1.0)),
    )
    .await;
    let sent = publisher
        .signal("{mgauges}", "parker", "go", &"now".to_owned())
        .await
        .unwrap();
    assert_eq!(sent, ruststream::steps::Signalled::Woken);
    wait_until(
        "none sleeping, none parked",
        Duration::from_secs(25),
        async || gauged(&prometheus.render()) == (Some(0.0), Some(0.0)),
    )
    .await;
    let handled = sample(
        &prometheus.render(),
        "ruststream_handled_total",
        &["subscription=\"{mgauges}\"", "outcome=\"ack\""],
    );
    assert_eq!(handled, Some(2.0), "both woke and finished");
    stop(running).await;
}

/// `docs/grafana-dashboard.json` is valid JSON, every panel has a query, every query names a
/// metric RustStream records, and every quantile comes from summed histogram buckets.
#[test]
fn the_grafana_dashboard_is_valid_and_uses_recorded_metrics() {
    const RECORDED: &[&str] = &[
        "ruststream_handled_total",
        "ruststream_handler_duration_seconds_bucket",
        "ruststream_in_flight",
        "ruststream_queue_ready",
        "ruststream_queue_in_flight",
        "ruststream_queue_delayed",
        "ruststream_queue_dead",
        "ruststream_queue_sleeping",
        "ruststream_queue_parked",
        "ruststream_dead_lettered_total",
        "ruststream_recovered_total",
        "ruststream_delivery_lateness_seconds_bucket",
        "ruststream_pubsub_disconnects_total",
    ];
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/grafana-dashboard.json"
    );
    let text = std::fs::read_to_string(path).expect("docs/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 7, "{} panels", panels.len());
    let mut used = std::collections::HashSet::new();
    for panel in panels {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{} has no query", panel["title"]);
        for target in targets {
            let expr = target["expr"].as_str().expect("a PromQL expression");
            let names: Vec<&str> = RECORDED
                .iter()
                .copied()
                .filter(|m| expr.contains(&format!("{m}{{")))
                .collect();
            assert!(!names.is_empty(), "{expr} names no recorded metric");
            used.extend(names);
            if expr.contains("histogram_quantile") {
                assert!(expr.contains("_bucket{") && expr.contains("le)"), "{expr}");
            }
        }
    }
    let unused: Vec<_> = RECORDED.iter().filter(|m| !used.contains(*m)).collect();
    assert!(unused.is_empty(), "not on the dashboard: {unused:?}");
}
