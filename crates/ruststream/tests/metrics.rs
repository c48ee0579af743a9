//! The metrics RustStream records (issue 7), read back through a Prometheus recorder while an
//! app handles messages on a real Redis. One test per binary: the recorder is process-global.

mod harness;

use std::future::{Future, ready};
use std::time::Duration;

use harness::{Env, on, start, stop, wait_until};
use ruststream::prelude::*;

// Standalone only: the labels name the subscription, not its prefixed key, so two topologies in
// one process would count into the same series.
on!([standalone] handled_dead_lettered_and_lateness_are_recorded);

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

/// The value of the sample line that starts with `series` (labels in the exporter's order).
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|lab| l.contains(lab)))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

async fn handled_dead_lettered_and_lateness_are_recorded(env: &Env) {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");
    let app = RustStream::new(AppInfo::new("metrics", "0")).with_broker(env.broker(), |b| {
        b.include(subscriber(RedisList::new("{jobs}").reliable(), EvenOnly).build());
    });
    let running = start(app).await;
    let publisher = env.broker().publisher();
    let jobs: Vec<Job> = (0..6).map(|n| Job { n }).collect();
    publisher
        .messages(&jobs)
        .to("{jobs}")
        .publish()
        .await
        .unwrap();
    publisher
        .message(&Job { n: 10 })
        .to("{jobs}")
        .delay(Duration::from_millis(100))
        .publish()
        .await
        .unwrap();
    let sub = "subscription=\"{jobs}\"";
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
    let text = prometheus.render();
    assert_eq!(
        sample(
            &text,
            "ruststream_dead_lettered_total",
            &["reason=\"dropped\""]
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "ruststream_handler_duration_seconds_count", &[sub]),
        Some(7.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ruststream_delivery_lateness_seconds_count",
            &["queue=\""]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "ruststream_in_flight", &[sub]),
        Some(0.0),
        "{text}"
    );
}
