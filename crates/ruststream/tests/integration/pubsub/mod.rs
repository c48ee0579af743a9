//! Pub/Sub subscriptions (`RedisChannel`) on the in-memory model and a real Redis, and under
//! `TestApp`.
//!
//! The behaviour tests run on the model, the standalone server and the cluster (`name::memory`,
//! `name::standalone`, `name::cluster`, see `harness`). Each has a key prefix of its own, which
//! channel names get too, so they run in parallel. Pub/Sub stores nothing: a test publishes only
//! once the subscription is known to be active (`PUBSUB NUMSUB` summed over every node, or a
//! probe message seen for a pattern), and every wait is bounded.

mod connection;
mod offline;

use crate::harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::clients::SubscriberClient;
use fred::prelude::*;
use harness::{Env, WAIT, bounded, on, start, stop, wait_until};
use ruststream::prelude::*;
use ruststream::pubsub::NO_REDELIVERY;
use ruststream_redis::frame::Frame;
use tokio::time::Instant;

on!(
    [memory, standalone, cluster] multi_thread:
    every_subscribed_app_gets_every_message,
    ids_and_headers_survive_and_raw_publishes_are_payloads,
    a_pattern_gets_matching_channels_only,
    retry_drop_and_garbage_end_on_the_dead_letter_list,
    shutdown_closes_the_subscription,
);

// Not on the model: a raw fred subscriber client listens for the reply, and the model takes
// commands, not subscriber connections.
on!([standalone, cluster] multi_thread: replies_are_published_with_pubsub_publish);

on!([memory, standalone, cluster] a_delayed_publish_to_a_channel_is_refused);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Event {
    n: u32,
}

outgoing!(Event);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Done {
    n: u32,
}

outgoing!(Done);

fn info() -> AppInfo {
    AppInfo::new("pubsub-test", "0.0.0")
}

fn event_json(n: u32) -> Bytes {
    Bytes::from(serde_json::to_vec(&Event { n }).expect("json"))
}

/// Subscribers of the (full) channel `channel`, over every node.
async fn numsub(nodes: &[Client], channel: &str) -> i64 {
    let mut total = 0;
    for node in nodes {
        let reply: Vec<Value> = node
            .custom(fred::cmd!("PUBSUB"), vec!["NUMSUB", channel])
            .await
            .expect("PUBSUB NUMSUB");
        total += reply.get(1).and_then(Value::as_i64).unwrap_or(0);
    }
    total
}

/// Waits until the (full) channel has `n` subscribers.
async fn await_subscribers(nodes: &[Client], channel: &str, n: i64) {
    wait_until(&format!("{n} subscribers of {channel}"), WAIT, async || {
        numsub(nodes, channel).await == n
    })
    .await;
}

/// A raw `PUBLISH` of `value` on the (full) channel, as `redis-cli` would.
async fn publish_raw(env: &Env, channel: &str, value: &'static str) {
    let _: i64 = env.client.publish(channel, value).await.expect("PUBLISH");
}

/// The harness's recorder of every delivery ([`harness::Seen`]).
type Probe = harness::Seen<Event>;

impl Probe {
    /// The numbers handled, sorted.
    fn ns(&self) -> Vec<u32> {
        let mut ns: Vec<u32> = self.seen().iter().map(|s| s.n).collect();
        ns.sort_unstable();
        ns
    }
}

/// Publishes `Event { n }` to `to` through `broker`'s publisher.
async fn publish_event(broker: &RedisBroker, to: &str, n: u32) {
    broker
        .publisher()
        .message(&Event { n })
        .to(to)
        .publish()
        .await
        .expect("publish");
}

/// An app with one subscriber on `broker`.
fn app_with(broker: &RedisBroker, source: RedisChannel, probe: &Probe) -> RustStream {
    let probe = probe.clone();
    RustStream::new(info()).with_broker(broker.clone(), move |b| {
        b.include(subscriber(source, probe).build());
    })
}

// 1 ------------------------------------------------------------------------------------------

async fn every_subscribed_app_gets_every_message(env: &Env) {
    let nodes = env.node_clients().await;
    let (one, two) = (Probe::acking(), Probe::acking());
    let app_one = start(app_with(&env.broker(), RedisChannel::new("{ev}"), &one)).await;
    let app_two = start(app_with(&env.broker(), RedisChannel::new("{ev}"), &two)).await;
    await_subscribers(&nodes, &env.key("{ev}"), 2).await;

    // A producer-only process: the route makes `{ev}` a channel (a list by default).
    let producer = env.broker().route("{ev}", pubsub::Publish::new());
    let batch: Vec<Event> = (0..50).map(|n| Event { n }).collect();
    producer
        .publisher()
        .messages(&batch)
        .to("{ev}")
        .publish()
        .await
        .expect("batch publish");
    publish_event(&producer, "{ev}", 50).await;
    wait_until("51 deliveries to each app", WAIT, async || {
        one.count() >= 51 && two.count() >= 51
    })
    .await;
    stop(app_one).await;
    stop(app_two).await;

    let all: Vec<u32> = (0..=50).collect();
    assert_eq!(one.ns(), all, "each message once");
    assert_eq!(two.ns(), all, "each message once");
    let ids = |p: &Probe| {
        let mut ids: Vec<String> = p.seen().into_iter().map(|s| s.id).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&one), ids(&two), "both got the same messages");
    assert!(
        one.seen()
            .iter()
            .all(|s| s.attempt == 1 && s.source == "{ev}")
    );
    assert!(
        env.keys().await.is_empty(),
        "pub/sub stores nothing: {:?}",
        env.keys().await
    );
}

// 2 ------------------------------------------------------------------------------------------

async fn ids_and_headers_survive_and_raw_publishes_are_payloads(env: &Env) {
    let nodes = env.node_clients().await;
    let broker = env.broker();
    let probe = Probe::acking();
    let app = start(app_with(&broker, RedisChannel::new("{ev}"), &probe)).await;
    await_subscribers(&nodes, &env.key("{ev}"), 1).await;

    // The app reads `{ev}` as a channel, so its own publisher PUBLISHes there.
    broker
        .publisher()
        .message(&Event { n: 1 })
        .to("{ev}")
        .id("m-1")
        .header("tenant", "acme")
        .header("region", "eu")
        .publish()
        .await
        .expect("publish");
    publish_raw(env, &env.key("{ev}"), r#"{"n":2}"#).await;
    wait_until("two deliveries", WAIT, async || probe.count() == 2).await;
    stop(app).await;

    let seen = probe.seen();
    let framed = seen.iter().find(|s| s.n == 1).expect("the framed message");
    assert_eq!(framed.id, "m-1");
    assert_eq!(
        framed.headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    assert_eq!(framed.headers.get("region").map(String::as_str), Some("eu"));
    assert_eq!(framed.headers.len(), 2);
    let raw = seen.iter().find(|s| s.n == 2).expect("the raw message");
    assert!(raw.headers.is_empty(), "headers: {:?}", raw.headers);
    assert!(
        !raw.id.is_empty() && raw.id != "m-1",
        "a raw message gets an id"
    );
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}

// 3 ------------------------------------------------------------------------------------------

async fn a_pattern_gets_matching_channels_only(env: &Env) {
    let probe = Probe::acking();
    let app = start(app_with(
        &env.broker(),
        RedisChannel::pattern("ev.*"),
        &probe,
    ))
    .await;

    // Subscribed once a matching probe comes through (`PUBSUB NUMPAT` counts every test's
    // patterns, not this one's).
    let n_probe = 999;
    let probe_json = r#"{"n":999}"#;
    wait_until("the pattern subscription", WAIT, async || {
        publish_raw(env, &env.key("ev.probe"), probe_json).await;
        probe.seen().iter().any(|s| s.n == n_probe)
    })
    .await;

    let producer = ["ev.a", "ev.b", "ev", "other.a", "xev.a", "ev.c"]
        .iter()
        .fold(env.broker(), |b, ch| b.route(*ch, pubsub::Publish::new()));
    // Non-matching channels first: by the time the matching ones arrive, they would have too.
    for (n, ch) in [(10, "ev"), (11, "other.a"), (12, "xev.a")] {
        publish_event(&producer, ch, n).await;
    }
    // Another prefix's channel that the pattern would match without the prefix.
    publish_raw(env, "ev.z", r#"{"n":13}"#).await;
    for (n, ch) in [(1, "ev.a"), (2, "ev.b"), (3, "ev.c")] {
        publish_event(&producer, ch, n).await;
    }
    wait_until("the three matching messages", WAIT, async || {
        probe.seen().iter().filter(|s| s.n < 900).count() >= 3
    })
    .await;
    stop(app).await;

    let mut got: Vec<(u32, String)> = probe
        .seen()
        .into_iter()
        .filter(|s| s.n != n_probe)
        .map(|s| (s.n, s.source))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (1, "ev.a".to_owned()),
            (2, "ev.b".to_owned()),
            (3, "ev.c".to_owned())
        ],
        "the handler's source is the matching channel, without the prefix"
    );
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}

// 4 ------------------------------------------------------------------------------------------

async fn retry_drop_and_garbage_end_on_the_dead_letter_list(env: &Env) {
    let nodes = env.node_clients().await;
    let broker = env.broker();
    let probe = Probe::new(|e, _| match e.n {
        1 => Err(HandlerOutcome::retry()),
        2 => Err(HandlerOutcome::drop()),
        3 => Err(HandlerOutcome::retry_after(Duration::from_secs(1))),
        _ => Ok(()),
    });
    let app = start(app_with(&broker, RedisChannel::new("{ev}"), &probe)).await;
    await_subscribers(&nodes, &env.key("{ev}"), 1).await;
    for n in 1..=4 {
        broker
            .publisher()
            .message(&Event { n })
            .to("{ev}")
            .header("tenant", "acme")
            .publish()
            .await
            .expect("publish");
    }
    publish_raw(env, &env.key("{ev}"), "not json").await;
    wait_until("four dead letters", WAIT, async || {
        env.llen("{ev}.dead").await == 4
    })
    .await;
    wait_until("four handler calls", WAIT, async || probe.count() == 4).await;
    stop(app).await;

    assert_eq!(
        probe.ns(),
        [1, 2, 3, 4],
        "handled once each, never redelivered"
    );
    let dead = env.frames("{ev}.dead").await;
    let reason = |f: &Frame| f.headers.get("reason").cloned().unwrap_or_default();
    let of = |n: u32| {
        dead.iter()
            .find(|f| f.payload == event_json(n))
            .unwrap_or_else(|| panic!("a dead letter for {n}: {dead:?}"))
    };
    assert_eq!(reason(of(1)), NO_REDELIVERY);
    assert_eq!(reason(of(2)), "dropped");
    assert_eq!(reason(of(3)), NO_REDELIVERY);
    for n in 1..=3 {
        let f = of(n);
        assert_eq!(f.headers.get("tenant").map(String::as_str), Some("acme"));
        assert_eq!(f.attempt, 1);
        let handled = probe.seen().into_iter().find(|s| s.n == n).expect("seen");
        assert_eq!(f.id, handled.id, "the dead letter keeps the message id");
    }
    let garbage = dead
        .iter()
        .find(|f| f.payload == Bytes::from_static(b"not json"))
        .expect("the garbage dead letter");
    assert!(
        reason(garbage).starts_with("decode:"),
        "reason: {}",
        reason(garbage)
    );
    assert_eq!(env.keys().await, ["{ev}.dead"], "no delayed set, no queue");
}

// 5 ------------------------------------------------------------------------------------------

/// Replies with the event's number.
struct Echo;

impl Handle<Event, Done> for Echo {
    async fn handle(&self, e: &Event, _: &(), _: &mut Context<'_>) -> Result<Done, HandlerOutcome> {
        Ok(Done { n: e.n })
    }
}

/// A raw fred subscriber on the test's server, listening to the (full) channel.
async fn raw_subscriber(env: &Env, channel: &str) -> SubscriberClient {
    let client = Builder::from_config(env.config())
        .build_subscriber_client()
        .expect("a subscriber client");
    bounded("raw subscriber connects", WAIT, client.init())
        .await
        .expect("connected");
    bounded("raw subscribe", WAIT, client.subscribe(channel))
        .await
        .expect("SUBSCRIBE");
    client
}

async fn replies_are_published_with_pubsub_publish(env: &Env) {
    let nodes = env.node_clients().await;
    let broker = env.broker();
    let listener = raw_subscriber(env, &env.key("{out}")).await;
    let mut replies = listener.message_rx();
    let app = RustStream::new(info()).with_broker(broker.clone(), |b| {
        b.include(
            subscriber(RedisChannel::new("{in}"), Echo)
                .reply()
                .to("{out}")
                .build(),
        )
        .out_reply(pubsub::Publish::new());
    });
    let app = start(app).await;
    await_subscribers(&nodes, &env.key("{in}"), 1).await;
    await_subscribers(&nodes, &env.key("{out}"), 1).await;
    publish_event(&broker, "{in}", 7).await;
    let reply = bounded("the reply", WAIT, replies.recv())
        .await
        .expect("a message");
    stop(app).await;

    assert_eq!(&*reply.channel, env.key("{out}"));
    let bytes = match reply.value {
        Value::Bytes(b) => b,
        Value::String(s) => s.into_inner(),
        other => panic!("not a bulk string: {other:?}"),
    };
    let frame = Frame::decode(bytes);
    assert!(!frame.id.is_empty(), "the reply is a frame with an id");
    let done: Done = serde_json::from_slice(&frame.payload).expect("a Done");
    assert_eq!(done, Done { n: 7 });
    assert!(
        env.keys().await.is_empty(),
        "published, not pushed onto a list: {:?}",
        env.keys().await
    );
    let _ = listener.quit().await;
}

// 6 ------------------------------------------------------------------------------------------

/// A handler that takes a while and counts the handlers that finished.
#[derive(Clone, Default)]
struct Slow {
    started: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
}

impl Handle<Event> for Slow {
    async fn handle(&self, _: &Event, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.finished.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn shutdown_closes_the_subscription(env: &Env) {
    let nodes = env.node_clients().await;
    let broker = env.broker();
    let slow = Slow::default();
    let handler = slow.clone();
    let app = RustStream::new(info()).with_broker(broker.clone(), move |b| {
        b.include(subscriber(RedisChannel::new("{ev}"), handler).build());
    });
    let app = start(app).await;
    await_subscribers(&nodes, &env.key("{ev}"), 1).await;
    publish_event(&broker, "{ev}", 1).await;
    wait_until("the handler to start", WAIT, async || {
        slow.started.load(Ordering::SeqCst) == 1
    })
    .await;
    let began = Instant::now();
    stop(app).await;
    assert_eq!(
        slow.finished.load(Ordering::SeqCst),
        1,
        "shutdown waited for the handler in flight"
    );
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    await_subscribers(&nodes, &env.key("{ev}"), 0).await;
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}

// Refusals --------------------------------------------------------------------------------

/// A publish delayed to a channel is refused: Pub/Sub stores nothing.
async fn a_delayed_publish_to_a_channel_is_refused(env: &Env) {
    let producer = env.broker().route("ev", pubsub::Publish::new());
    let e = producer
        .publisher()
        .message(&Event { n: 1 })
        .to("ev")
        .delay(Duration::from_secs(1))
        .publish()
        .await
        .expect_err("refused");
    assert!(
        matches!(
            harness::pubsub_refusal(&e),
            ruststream::redis::error::PubSubError::CannotDelay { channel } if channel == "ev"
        ),
        "{e}"
    );
    assert!(e.to_string().contains("pub/sub cannot delay"), "{e}");
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}
