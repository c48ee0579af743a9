//! What `#[derive(Outgoing)]` and `#[subscriber]` generate, checked without a server: names and
//! templates, the wire format, schemas equal to `#[derive(JsonSchema)]`'s, handlers called through
//! `Handle`, and the subscribers they build.

// Message types here are only encoded, decoded and described.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use ruststream::prelude::*;
use ruststream::{DeliveryInfo, Headers, IntoSubscriber, OutMessage, Source as _};
use ruststream_core::PublishBackend;
use ruststream_core::message::schema_for;
use serde_json::json;

// ---------------------------------------------------------------------------------------------
// #[derive(Outgoing)]

#[derive(Debug, PartialEq, Deserialize, Serialize, Outgoing)]
#[outgoing(name = "orders.{tenant}.{region}")]
struct Order {
    tenant: String,
    region: u16,
    items: Vec<String>,
}

#[derive(Debug, PartialEq, Deserialize, Serialize, Outgoing)]
#[outgoing(name = "audit")]
struct Audit(String);

#[derive(Debug, PartialEq, Deserialize, Serialize, Outgoing)]
struct Ping;

#[test]
fn names_and_templates() {
    assert_eq!(
        <Order as MessageType>::NAME,
        Some("orders.{tenant}.{region}")
    );
    let order = Order {
        tenant: "acme".into(),
        region: 7,
        items: vec![],
    };
    assert_eq!(
        order.destination().unwrap().as_deref(),
        Some("orders.acme.7")
    );
    assert_eq!(
        Audit("x".into()).destination().unwrap().as_deref(),
        Some("audit")
    );
    assert_eq!(<Ping as MessageType>::NAME, None);
    assert_eq!(Ping.destination().unwrap(), None);
}

#[test]
fn json_on_the_wire() {
    let order = Order {
        tenant: "acme".into(),
        region: 7,
        items: vec!["a".into()],
    };
    let bytes = order.encode().unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(),
        json!({ "tenant": "acme", "region": 7, "items": ["a"] })
    );
    assert_eq!(Order::decode(&bytes).unwrap(), order);
    assert_eq!(<Order as MessageType>::content_type(), "application/json");
    assert!(Order::decode(b"{}").is_err());
    assert_eq!(Audit::decode(b"\"x\"").unwrap(), Audit("x".into()));
    assert_eq!(Ping::decode(b"null").unwrap(), Ping);
}

/// Each `MessageType` type below has a twin deriving `JsonSchema` with the same attributes: their
/// schemas must be the same.
macro_rules! same_schema {
    ($outgoing:ty, $twin:ty) => {
        assert_eq!(
            serde_json::to_value(<$outgoing as MessageType>::schema()).unwrap(),
            serde_json::to_value(schema_for::<$twin>()).unwrap(),
            "{} and its JsonSchema twin",
            stringify!($outgoing)
        );
    };
}

/// A job to render.
#[derive(Debug, Default, Deserialize, Serialize, Outgoing)]
#[serde(rename_all = "camelCase", default)]
struct RenderJob {
    /// The image's key in the bucket.
    image_key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    width: Option<u32>,
    #[serde(rename = "h")]
    height: u32,
    #[serde(skip)]
    internal: u64,
}

/// A job to render.
#[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
#[schemars(crate = "ruststream::schemars", rename = "RenderJob")]
#[serde(rename_all = "camelCase", default)]
struct RenderJobTwin {
    /// The image's key in the bucket.
    image_key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    width: Option<u32>,
    #[serde(rename = "h")]
    height: u32,
    #[serde(skip)]
    internal: u64,
}

#[derive(Debug, Deserialize, Serialize, Outgoing)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Event {
    Uploaded {
        image: String,
    },
    Deleted {
        image: String,
        reason: Option<String>,
    },
    Purged,
}

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[schemars(crate = "ruststream::schemars", rename = "Event")]
#[serde(tag = "kind", rename_all = "snake_case")]
enum EventTwin {
    Uploaded {
        image: String,
    },
    Deleted {
        image: String,
        reason: Option<String>,
    },
    Purged,
}

#[derive(Debug, Deserialize, Serialize, Outgoing)]
struct Pair(u8, String);

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[schemars(crate = "ruststream::schemars", rename = "Pair")]
struct PairTwin(u8, String);

#[derive(Debug, Deserialize, Serialize, Outgoing)]
struct Node {
    name: String,
    children: Vec<Node>,
}

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[schemars(crate = "ruststream::schemars", rename = "Node")]
struct NodeTwin {
    name: String,
    children: Vec<NodeTwin>,
}

#[test]
fn schemas_match_derive_json_schema() {
    same_schema!(RenderJob, RenderJobTwin);
    same_schema!(Event, EventTwin);
    same_schema!(Pair, PairTwin);
    same_schema!(Node, NodeTwin);
}

#[test]
fn schema_reads_serde_attributes_and_docs() {
    let schema = serde_json::to_value(<RenderJob as MessageType>::schema()).unwrap();
    assert_eq!(schema["title"], "RenderJob");
    assert_eq!(schema["description"], "A job to render.");
    let props = schema["properties"].as_object().unwrap();
    assert!(props.contains_key("imageKey"), "{schema:#}");
    assert!(props.contains_key("h"), "{schema:#}");
    assert!(!props.contains_key("internal"), "{schema:#}");
    assert_eq!(
        props["imageKey"]["description"],
        "The image's key in the bucket."
    );
    // Draft-07, as AsyncAPI 3.0 reads payloads: shared definitions under `definitions`.
    let node = serde_json::to_value(<Node as MessageType>::schema()).unwrap();
    assert_eq!(node["$schema"], "http://json-schema.org/draft-07/schema#");
    assert_eq!(node["properties"]["children"]["items"]["$ref"], "#");
}

// ---------------------------------------------------------------------------------------------
// #[subscriber]

#[derive(Debug, PartialEq, Deserialize, Serialize, Outgoing)]
pub(crate) struct Job {
    image: String,
}

#[derive(Debug, PartialEq, Deserialize, Serialize, Outgoing)]
#[outgoing(name = "rendered")]
struct Rendered {
    image: String,
    attempt: u32,
}

/// Renders one job.
#[subscriber(RedisList::new("jobs").reliable().concurrency(4))]
async fn render(job: &Job, ctx: &mut Context<'_>) -> Result<(), String> {
    if job.image.is_empty() {
        return Err(format!("empty image (attempt {})", ctx.attempt()));
    }
    Ok(())
}

#[subscriber(RedisList::new("checks"))]
pub(crate) async fn check(job: &Job) -> HandlerOutcome {
    if job.image.ends_with(".png") {
        HandlerOutcome::ack()
    } else {
        HandlerOutcome::drop()
    }
}

#[subscriber(RedisList::new("units"))]
async fn unit(_job: &Job) {}

#[subscriber(RedisStream::new("uploads").group("g"), reply)]
async fn announce(job: &Job, ctx: &mut Context<'_>) -> Result<Rendered, std::io::Error> {
    Ok(Rendered {
        image: job.image.clone(),
        attempt: ctx.attempt(),
    })
}

const DEST: &str = "{rendered}";

#[subscriber(ruststream::RedisList::new("jobs2"), reply(DEST))]
async fn announce_to(job: &Job) -> Rendered {
    Rendered {
        image: job.image.clone(),
        attempt: 0,
    }
}

/// Hangs on an image named `hang`: its timeout stops it.
#[subscriber(RedisList::new("{timed}").reliable().max_attempts(1), timeout = Duration::from_millis(250))]
async fn timed(job: &Job, ctx: &mut Context<'_>) -> HandlerOutcome {
    assert!(ctx.deadline().is_some(), "the timeout gives a deadline");
    if job.image == "hang" {
        std::future::pending::<()>().await;
    }
    HandlerOutcome::ack()
}

// A `#[cfg]` after the attribute removes everything generated, not only the function.
#[subscriber(RedisList::new("never"))]
#[cfg(any())]
async fn never(_job: &Job) {}

struct NoBackend;

impl PublishBackend for NoBackend {
    fn publish(&self, _messages: Vec<OutMessage>) -> BoxFuture<'_, ruststream::Result<usize>> {
        Box::pin(async { Err(ruststream::Error::NotConnected) })
    }
}

fn delivery(attempt: u32) -> (DeliveryInfo, Publisher) {
    (
        DeliveryInfo::new("id-1".into(), attempt, Arc::from("jobs"), Headers::new()),
        Publisher::new(Arc::new(NoBackend)),
    )
}

fn job(image: &str) -> Job {
    Job {
        image: image.into(),
    }
}

#[tokio::test]
async fn handlers_convert_their_results() {
    let (info, publisher) = delivery(3);
    let mut ctx = Context::new(&info, &publisher);
    assert_eq!(render.handle(&job("a.png"), &(), &mut ctx).await, Ok(()));
    assert_eq!(
        render.handle(&job(""), &(), &mut ctx).await,
        Err(HandlerOutcome::retry()),
        "an Err is retried"
    );
    assert_eq!(check.handle(&job("a.png"), &(), &mut ctx).await, Ok(()));
    assert_eq!(
        check.handle(&job("a.gif"), &(), &mut ctx).await,
        Err(HandlerOutcome::drop())
    );
    assert_eq!(unit.handle(&job("x"), &(), &mut ctx).await, Ok(()));
    assert_eq!(
        announce.handle(&job("a.png"), &(), &mut ctx).await,
        Ok(Rendered {
            image: "a.png".into(),
            attempt: 3
        })
    );
    // The function itself stays callable.
    assert_eq!(check::check(&job("b.png")).await, HandlerOutcome::ack());
    assert_eq!(announce_to::announce_to(&job("c")).await.image, "c");
}

#[test]
fn subscribers_are_built_like_hand_written_ones() {
    let s = render.into_subscriber();
    assert_eq!(
        s.source(),
        &RedisList::new("jobs")
            .reliable()
            .concurrency(4)
            .into_source()
    );
    assert_eq!(s.reply_to(), None);

    let s = announce.into_subscriber();
    assert_eq!(
        s.source(),
        &RedisStream::new("uploads").group("g").into_source()
    );
    assert_eq!(s.reply_to(), None, "replies go to Rendered's outgoing name");

    let s = announce_to.into_subscriber();
    assert_eq!(s.reply_to(), Some("{rendered}"));
}

#[test]
fn a_timeout_is_the_sources() {
    let s = timed.into_subscriber();
    let expected = RedisList::new("{timed}")
        .reliable()
        .max_attempts(1)
        .timeout(Duration::from_millis(250));
    assert_eq!(s.source(), &expected.into_source());
}

#[tokio::test(start_paused = true)]
async fn a_timeout_stops_the_handler() -> ruststream::Result<()> {
    let app = RustStream::new(AppInfo::new("t", "1")).with_broker(
        RedisBroker::standalone("redis://localhost:6379").prefix("m:"),
        |b| {
            b.include(timed);
        },
    );
    let tb = ruststream::testing::TestApp::start(app).await?;
    for image in ["hang", "a.png"] {
        tb.broker::<RedisBroker>()
            .message(&job(image))
            .to("{timed}")
            .publish()
            .await?;
    }
    tb.advance(Duration::from_secs(1)).await?;
    let calls = tb.broker::<RedisBroker>().subscriber("{timed}");
    let settled: Vec<_> = calls
        .assert_called(2)
        .calls()
        .iter()
        .map(|c| c.settlement.clone())
        .collect();
    assert_eq!(
        settled,
        [
            Some(ruststream::Settlement::Dead {
                reason: "timeout".into()
            }),
            Some(ruststream::Settlement::Ack)
        ]
    );
    tb.shutdown().await
}

#[test]
fn documents_show_the_replies() {
    let app = RustStream::new(AppInfo::new("t", "1")).with_broker(
        RedisBroker::standalone("redis://127.0.0.1:1"),
        |b| {
            b.include(render);
            b.include(check);
            b.include(announce);
            b.include(announce_to);
        },
    );
    let doc = ruststream::asyncapi::document(&app);
    let addresses: BTreeMap<&str, &serde_json::Value> = doc["channels"]
        .as_object()
        .unwrap()
        .values()
        .map(|c| (c["address"].as_str().unwrap(), c))
        .collect();
    assert_eq!(
        addresses.keys().copied().collect::<Vec<_>>(),
        [
            "checks",
            "jobs",
            "jobs2",
            "rendered",
            "uploads",
            "{rendered}"
        ]
    );
    assert_eq!(
        addresses["{rendered}"]["parameters"]["rendered"]["enum"],
        json!(["{rendered}"]),
        "a hash tag reads literally"
    );
}
