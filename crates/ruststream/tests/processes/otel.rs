//! OpenTelemetry (feature `otel`): a message's producer span, its consumer span, and what the
//! handler publishes (a reply, a publish through its context) are one trace, linked parent to
//! child through the W3C `traceparent` header, on the model, a real server and a cluster, and
//! under `TestApp`.
//!
//! One tracer provider with an in-memory exporter is installed as the global provider for the
//! whole binary; tests run in parallel, so each picks its spans out by its own destination names.

#![cfg(feature = "otel")]

use crate::harness;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use harness::{Env, WAIT, on, unique, wait_until};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use ruststream::opentelemetry::global;
use ruststream::opentelemetry::trace::{SpanId, SpanKind, Status};
use ruststream::prelude::*;
use ruststream::testing::TestApp;

on!([memory, standalone, cluster] multi_thread:
    a_reply_and_a_publish_in_the_handler_continue_the_trace,
    a_handler_failure_is_an_error_on_its_span,
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

/// The exporter of the binary's global tracer provider, installed on first use.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        global::set_tracer_provider(provider);
        exporter
    })
}

/// A string attribute of a span.
fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// The finished span named `name`, once there is exactly one.
fn finished(name: &str) -> Option<SpanData> {
    let spans = exporter().get_finished_spans().ok()?;
    let mut named = spans.into_iter().filter(|s| s.name == name);
    let span = named.next()?;
    named.next().is_none().then_some(span)
}

/// Waits until every span of `names` has finished; returns them in that order.
async fn wait_for_spans(names: &[String]) -> Vec<SpanData> {
    wait_until("the spans are exported", WAIT, async || {
        names.iter().all(|n| finished(n).is_some())
    })
    .await;
    names
        .iter()
        .map(|n| finished(n).expect("exported"))
        .collect()
}

/// Asserts that `child` is a child of `parent`, of the same trace, of kind `kind`.
fn assert_child(child: &SpanData, parent: &SpanData, kind: SpanKind) {
    assert_eq!(child.span_kind, kind, "{}", child.name);
    assert_eq!(
        child.span_context.trace_id(),
        parent.span_context.trace_id(),
        "{} is in the trace of {}",
        child.name,
        parent.name
    );
    assert_eq!(
        child.parent_span_id,
        parent.span_context.span_id(),
        "{} is a child of {}",
        child.name,
        parent.name
    );
}

/// The `traceparent` a span's context is written as.
fn traceparent(span: &SpanData) -> String {
    let sc = &span.span_context;
    format!(
        "00-{:032x}-{:016x}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    )
}

/// Replies to a job with the next number, publishes a job to `side` through its context, and
/// keeps the `traceparent` header it saw.
#[derive(Clone)]
struct Forward {
    side: String,
    seen: Arc<Mutex<Vec<Option<String>>>>,
}

impl Handle<Job, Job> for Forward {
    async fn handle(
        &self,
        job: &Job,
        _: &(),
        ctx: &mut Context<'_>,
    ) -> Result<Job, HandlerOutcome> {
        self.seen
            .lock()
            .expect("lock")
            .push(ctx.header("traceparent").map(str::to_owned));
        ctx.publisher()
            .message(job)
            .to(self.side.as_str())
            .publish()
            .await
            .map_err(|_| HandlerOutcome::retry())?;
        Ok(Job { n: job.n + 1 })
    }
}

/// Acknowledges every job.
struct Sink;

impl Handle<Job> for Sink {
    async fn handle(&self, _: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        Ok(())
    }
}

async fn a_reply_and_a_publish_in_the_handler_continue_the_trace(env: &Env) {
    exporter();
    let [input, output, side] = ["in", "out", "side"].map(unique);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let forward = Forward {
        side: side.clone(),
        seen: seen.clone(),
    };
    let app = env
        .start_with(|b| {
            // The reply goes out with a policy of its own (`publish_with`), the handler's own
            // publish through the subscription's publisher.
            b.include(
                subscriber(RedisList::new(input.as_str()), forward)
                    .reply()
                    .to(output.as_str())
                    .build(),
            )
            .out_reply(list::Publish::new());
            b.include(subscriber(RedisList::new(output.as_str()), Sink).build());
            b.include(subscriber(RedisList::new(side.as_str()), Sink).build());
        })
        .await;
    env.broker()
        .publisher()
        .message(&Job { n: 1 })
        .to(input.as_str())
        .id("job-1")
        .publish()
        .await
        .expect("publish");
    let names = [
        format!("publish {input}"),
        format!("process {input}"),
        format!("publish {output}"),
        format!("process {output}"),
        format!("publish {side}"),
        format!("process {side}"),
    ];
    let spans = wait_for_spans(&names).await;
    env.stop(app).await;
    let [
        produced,
        handled,
        replied,
        reply_handled,
        published,
        publish_handled,
    ] = <[SpanData; 6]>::try_from(spans).expect("six spans");

    assert_eq!(produced.span_kind, SpanKind::Producer);
    assert_eq!(
        produced.parent_span_id,
        SpanId::INVALID,
        "the publish is a root"
    );
    assert_eq!(
        attribute(&produced, "messaging.system").as_deref(),
        Some("redis")
    );
    assert_eq!(
        attribute(&produced, "messaging.destination.name").as_deref(),
        Some(input.as_str())
    );
    assert_eq!(
        attribute(&produced, "messaging.message.id").as_deref(),
        Some("job-1")
    );

    assert_child(&handled, &produced, SpanKind::Consumer);
    assert!(handled.parent_span_is_remote);
    assert_eq!(
        attribute(&handled, "messaging.message.id").as_deref(),
        Some("job-1")
    );
    assert_eq!(
        attribute(&handled, "ruststream.attempt").as_deref(),
        Some("1")
    );
    assert_eq!(
        attribute(&handled, "ruststream.outcome").as_deref(),
        Some("ack")
    );
    assert_eq!(handled.status, Status::Unset);
    assert_child(&replied, &handled, SpanKind::Producer);
    assert_child(&reply_handled, &replied, SpanKind::Consumer);
    assert_child(&published, &handled, SpanKind::Producer);
    assert_child(&publish_handled, &published, SpanKind::Consumer);

    let seen = seen.lock().expect("lock").clone();
    assert_eq!(
        seen,
        vec![Some(traceparent(&produced))],
        "the handler's Context headers"
    );
}

/// Drops jobs; a payload that is not a job fails to decode before it runs.
struct Dropper;

impl Handle<Job> for Dropper {
    async fn handle(&self, _: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        Err(HandlerOutcome::drop())
    }
}

async fn a_handler_failure_is_an_error_on_its_span(env: &Env) {
    exporter();
    let [dropped, garbage] = ["dropped", "garbage"].map(unique);
    let app = env
        .start_with(|b| {
            b.include(subscriber(RedisList::new(dropped.as_str()), Dropper).build());
            b.include(subscriber(RedisList::new(garbage.as_str()), Dropper).build());
        })
        .await;
    let publisher = env.broker().publisher();
    publisher
        .message(&Job { n: 1 })
        .to(dropped.as_str())
        .publish()
        .await
        .expect("publish");
    publisher
        .message(&b"not json".to_vec())
        .to(garbage.as_str())
        .publish()
        .await
        .expect("publish");
    let names = [format!("process {dropped}"), format!("process {garbage}")];
    let spans = wait_for_spans(&names).await;
    env.stop(app).await;

    // A drop is the handler's decision, not an error.
    assert_eq!(
        attribute(&spans[0], "ruststream.outcome").as_deref(),
        Some("dead")
    );
    assert_eq!(
        attribute(&spans[0], "ruststream.dead_letter.reason").as_deref(),
        Some("dropped")
    );
    assert_eq!(spans[0].status, Status::Unset);
    assert_eq!(
        attribute(&spans[1], "ruststream.outcome").as_deref(),
        Some("dead")
    );
    assert!(
        matches!(&spans[1].status, Status::Error { description } if description.contains("decode")),
        "{:?}",
        spans[1].status
    );
}

/// Under `TestApp`, on the virtual clock: a delayed publish's consumer continues the publisher's
/// trace an hour later, and the reply (with no policy of its own) continues the consumer's.
#[tokio::test(start_paused = true)]
async fn a_delayed_publish_and_its_reply_are_one_trace_under_testapp() -> ruststream::Result<()> {
    exporter();
    let [input, output, side] = ["t-in", "t-out", "t-side"].map(unique);
    let forward = Forward {
        side: side.clone(),
        seen: Arc::default(),
    };
    let app = RustStream::new(AppInfo::new("otel", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379"),
        |b| {
            b.include(
                subscriber(RedisList::new(input.as_str()), forward)
                    .reply()
                    .to(output.as_str())
                    .build(),
            );
            b.include(subscriber(RedisList::new(output.as_str()), Sink).build());
        },
    );
    let tb = TestApp::start(app).await?;
    tb.broker::<RedisBroker>()
        .message(&Job { n: 1 })
        .to(input.as_str())
        .delay(Duration::from_secs(3600))
        .publish()
        .await?;
    tb.advance(Duration::from_secs(3601)).await?;
    let names = [
        format!("publish {input}"),
        format!("process {input}"),
        format!("publish {output}"),
        format!("process {output}"),
    ];
    let spans = wait_for_spans(&names).await;
    tb.shutdown().await?;
    assert_eq!(spans[0].span_kind, SpanKind::Producer);
    assert_child(&spans[1], &spans[0], SpanKind::Consumer);
    assert_child(&spans[2], &spans[1], SpanKind::Producer);
    assert_child(&spans[3], &spans[2], SpanKind::Consumer);
    Ok(())
}
