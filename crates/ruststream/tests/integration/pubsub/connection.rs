//! A subscription's connection: backpressure (a slow handler loses nothing beyond its buffer), a
//! bounded stop with unread messages, the subscription back after its connection is killed, a
//! disconnect at Redis's output-buffer limit counted and resubscribed, and TLS and sentinels.

use crate::harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fred::prelude::*;
use harness::metrics::{prometheus, sample};
use harness::{Env, WAIT, bounded, on, stand, start, stop, unique, wait_until};
use ruststream::prelude::*;
use tokio::sync::Semaphore;

use super::{Event, Probe, app_with, await_subscribers, info, numsub, publish_event};

// Not on the model: backpressure is a Redis connection's (the model's feed is a broadcast).
on!([standalone, cluster] multi_thread:
    a_slow_handler_loses_nothing_beyond_the_buffer,
    a_stop_with_unread_messages_is_bounded,
);

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
    publish_event(&broker, "ev", 5).await;
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
    publish_event(&broker, "ev", 0).await;
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
    publish_event(&broker, "ev", 9_999).await;
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
        publish_event(&broker, "ev", 1).await;
        probe.count() > 0
    })
    .await;
    stop(app).await;
    assert!(probe.ns().iter().all(|&n| n == 1));
}

/// The subscription's own connection speaks TLS with the broker's private CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_works_over_tls() {
    let Some((url, ca)) = harness::tls_stand() else {
        return;
    };
    let prefix = format!("{}:", unique("pstls"));
    delivers_on(RedisBroker::standalone(url).tls_ca_file(&ca).prefix(prefix)).await;
}

/// The subscription's own connection goes to the primary the sentinels name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_works_through_sentinels() {
    let Some((service, hosts)) = harness::sentinel_stand() else {
        return;
    };
    let prefix = format!("{}:", unique("pssentinel"));
    delivers_on(RedisBroker::sentinel(service, hosts).prefix(prefix)).await;
}
