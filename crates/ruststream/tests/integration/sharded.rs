//! Sharded Pub/Sub (`RedisChannel::sharded`: `SSUBSCRIBE`, `SPUBLISH`) on the in-memory model,
//! the standalone server and the cluster (see `harness`), under `TestApp`, and through a
//! failover of the primary owning a channel's slot on the stand's cluster.
//!
//! A test publishes only once its subscription is active (`PUBSUB SHARDNUMSUB` summed over
//! every node); every wait is bounded. The failover test changes which node is primary for a
//! third of the slots, so it holds [`TOPOLOGY`] for writing while the other cluster tests of
//! this binary hold it for reading; it waits for a healthy cluster (every slot covered, every
//! node agreeing on the new owner) before it ends.

use crate::harness;

use std::time::Duration;

use fred::bytes::Bytes;
use fred::prelude::*;
use harness::{Env, Topology, WAIT, bounded, on, stand};
use ruststream::RunningApp;
use ruststream::prelude::*;
use ruststream::redis::operate::Select;
use ruststream::testing::TestApp;
use tokio::sync::{RwLock, RwLockReadGuard};

on!([memory, memory_cluster, standalone, cluster] multi_thread:
    sharded_channels_in_different_slots_all_deliver,
    a_plain_subscriber_does_not_get_an_spublish,
    a_drop_lands_in_the_dead_letter_list,
);
on!([standalone, cluster] multi_thread: a_requeued_dead_letter_goes_out_with_spublish);
on!([memory, memory_cluster, cluster] config_errors_are_refused_at_startup);
on!([cluster] multi_thread: delivery_resumes_after_a_failover_of_the_slot_owner);

/// Taken for writing by the failover test, for reading by every other cluster test here.
static TOPOLOGY: RwLock<()> = RwLock::const_new(());

/// A read hold on [`TOPOLOGY`] on the stand's cluster; `None` elsewhere.
async fn steady(env: &Env) -> Option<RwLockReadGuard<'static, ()>> {
    match env.topology {
        Topology::Cluster => Some(TOPOLOGY.read().await),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Order {
    n: u32,
}

outgoing!(Order);

/// One delivery: the order's number, the channel it came on, its attempt and dead history.
type Got = (u32, String, u32, Option<String>);

/// The harness's recorder of every delivery.
type Recorder = harness::Seen<Order>;

impl Recorder {
    /// Drops the orders `drops` says, acks the others.
    fn dropping(drops: fn(u32) -> bool) -> Self {
        Self::deciding(move |o, _, _| {
            if drops(o.n) {
                harness::settle(HandlerOutcome::drop())
            } else {
                harness::ack()
            }
        })
    }

    fn got(&self) -> Vec<Got> {
        let seen = self.seen();
        seen.iter()
            .map(|d| {
                let history = d.header("dead-history").map(str::to_owned);
                (d.n, d.source.clone(), d.attempt, history)
            })
            .collect()
    }

    /// The numbers received on `channel`, sorted.
    fn numbers_on(&self, channel: &str) -> Vec<u32> {
        let mut ns: Vec<u32> = self
            .got()
            .into_iter()
            .filter(|g| g.1 == channel)
            .map(|g| g.0)
            .collect();
        ns.sort_unstable();
        ns
    }
}

/// Starts an app with one sharded subscription per channel, all recorded by `rec`.
async fn sharded_app(env: &Env, channels: &[String], rec: &Recorder) -> RunningApp {
    let app = env.app(|b| {
        for c in channels {
            b.include(subscriber(RedisChannel::sharded(c.clone()), rec.clone()).build());
        }
    });
    env.start(app).await
}

/// `PUBSUB <sub> channel` summed over every node (a sharded subscriber may sit on a replica).
async fn subscribers(env: &Env, sub: &str, channel: &str) -> i64 {
    let mut total = 0;
    for node in env.node_clients().await {
        let reply: Vec<Value> = node
            .custom(fred::cmd!("PUBSUB"), vec![sub, &env.key(channel)])
            .await
            .expect("PUBSUB");
        total += reply.get(1).and_then(Value::as_i64).unwrap_or(0);
    }
    total
}

async fn await_sharded_subscribers(env: &Env, channel: &str, n: i64) {
    env.eventually(&format!("{n} SSUBSCRIBErs of {channel}"), async || {
        subscribers(env, "SHARDNUMSUB", channel).await == n
    })
    .await;
}

/// Publishes orders `ns` to `channel` with `broker`'s publisher, one batch.
async fn publish(broker: &RedisBroker, channel: &str, ns: impl Iterator<Item = u32>) {
    let orders: Vec<Order> = ns.map(|n| Order { n }).collect();
    broker
        .publisher()
        .messages(&orders)
        .to(channel)
        .publish()
        .await
        .expect("publish");
}

/// The first channel named `orders-N` in each third of the slot range: on the stand's cluster,
/// one per primary (`redis-cli --cluster create` splits the slots evenly).
fn channels_in_three_slot_ranges(env: &Env) -> Vec<String> {
    (0..3u16)
        .map(|third| {
            (0..)
                .map(|i| format!("orders-{i}"))
                .find(|c| fred::util::redis_keyslot(env.key(c).as_bytes()) / 5462 == third)
                .expect("a channel in every third")
        })
        .collect()
}

// 1 ------------------------------------------------------------------------------------------

async fn sharded_channels_in_different_slots_all_deliver(env: &Env) {
    let _steady = steady(env).await;
    let channels = channels_in_three_slot_ranges(env);
    let rec = Recorder::default();
    let app = sharded_app(env, &channels, &rec).await;
    for c in &channels {
        await_sharded_subscribers(env, c, 1).await;
    }
    // The app's publisher SPUBLISHes to a channel its sharded subscription reads; a
    // producer-only process says so with a route.
    let producer = channels.iter().fold(env.broker_with(|b| b), |b, c| {
        b.route(c.clone(), pubsub::Publish::sharded())
    });
    for c in &channels {
        publish(&env.broker(), c, 0..10).await;
        publish(&producer, c, 10..20).await;
    }
    env.eventually("20 orders on each channel", async || rec.got().len() >= 60)
        .await;
    env.stop(app).await;

    let all: Vec<u32> = (0..20).collect();
    for c in &channels {
        assert_eq!(rec.numbers_on(c), all, "each order once, on `{c}`");
    }
    assert!(rec.got().iter().all(|g| g.2 == 1), "attempt 1");
    assert!(env.keys().await.is_empty(), "left: {:?}", env.keys().await);
}

// 2 ------------------------------------------------------------------------------------------

/// `PUBLISH` and `SPUBLISH` are distinct: each kind of subscriber gets its own kind only.
async fn a_plain_subscriber_does_not_get_an_spublish(env: &Env) {
    let _steady = steady(env).await;
    let (plain, sharded) = (Recorder::default(), Recorder::default());
    let plain_app = env
        .start_with(|b| {
            b.include(subscriber(RedisChannel::new("ev"), plain.clone()).build());
        })
        .await;
    let sharded_app = sharded_app(env, &["ev".to_owned()], &sharded).await;
    env.eventually("a SUBSCRIBEr of ev", async || {
        subscribers(env, "NUMSUB", "ev").await == 1
    })
    .await;
    await_sharded_subscribers(env, "ev", 1).await;

    // Each kind's message for the other goes out first: by the time a subscriber has its own,
    // the other kind's would have come.
    let spublisher = env.broker_with(|b| b.route("ev", pubsub::Publish::sharded()));
    let publisher = env.broker_with(|b| b.route("ev", pubsub::Publish::new()));
    publish(&spublisher, "ev", [1].into_iter()).await;
    publish(&publisher, "ev", [2].into_iter()).await;
    publish(&spublisher, "ev", [3].into_iter()).await;
    env.eventually("each subscriber's own messages", async || {
        plain.numbers_on("ev").contains(&2) && sharded.numbers_on("ev").contains(&3)
    })
    .await;
    env.stop(plain_app).await;
    env.stop(sharded_app).await;

    assert_eq!(plain.numbers_on("ev"), [2], "SUBSCRIBE gets PUBLISH only");
    assert_eq!(
        sharded.numbers_on("ev"),
        [1, 3],
        "SSUBSCRIBE gets SPUBLISH only"
    );
}

// 3 ------------------------------------------------------------------------------------------

async fn a_drop_lands_in_the_dead_letter_list(env: &Env) {
    let _steady = steady(env).await;
    let rec = Recorder::dropping(|n| n == 1);
    let app = sharded_app(env, &["orders".to_owned()], &rec).await;
    await_sharded_subscribers(env, "orders", 1).await;
    publish(&env.broker(), "orders", 1..=2).await;
    let dead = if env.is_cluster() {
        format!("{{{}}}.dead", env.key("orders"))
    } else {
        env.key("orders.dead")
    };
    env.eventually("one dead letter", async || {
        env.client.llen::<i64, _>(&dead).await.expect("LLEN") == 1
    })
    .await;
    env.eventually("both handled", async || rec.got().len() == 2)
        .await;
    env.stop(app).await;

    let letters: Vec<Bytes> = env.client.lrange(&dead, 0, -1).await.expect("LRANGE");
    let frame = ruststream::redis::frame::Frame::decode(letters[0].clone());
    assert_eq!(
        frame.headers.get("reason").map(String::as_str),
        Some("dropped")
    );
    assert_eq!(frame.payload, Bytes::from_static(br#"{"n":1}"#));
    assert!(!env.exists("orders").await, "a channel stores nothing");
}

// 4 ------------------------------------------------------------------------------------------

/// `requeue` sends a sharded channel's dead letter out again with `SPUBLISH` (attempt 1, the
/// reason in `dead-history`), and `inspect` says the subscription is sharded.
async fn a_requeued_dead_letter_goes_out_with_spublish(env: &Env) {
    let _steady = steady(env).await;
    // Drops the first delivery of 7, acks the requeued one.
    let rec = Recorder::deciding(|o, _, i| {
        if o.n == 7 && i == 0 {
            harness::settle(HandlerOutcome::drop())
        } else {
            harness::ack()
        }
    });
    let mount = |b: &mut ruststream::Mount<RedisBroker>| {
        b.include(subscriber(RedisChannel::sharded("orders"), rec.clone()).build());
    };
    let op = ruststream::operate::operators(&env.app(mount))
        .pop()
        .expect("a Redis operator");
    op.connect().await.expect("the operator connects");
    let app = env.start_with(mount).await;
    await_sharded_subscribers(env, "orders", 1).await;
    publish(&env.broker(), "orders", [7].into_iter()).await;
    env.eventually("the dead letter", async || {
        op.dead_letters("orders", 10)
            .await
            .expect("dead letters")
            .len()
            == 1
    })
    .await;

    let seen = op.inspect(Some("orders")).await.expect("inspect");
    assert_eq!(seen[0].keys.transport, "pubsub");
    assert_eq!(seen[0].keys.mode, "sharded");
    assert_eq!(
        seen[0].subscribers,
        Some(1),
        "SHARDNUMSUB on the slot's owner"
    );

    let moved = op
        .requeue("orders", &Select::All { limit: None })
        .await
        .expect("requeue");
    assert_eq!(moved, 1);
    env.eventually("the requeued order", async || rec.got().len() == 2)
        .await;
    assert!(
        op.dead_letters("orders", 10)
            .await
            .expect("dead letters")
            .is_empty()
    );
    env.stop(app).await;
    let again = &rec.got()[1];
    assert_eq!((again.0, again.2), (7, 1), "attempt 1 again");
    assert_eq!(
        again.3.as_deref(),
        Some("dropped"),
        "the reason went to dead-history"
    );
}

// 5 ------------------------------------------------------------------------------------------

async fn config_errors_are_refused_at_startup(env: &Env) {
    let refused = |source: RedisChannel| {
        let app = env.app(move |b| {
            b.include(subscriber(source, Recorder::default()).build());
        });
        env.refusal(app)
    };
    let e = refused(RedisChannel::sharded("orders.*")).await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("sharded channel", Some("orders.*"))
    );
    assert!(e.problem.contains("no sharded pattern subscription"), "{e}");
    if env.is_cluster() {
        let e = refused(RedisChannel::sharded("orders").dead_letter("failed")).await;
        assert_eq!(
            (e.option.as_ref(), e.subject.as_deref()),
            ("dead_letter", Some("orders"))
        );
        assert!(e.problem.contains("different hash slots"), "{e}");
        let tagged = RedisChannel::sharded("{o}.orders").dead_letter("{o}.failed");
        let app = env.start_with(|b| {
            b.include(subscriber(tagged, Recorder::default()).build());
        });
        env.stop(app.await).await;
    }
}

// 6 ------------------------------------------------------------------------------------------

/// Fails the slot's primary over to a replica; publishes until one message comes through (the
/// subscription renews its `SSUBSCRIBE`), then a fresh batch must all arrive. The cluster is
/// left healthy, with the replica as the shard's primary (failing back at once is refused: see
/// `fail_over`).
async fn delivery_resumes_after_a_failover_of_the_slot_owner(env: &Env) {
    let _exclusive = TOPOLOGY.write().await;
    let rec = Recorder::default();
    let app = sharded_app(env, &["orders".to_owned()], &rec).await;
    await_sharded_subscribers(env, "orders", 1).await;
    publish(&env.broker(), "orders", [0].into_iter()).await;
    env.eventually("the first order", async || rec.got().len() == 1)
        .await;

    let slot = fred::util::redis_keyslot(env.key("orders").as_bytes());
    let (primary, replica) = shard_of(env, slot).await;
    fail_over(env, &replica, &primary, slot).await;
    assert_delivery_resumes(env, &rec, 1000).await;

    env.stop(app).await;
}

/// Publishes `from`, `from + 1`, ... until one arrives (bounded), then a fresh batch of 20 that
/// must all arrive.
async fn assert_delivery_resumes(env: &Env, rec: &Recorder, from: u32) {
    let mut n = from;
    env.eventually("a message after the failover", async || {
        if rec.got().iter().any(|g| g.0 >= from) {
            return true;
        }
        publish(&env.broker(), "orders", [n].into_iter()).await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
        false
    })
    .await;
    let batch = (from + 500)..(from + 520);
    publish(&env.broker(), "orders", batch.clone()).await;
    env.eventually("the fresh batch", async || {
        let got = rec.numbers_on("orders");
        batch.clone().all(|n| got.contains(&n))
    })
    .await;
}

/// The addresses (`host:port`) of the primary owning `slot` and of one of its replicas.
async fn shard_of(env: &Env, slot: u16) -> (String, String) {
    let nodes = cluster_nodes(&env.client).await;
    let owner = nodes
        .iter()
        .find(|n| n.primary && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
        .expect("a primary owns the slot");
    let replica = nodes
        .iter()
        .find(|n| n.replica_of.as_deref() == Some(owner.id.as_str()))
        .expect("the owner has a replica");
    (owner.addr.clone(), replica.addr.clone())
}

/// Sends `CLUSTER FAILOVER` to `replica`, then waits until it is primary, every node sees it own
/// `slot`, every node's cluster state is ok and `old` is its replica with a live link. Sends it
/// again when that does not happen within [`WAIT`]: a primary that voted for a failover of the
/// same shard shortly before refuses its vote, and the election is lost.
async fn fail_over(env: &Env, replica: &str, old: &str, slot: u16) {
    let promoted = stand::node_client(replica).await;
    let demoted = stand::node_client(old).await;
    let all = env.node_clients().await;
    let healthy = async || {
        let mut ok = info(&promoted, "replication").await.contains("role:master")
            && info(&demoted, "replication")
                .await
                .contains("master_link_status:up");
        for node in &all {
            let state: String = node
                .custom(fred::cmd!("CLUSTER"), vec!["INFO"])
                .await
                .unwrap_or_default();
            let owner = cluster_nodes(node)
                .await
                .into_iter()
                .find(|n| n.primary && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)));
            ok &= state.contains("cluster_state:ok") && owner.is_some_and(|n| n.addr == replica);
        }
        ok
    };
    bounded("the failover, and a healthy cluster", WAIT * 6, async {
        loop {
            let () = promoted
                .custom(fred::cmd!("CLUSTER"), vec!["FAILOVER"])
                .await
                .expect("CLUSTER FAILOVER");
            let settled = tokio::time::timeout(WAIT, async {
                while !healthy().await {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
            if settled.await.is_ok() {
                return;
            }
        }
    })
    .await;
}

async fn info(node: &Client, section: &str) -> String {
    node.custom(fred::cmd!("INFO"), vec![section])
        .await
        .unwrap_or_default()
}

/// One line of `CLUSTER NODES`.
struct Node {
    id: String,
    addr: String,
    primary: bool,
    replica_of: Option<String>,
    slots: Vec<(u16, u16)>,
}

async fn cluster_nodes(client: &Client) -> Vec<Node> {
    let text: String = client
        .custom(fred::cmd!("CLUSTER"), vec!["NODES"])
        .await
        .unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let flags = f.get(2)?;
            let range = |r: &str| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                Some((a.parse().ok()?, b.parse().ok()?))
            };
            Some(Node {
                id: f[0].to_owned(),
                addr: f.get(1)?.split('@').next()?.to_owned(),
                primary: flags.contains("master") && !flags.contains("fail"),
                replica_of: flags
                    .contains("slave")
                    .then(|| f.get(3).map(|s| (*s).to_owned()))
                    .flatten(),
                slots: f.iter().skip(8).filter_map(|r| range(r)).collect(),
            })
        })
        .collect()
}

// TestApp ------------------------------------------------------------------------------------

fn test_app(rec: &Recorder) -> RustStream {
    let rec = rec.clone();
    RustStream::new(AppInfo::new("sharded-test", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379").prefix("t:"),
        move |b| {
            b.include(subscriber(RedisChannel::sharded("orders"), rec).build());
        },
    )
}

#[tokio::test(start_paused = true)]
async fn testapp_spublish_reaches_ssubscribe_and_survives_a_moved_slot() -> ruststream::Result<()> {
    let rec = Recorder::default();
    let tb = TestApp::start(test_app(&rec)).await?;
    let b = tb.broker::<RedisBroker>();
    b.message(&Order { n: 1 }).to("orders").publish().await?;
    b.subscriber("orders")
        .assert_called_once()
        .with(&Order { n: 1 })
        .settled(HandlerOutcome::ack());
    b.published::<Order>("orders").assert_called_once();

    // A plain PUBLISH on the channel is not for an SSUBSCRIBEr.
    let redis = b.client().await?;
    let count: i64 = redis
        .publish("t:orders", r#"{"n":2}"#)
        .await
        .map_err(ruststream::redis::error::core)?;
    assert_eq!(count, 0, "no SUBSCRIBEr");
    tb.settle().await?;
    b.subscriber("orders").assert_called_once();

    // The slot moves: the model ends the subscription (SUNSUBSCRIBE), the app subscribes again.
    assert_eq!(tb.model().fail_over_slot_of("t:orders"), 1);
    tb.settle().await?;
    let numsub: Vec<Value> = redis
        .custom(fred::cmd!("PUBSUB"), vec!["SHARDNUMSUB", "t:orders"])
        .await
        .map_err(ruststream::redis::error::core)?;
    assert_eq!(
        numsub.get(1).and_then(Value::as_i64),
        Some(1),
        "subscribed again"
    );
    b.message(&Order { n: 3 }).to("orders").publish().await?;
    b.subscriber("orders").assert_called(2);
    assert_eq!(rec.numbers_on("orders"), [1, 3]);
    tb.shutdown().await
}

#[test]
fn the_asyncapi_document_says_sharded() {
    let app = test_app(&Recorder::default());
    let doc = ruststream::asyncapi::document(&app);
    let orders = doc["channels"]
        .as_object()
        .and_then(|c| c.values().find(|c| c["address"] == "orders"))
        .unwrap_or_else(|| panic!("the channel: {doc:#}"));
    assert_eq!(orders["x-redis-transport"], "pubsub");
    assert_eq!(orders["x-redis"]["subscribe"], "sharded");
}
