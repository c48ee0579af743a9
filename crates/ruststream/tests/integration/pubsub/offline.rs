//! What runs without a server: `TestApp` on channel and pattern subscriptions, and the AsyncAPI
//! document of Pub/Sub subscriptions and their replies.

use crate::harness;

use std::time::Duration;

use fred::bytes::Bytes;
use fred::prelude::*;
use harness::metrics::{prometheus, sample};
use ruststream::prelude::*;
use ruststream::pubsub::NO_REDELIVERY;
use ruststream::testing::TestApp;
use ruststream_redis::frame::Frame;

use super::{Echo, Event, Probe, app_with, event_json, info};

// TestApp -------------------------------------------------------------------------------------

fn test_app(source: RedisChannel, probe: &Probe) -> RustStream {
    app_with(
        &RedisBroker::standalone("redis://localhost:6379").prefix("t:"),
        source,
        probe,
    )
}

#[tokio::test(start_paused = true)]
async fn testapp_delivers_a_published_message_to_a_channel_subscription() -> ruststream::Result<()>
{
    let probe = Probe::acking();
    let tb = TestApp::start(test_app(RedisChannel::new("events"), &probe)).await?;
    let event = Event { n: 1 };
    tb.broker::<RedisBroker>()
        .message(&event)
        .to("events")
        .header("tenant", "acme")
        .publish()
        .await?;
    let b = tb.broker::<RedisBroker>();
    b.subscriber("events")
        .assert_called_once()
        .with(&event)
        .settled(HandlerOutcome::ack());
    b.published::<Event>("events")
        .assert_called_once()
        .with(&event);
    assert_eq!(
        probe.seen()[0].headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    // Nothing is stored: the model holds no key.
    assert!(tb.model().keys().is_empty(), "{:?}", tb.model().keys());
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn testapp_pattern_subscription_and_no_redelivery() -> ruststream::Result<()> {
    let _ = prometheus();
    let probe = Probe::new(|e, _| {
        if e.n == 1 {
            Err(HandlerOutcome::retry())
        } else {
            Ok(())
        }
    });
    let app = RustStream::new(info()).with_broker(
        RedisBroker::standalone("redis://localhost:6379")
            .prefix("t:")
            .route("events.a", pubsub::Publish::new())
            .route("other", pubsub::Publish::new()),
        {
            let probe = probe.clone();
            move |b| {
                b.include(subscriber(RedisChannel::pattern("events.*"), probe).build());
            }
        },
    );
    let tb = TestApp::start(app).await?;
    let b = tb.broker::<RedisBroker>();
    b.message(&Event { n: 1 }).to("events.a").publish().await?;
    b.message(&Event { n: 2 }).to("other").publish().await?;
    b.subscriber("events.*")
        .assert_called_once()
        .with(&Event { n: 1 })
        .settled(HandlerOutcome::retry());
    assert_eq!(probe.seen()[0].source, "events.a");
    tb.advance(Duration::from_secs(3600)).await?;
    b.subscriber("events.*").assert_called_once();
    let redis = b.client().await?;
    let dead: Vec<Bytes> = redis
        .lrange("t:events.*.dead", 0, -1)
        .await
        .map_err(ruststream::redis::error::core)?;
    assert_eq!(dead.len(), 1);
    let frame = Frame::decode(dead[0].clone());
    assert_eq!(
        frame.headers.get("reason").map(String::as_str),
        Some(NO_REDELIVERY)
    );
    assert_eq!(frame.payload, event_json(1));
    // Counted as what happened to it: dead, with its reason, not as a retry.
    let text = prometheus().render();
    let handled = |outcome: &str| {
        sample(
            &text,
            "ruststream_handled_total",
            &[
                "subscription=\"events.*\"",
                &format!("outcome=\"{outcome}\""),
            ],
        )
    };
    assert_eq!(handled("dead"), Some(1.0), "{text}");
    assert_eq!(handled("retry").unwrap_or(0.0), 0.0, "{text}");
    assert!(
        sample(
            &text,
            "ruststream_dead_lettered_total",
            &["subscription=\"events.*\"", "reason=\"no-redelivery\""]
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    tb.shutdown().await
}

// AsyncAPI and the macro ------------------------------------------------------------------------

#[subscriber(RedisChannel::pattern("events.*").concurrency(8))]
async fn audit(_event: &Event) -> HandlerOutcome {
    HandlerOutcome::ack()
}

#[test]
fn the_asyncapi_document_shows_pubsub_channels() {
    let app = RustStream::new(info()).with_broker(
        RedisBroker::standalone("redis://localhost:6379"),
        |b| {
            b.include(subscriber(RedisChannel::new("events"), Probe::acking()).build());
            b.include(audit);
        },
    );
    let doc = ruststream::asyncapi::document(&app);
    let schema: serde_json::Value = serde_json::from_str(include_str!("../../asyncapi/3.0.0.json"))
        .expect("the vendored AsyncAPI schema is JSON");
    let validator = jsonschema::draft7::new(&schema).expect("the schema compiles");
    let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}\n{doc:#}");
    let channels = doc["channels"].as_object().expect("channels");
    let by_address = |a: &str| {
        channels
            .values()
            .find(|c| c["address"] == a)
            .unwrap_or_else(|| panic!("a channel `{a}`: {doc:#}"))
    };
    let events = by_address("events");
    assert_eq!(events["x-redis-transport"], "pubsub");
    assert_eq!(events["x-redis"]["subscribe"], "channel");
    assert_eq!(events["x-redis"]["deadLetter"], "events.dead");
    let pattern = by_address("events.*");
    assert_eq!(pattern["x-redis-transport"], "pubsub");
    assert_eq!(pattern["x-redis"]["subscribe"], "pattern");
}

/// A reply's channel in the AsyncAPI document has the transport it is really published on: the
/// reply's `.out_reply(..)` policy, else the destination's `route`, else `list`.
#[test]
fn the_asyncapi_document_shows_each_reply_on_its_own_transport() {
    let broker =
        RedisBroker::standalone("redis://localhost:6379").route("{audit}", stream::Publish::new());
    let app = RustStream::new(info()).with_broker(broker, |b| {
        b.include(
            subscriber(RedisChannel::new("in.a"), Echo)
                .reply()
                .to("notices")
                .build(),
        )
        .out_reply(pubsub::Publish::new());
        b.include(
            subscriber(RedisChannel::new("in.b"), Echo)
                .reply()
                .to("{audit}")
                .build(),
        );
        b.include(
            subscriber(RedisChannel::new("in.c"), Echo)
                .reply()
                .to("done")
                .build(),
        );
    });
    let doc = ruststream::asyncapi::document(&app);
    let channels = doc["channels"].as_object().expect("channels");
    let transport = |a: &str| {
        channels
            .values()
            .find(|c| c["address"] == a)
            .unwrap_or_else(|| panic!("a channel `{a}`: {doc:#}"))["x-redis-transport"]
            .clone()
    };
    assert_eq!(transport("notices"), "pubsub", "the out_reply policy");
    assert_eq!(transport("{audit}"), "stream", "the destination's route");
    assert_eq!(transport("done"), "list", "the default");
}
