//! Durable publishes: `.durable(replicas, timeout)` on a publish or a destination's
//! route returns `Ok` only once that many replicas hold the write (`WAIT` on the connection
//! that wrote); fewer is `Error::NotDurable` naming how many did. The stand's standalone server
//! has no replica (a durable publish there fails, and its message is on the primary); each
//! cluster master has one (it succeeds); the model has none and acknowledges at once, as a
//! server with the asked replicas would. A retry with an id and a unique window enqueues
//! nothing twice.

use crate::harness;

use std::time::Duration;

use fred::prelude::StreamsInterface as _;
use harness::{Env, on};
use ruststream::prelude::*;
use ruststream::redis::error::PubSubError;
use ruststream::{Enqueued, Error, list, stream};

on!(
    [memory, standalone, cluster] a_durable_publish_waits_for_its_replicas,
    a_retried_durable_publish_with_an_id_enqueues_once,
    a_durable_route_covers_plain_publishes,
    a_durable_stream_publish_waits_for_its_replicas,
);

on!([memory, standalone] a_durable_publish_to_a_channel_is_refused);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

/// Long enough for a loaded machine's replica to answer, short for a server without one.
const TIMEOUT: Duration = Duration::from_millis(2000);
const SHORT: Duration = Duration::from_millis(50);

/// Whether the topology has a replica for every key: the cluster's masters do; the model
/// answers as if.
fn has_replica(env: &Env) -> bool {
    env.is_memory() || env.is_cluster()
}

async fn publish(env: &Env, to: &str, durable: (u32, Duration)) -> ruststream::Result<Enqueued> {
    env.broker()
        .publisher()
        .message(&Job { n: 1 })
        .to(to)
        .durable(durable.0, durable.1)
        .publish()
        .await
}

fn not_durable(r: ruststream::Result<Enqueued>) -> (u32, u32) {
    match r {
        Err(Error::NotDurable { asked, acked }) => (asked, acked),
        other => panic!("expected NotDurable, got {other:?}"),
    }
}

async fn a_durable_publish_waits_for_its_replicas(env: &Env) {
    env.broker().connect().await.expect("connect");
    let q = "{dq}";
    if has_replica(env) {
        let done = publish(env, q, (1, TIMEOUT))
            .await
            .expect("one replica has it");
        assert!(done.is_enqueued());
    } else {
        let (asked, acked) = not_durable(publish(env, q, (1, SHORT)).await);
        assert_eq!(
            (asked, acked),
            (1, 0),
            "the standalone server has no replica"
        );
    }
    // More replicas than any topology has: never Ok.
    let (asked, acked) = match publish(env, q, (5, SHORT)).await {
        r if env.is_memory() => {
            r.expect("the model acknowledges any count");
            (5, 5)
        }
        r => not_durable(r),
    };
    assert_eq!(asked, 5);
    assert!(env.is_memory() || acked <= 1, "acked {acked}");
    // Zero replicas asked: nothing to wait for.
    publish(env, q, (0, SHORT)).await.expect("no replica asked");
    // Every publish landed on the primary, acknowledged or not.
    assert_eq!(env.llen(q).await, 3);
}

async fn a_retried_durable_publish_with_an_id_enqueues_once(env: &Env) {
    env.broker().connect().await.expect("connect");
    let q = "{dr}";
    let send = |replicas: u32, timeout: Duration| async move {
        env.broker()
            .publisher()
            .message(&Job { n: 7 })
            .to(q)
            .id("order-7")
            .unique_for(Duration::from_secs(60))
            .durable(replicas, timeout)
            .publish()
            .await
    };
    let replicas = u32::from(has_replica(env));
    let first = send(1, if has_replica(env) { TIMEOUT } else { SHORT }).await;
    match &first {
        Ok(e) => assert!(e.is_enqueued() && has_replica(env), "{e:?}"),
        Err(Error::NotDurable { asked: 1, acked: 0 }) => assert!(!has_replica(env)),
        Err(e) => panic!("unexpected {e}"),
    }
    // The caller does not know whether the first landed: it retries, twice.
    for _ in 0..2 {
        let again = send(replicas, TIMEOUT).await.expect("the retry is durable");
        assert_eq!(
            again.duplicates, 1,
            "the retry found the first one's window"
        );
        assert_eq!(again.enqueued, 0);
    }
    assert_eq!(env.llen(q).await, 1, "the message is enqueued once");
}

async fn a_durable_route_covers_plain_publishes(env: &Env) {
    let q = "{droute}";
    let replicas = if has_replica(env) { 1 } else { 2 };
    let broker = env.broker_with(|b| b.route(q, list::Publish::new().durable(replicas, TIMEOUT)));
    broker.connect().await.expect("connect");
    let r = broker
        .publisher()
        .messages(&[Job { n: 1 }, Job { n: 2 }])
        .to(q)
        .publish()
        .await;
    if has_replica(env) {
        assert_eq!(r.expect("durable by its route").enqueued, 2);
    } else {
        assert_eq!(not_durable(r), (2, 0));
    }
    // A publish's own durability overrides the route's.
    broker
        .publisher()
        .message(&Job { n: 3 })
        .to(q)
        .durable(0, SHORT)
        .publish()
        .await
        .expect("no replica asked by the publish itself");
    assert_eq!(env.llen(q).await, 3);
}

async fn a_durable_stream_publish_waits_for_its_replicas(env: &Env) {
    let s = "{dstream}";
    let broker = env.broker_with(|b| b.route(s, stream::Publish::new().maxlen(100)));
    broker.connect().await.expect("connect");
    let r = broker
        .publisher()
        .message(&Job { n: 1 })
        .to(s)
        .durable(1, if has_replica(env) { TIMEOUT } else { SHORT })
        .publish()
        .await;
    if has_replica(env) {
        assert!(r.expect("a replica has it").is_enqueued());
    } else {
        assert_eq!(not_durable(r), (1, 0));
    }
    let len: i64 = env.client.xlen(env.key(s)).await.expect("XLEN");
    assert_eq!(len, 1);
}

async fn a_durable_publish_to_a_channel_is_refused(env: &Env) {
    let broker = env.broker_with(|b| b.route("news", ruststream::pubsub::Publish::new()));
    broker.connect().await.expect("connect");
    let r = broker
        .publisher()
        .message(&Job { n: 1 })
        .to("news")
        .durable(1, SHORT)
        .publish()
        .await;
    let e = r.expect_err("pub/sub stores nothing to replicate");
    assert!(
        matches!(
            harness::pubsub_refusal(&e),
            PubSubError::CannotBeDurable { channel } if channel == "news"
        ),
        "{e}"
    );
    assert!(e.to_string().contains("without .durable"), "{e}");
}

/// The stand's sentinel set: a primary with one replica, found through the sentinels.
#[tokio::test]
async fn through_sentinels_the_replica_acknowledges_a_durable_publish() {
    let Some((service, hosts)) = harness::sentinel_stand() else {
        return;
    };
    let prefix = format!("{}:", harness::unique("dsent"));
    let broker = RedisBroker::sentinel(service, hosts).prefix(&prefix);
    broker
        .connect()
        .await
        .expect("connect through the sentinels");
    let publisher = broker.publisher();
    for n in 0..20 {
        let done = publisher
            .message(&Job { n })
            .to("{ds}")
            .durable(1, TIMEOUT)
            .publish()
            .await
            .expect("the replica acknowledges");
        assert!(done.is_enqueued());
    }
    let (asked, acked) = not_durable(
        publisher
            .message(&Job { n: 99 })
            .to("{ds}")
            .durable(2, SHORT)
            .publish()
            .await,
    );
    assert_eq!((asked, acked), (2, 1), "one replica of two asked");
}

/// `TestApp`: a durable publish, and a durable route, are acknowledged at once (the model has
/// no replicas and answers as a server with the asked ones), and the handler gets the message.
#[tokio::test(start_paused = true)]
async fn on_testapp_a_durable_publish_is_acknowledged_at_once() -> ruststream::Result<()> {
    use ruststream::testing::TestApp;
    let app = RustStream::new(AppInfo::new("durable", "0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379")
            .prefix("t:")
            .route("{replies}", list::Publish::new().durable(3, TIMEOUT)),
        |b| {
            b.include(
                ruststream::subscriber(
                    RedisList::new("{jobs}").reliable(),
                    harness::Seen::<Job>::acking(),
                )
                .build(),
            );
        },
    );
    let tb = TestApp::start(app).await?;
    let broker = tb.broker::<RedisBroker>();
    let done = broker
        .message(&Job { n: 5 })
        .to("{jobs}")
        .durable(2, TIMEOUT)
        .publish()
        .await?;
    assert!(done.is_enqueued());
    broker
        .message(&Job { n: 6 })
        .to("{replies}")
        .publish()
        .await?;
    broker
        .subscriber("{jobs}")
        .assert_called_once()
        .with(&Job { n: 5 });
    broker
        .published::<Job>("{replies}")
        .assert_called_once()
        .with(&Job { n: 6 });
    tb.shutdown().await
}
