//! Pub/Sub subscriptions (`RedisChannel`) on the in-memory model and a real Redis, and under
//! `TestApp`.
//!
//! The behaviour tests run on the model, the standalone server and the cluster (`name::memory`,
//! `name::standalone`, `name::cluster`, see `harness`). Each has a key prefix of its own, which
//! channel names get too, so they run in parallel. Pub/Sub stores nothing: a test publishes only
//! once the subscription is known to be active (`PUBSUB NUMSUB` summed over every node, or a
//! probe message seen for a pattern), and every wait is bounded.

use crate::harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::clients::SubscriberClient;
use fred::prelude::*;
use harness::metrics::{prometheus, sample};
use harness::{Env, WAIT, bounded, on, stand, start, stop, unique, wait_until};
use ruststream::prelude::*;
use ruststream::pubsub::NO_REDELIVERY;
use ruststream::testing::TestApp;
use ruststream_redis::frame::Frame;
use tokio::sync::Semaphore;
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

// Not on the model: backpressure is a Redis connection's (the model's feed is a broadcast).
on!([standalone, cluster] multi_thread:
    a_slow_handler_loses_nothing_beyond_the_buffer,
    a_stop_with_unread_messages_is_bounded,
);

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
    producer
        .publisher()
        .message(&Event { n: 50 })
        .to("{ev}")
        .publish()
        .await
        .expect("publish");
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
        producer
            .publisher()
            .message(&Event { n })
            .to(ch)
            .publish()
            .await
            .expect("publish");
    }
    // Another prefix's channel that the pattern would match without the prefix.
    publish_raw(env, "ev.z", r#"{"n":13}"#).await;
    for (n, ch) in [(1, "ev.a"), (2, "ev.b"), (3, "ev.c")] {
        producer
            .publisher()
            .message(&Event { n })
            .to(ch)
            .publish()
            .await
            .expect("publish");
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
    broker
        .publisher()
        .message(&Event { n: 7 })
        .to("{in}")
        .publish()
        .await
        .expect("publish");
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
    broker
        .publisher()
        .message(&Event { n: 1 })
        .to("{ev}")
        .publish()
        .await
        .expect("publish");
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

// Refusals and lag --------------------------------------------------------------------------

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
    assert!(e.to_string().contains("pub/sub cannot delay"), "{e}");
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}

/// A subscription held at its first message: an app whose `handler` reads a fresh channel
/// `{<name>-<pid>}` at concurrency 1 with a read-ahead of `buffer`, message 0 published, and its
/// handler seen counting it in `seen` (the handler then holds it). Returns the app, a publisher,
/// the channel and the nodes' clients.
async fn held_at_first<H>(
    env: &Env,
    name: &str,
    handler: H,
    seen: &AtomicUsize,
    buffer: usize,
) -> (ruststream::RunningApp, Publisher, String, Vec<Client>)
where
    H: Handle<Event> + Clone + Send + Sync + 'static,
{
    let nodes = env.node_clients().await;
    let broker = env.broker();
    let channel = format!("{{{name}-{}}}", std::process::id());
    let source = RedisChannel::new(channel.clone())
        .concurrency(1)
        .buffer(buffer);
    let app = RustStream::new(info()).with_broker(broker.clone(), move |b| {
        b.include(subscriber(source, handler).build());
    });
    let app = start(app).await;
    await_subscribers(&nodes, &env.key(&channel), 1).await;
    let publisher = broker.publisher();
    publisher
        .message(&Event { n: 0 })
        .to(&channel)
        .publish()
        .await
        .expect("publish");
    wait_until("the first handler to block", WAIT, async || {
        seen.load(Ordering::SeqCst) == 1
    })
    .await;
    (app, publisher, channel, nodes)
}

/// Blocks on a gate until the test opens it.
#[derive(Clone)]
struct Gated {
    gate: Arc<Semaphore>,
    seen: Arc<AtomicUsize>,
}

impl Handle<Event> for Gated {
    async fn handle(&self, _: &Event, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.seen.fetch_add(1, Ordering::SeqCst);
        let _open = self.gate.acquire().await;
        Ok(())
    }
}

/// A handler at concurrency 1 held while a burst larger than fred's old 4,096-slot channel comes
/// in, with a read-ahead buffer of 4: the subscription stops reading its connection instead of
/// dropping, so every message is handled, none is counted as lagged and the connection was
/// never lost.
async fn a_slow_handler_loses_nothing_beyond_the_buffer(env: &Env) {
    let prometheus = prometheus();
    let gated = Gated {
        gate: Arc::new(Semaphore::new(0)),
        seen: Arc::default(),
    };
    let (app, publisher, channel, _) =
        held_at_first(env, "slow", gated.clone(), &gated.seen, 4).await;
    // The only handler is held: these wait in the buffer, the socket and Redis.
    const BURST: u32 = 6_000;
    let burst: Vec<Event> = (1..=BURST).map(|n| Event { n }).collect();
    publisher
        .messages(&burst)
        .to(&channel)
        .publish()
        .await
        .expect("publish");
    gated.gate.add_permits(usize::MAX >> 4);
    wait_until("every message handled", WAIT, async || {
        gated.seen.load(Ordering::SeqCst) == BURST as usize + 1
    })
    .await;
    stop(app).await;

    let text = prometheus.render();
    let label = format!("subscription=\"{channel}\"");
    let count = |name| sample(&text, name, &[&label]).unwrap_or(0.0);
    assert_eq!(
        count("ruststream_pubsub_lagged_total"),
        0.0,
        "nothing dropped"
    );
    assert_eq!(
        count("ruststream_pubsub_disconnects_total"),
        0.0,
        "Redis kept the subscriber: its output buffer held the rest"
    );
}

/// Lets the first message's handler wait for `release`; the others pass.
#[derive(Clone, Default)]
struct HoldFirst {
    release: Arc<tokio::sync::Notify>,
    seen: Arc<AtomicUsize>,
    last: Arc<std::sync::atomic::AtomicU32>,
}

impl Handle<Event> for HoldFirst {
    async fn handle(&self, e: &Event, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.seen.fetch_add(1, Ordering::SeqCst);
        self.last.store(e.n, Ordering::SeqCst);
        if e.n == 0 {
            self.release.notified().await;
        }
        Ok(())
    }
}

/// Shutdown while the only handler is held and messages wait unread in the socket: the stop
/// waits for the handler, not for the unread messages, and closes the connection.
async fn a_stop_with_unread_messages_is_bounded(env: &Env) {
    let hold = HoldFirst::default();
    let (app, publisher, channel, nodes) =
        held_at_first(env, "unread", hold.clone(), &hold.seen, 2).await;
    let burst: Vec<Event> = (1..=5_000).map(|n| Event { n }).collect();
    publisher
        .messages(&burst)
        .to(&channel)
        .publish()
        .await
        .expect("publish");
    let stopping = tokio::spawn(app.shutdown());
    // A head start for the stop, so that it begins while the handler is held (the assertions
    // hold either way: `notify_one` keeps its permit for a handler not waiting yet).
    tokio::time::sleep(Duration::from_millis(50)).await;
    hold.release.notify_one();
    bounded("the stop", Duration::from_secs(10), stopping)
        .await
        .expect("the stop task")
        .expect("the app stops");
    await_subscribers(&nodes, &env.key(&channel), 0).await;
    assert!(
        hold.seen.load(Ordering::SeqCst) < 5_001,
        "the stop did not wait for the unread messages"
    );
}

/// After its connection is killed, the subscription is sent again and messages flow. On a
/// server of its own, so that `CLIENT KILL TYPE pubsub` touches no other test.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_subscription_comes_back_after_its_connection_is_killed() {
    let stand = stand::Stand::start("stand_standalone");
    let url = stand.var("RUSTSTREAM_REDIS_URL");
    let prefix = format!("{}:", unique("reconnect"));
    let broker = RedisBroker::standalone(url.clone()).prefix(prefix.clone());
    let probe = Probe::acking();
    let app = start(app_with(&broker, RedisChannel::new("ev"), &probe)).await;
    let nodes = vec![stand::node_client(&url).await];
    let channel = format!("{prefix}ev");
    await_subscribers(&nodes, &channel, 1).await;

    let killed: i64 = nodes[0]
        .custom(fred::cmd!("CLIENT"), vec!["KILL", "TYPE", "pubsub"])
        .await
        .expect("CLIENT KILL");
    assert!(killed >= 1, "the subscriber connection was killed");
    await_subscribers(&nodes, &channel, 1).await;
    broker
        .publisher()
        .message(&Event { n: 5 })
        .to("ev")
        .publish()
        .await
        .expect("publish");
    wait_until("the message after the reconnect", WAIT, async || {
        probe.count() == 1
    })
    .await;
    stop(app).await;
    assert_eq!(probe.ns(), [5]);
}

/// A stalled handler lets Redis's output buffer for the subscriber grow past a tiny
/// `client-output-buffer-limit pubsub`: Redis disconnects it, which is logged and counted, and
/// the subscription comes back and delivers new messages. On a server of its own: the limit
/// would disconnect other tests' subscribers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disconnect_at_the_output_buffer_limit_is_counted_and_resubscribed() {
    let prometheus = prometheus();
    harness::logs::capture();
    let stand = stand::Stand::start("stand_standalone");
    let url = stand.var("RUSTSTREAM_REDIS_URL");
    let prefix = format!("{}:", unique("obuf"));
    let admin = stand::node_client(&url).await;
    let limit: Vec<String> = admin
        .custom(
            fred::cmd!("CONFIG"),
            vec!["GET", "client-output-buffer-limit"],
        )
        .await
        .expect("CONFIG GET");
    let _: () = admin
        .custom(
            fred::cmd!("CONFIG"),
            vec!["SET", "client-output-buffer-limit", "pubsub 256kb 128kb 1"],
        )
        .await
        .expect("CONFIG SET");
    let broker = RedisBroker::standalone(url.clone()).prefix(prefix.clone());
    let hold = HoldFirst::default();
    let handler = hold.clone();
    let source = RedisChannel::new("ev").concurrency(1).buffer(2);
    let app = RustStream::new(info()).with_broker(broker.clone(), move |b| {
        b.include(subscriber(source, handler).build());
    });
    let app = start(app).await;
    let nodes = vec![admin.clone()];
    let channel = format!("{prefix}ev");
    await_subscribers(&nodes, &channel, 1).await;
    broker
        .publisher()
        .message(&Event { n: 0 })
        .to("ev")
        .publish()
        .await
        .expect("publish");
    wait_until("the handler to stall", WAIT, async || {
        hold.seen.load(Ordering::SeqCst) == 1
    })
    .await;
    // 16 MB of raw payloads: more than the socket buffers take, so Redis's buffer grows.
    let pad = "x".repeat(8 * 1024);
    let label = "subscription=\"ev\"";
    let disconnects = || {
        sample(
            &prometheus.render(),
            "ruststream_pubsub_disconnects_total",
            &[label],
        )
        .unwrap_or(0.0)
    };
    // Until Redis drops the subscriber (it has no subscriber left then).
    for n in 1..=4_000 {
        let value = format!("{{\"n\":{n},\"pad\":\"{pad}\"}}");
        let _: i64 = admin.publish(&channel, value).await.expect("PUBLISH");
        if n % 20 == 0 && numsub(&nodes, &channel).await == 0 {
            break;
        }
    }
    assert_eq!(
        numsub(&nodes, &channel).await,
        0,
        "Redis disconnected the stalled subscriber at its output buffer limit"
    );
    hold.release.notify_one();
    wait_until("the disconnect counted", WAIT, async || {
        disconnects() >= 1.0
    })
    .await;
    let lost = harness::logs::events(
        "pub/sub connection lost: messages published until it is subscribed again are lost; subscribing again",
        "subscription",
        "ev",
    );
    assert!(!lost.is_empty(), "the disconnect is logged");
    assert_eq!(
        lost[0].fields.get("behind").map(String::as_str),
        Some("true")
    );
    await_subscribers(&nodes, &channel, 1).await;
    let _: () = admin
        .custom(
            fred::cmd!("CONFIG"),
            vec!["SET", "client-output-buffer-limit", limit[1].as_str()],
        )
        .await
        .expect("CONFIG SET back");
    broker
        .publisher()
        .message(&Event { n: 9_999 })
        .to("ev")
        .publish()
        .await
        .expect("publish");
    wait_until("a new message after the resubscribe", WAIT, async || {
        hold.last.load(Ordering::SeqCst) == 9_999
    })
    .await;
    assert!(
        !harness::logs::events("pub/sub subscribed again", "subscription", "ev").is_empty(),
        "the resubscribe is logged"
    );
    let delivered = hold.seen.load(Ordering::SeqCst);
    stop(app).await;
    assert!(delivered >= 2, "{delivered}");
}

/// An app subscribed to `ev` on `broker` gets a message published once it is subscribed
/// (published again until it arrives: Pub/Sub keeps nothing for a subscriber not there yet).
async fn delivers_on(broker: RedisBroker) {
    let probe = Probe::acking();
    let app = start(app_with(&broker, RedisChannel::new("ev"), &probe)).await;
    wait_until("a message delivered", WAIT, async || {
        broker
            .publisher()
            .message(&Event { n: 1 })
            .to("ev")
            .publish()
            .await
            .expect("publish");
        probe.count() > 0
    })
    .await;
    stop(app).await;
    assert!(probe.ns().iter().all(|&n| n == 1));
}

/// The subscription's own connection speaks TLS with the broker's private CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_works_over_tls() {
    let (Some(url), Some(ca)) = (
        harness::stand_var("RUSTSTREAM_TLS_URL"),
        harness::stand_var("RUSTSTREAM_TLS_CA"),
    ) else {
        return;
    };
    let prefix = format!("{}:", unique("pstls"));
    delivers_on(RedisBroker::standalone(url).tls_ca_file(&ca).prefix(prefix)).await;
}

/// The subscription's own connection goes to the primary the sentinels name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_works_through_sentinels() {
    let (Some(service), Some(hosts)) = (
        harness::stand_var("RUSTSTREAM_SENTINEL_SERVICE"),
        harness::stand_var("RUSTSTREAM_SENTINEL_HOSTS"),
    ) else {
        return;
    };
    let hosts: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    let prefix = format!("{}:", unique("pssentinel"));
    delivers_on(RedisBroker::sentinel(service, hosts).prefix(prefix)).await;
}

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
    let schema: serde_json::Value = serde_json::from_str(include_str!("../asyncapi/3.0.0.json"))
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
