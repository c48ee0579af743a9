//! `RedisStream::trim_acked`, which drops only what every group has acknowledged: on the model,
//! the standalone server and the cluster, and as `TestApp` tests (with `stream::Publish::maxlen`).

use crate::harness;

use std::collections::HashSet;
use std::time::Duration;

use fred::prelude::*;
use fred::types::ClusterHash;
use harness::{Env, on};
use ruststream::RunningApp;
use ruststream::prelude::*;
use ruststream::stream;
use ruststream::testing::TestApp;

use super::{KEY, Worker, app_of, group_create, ids_of, jobs, parse_id, slack, stream_ids, xlen};

on!(
    [memory, standalone, cluster] multi_thread:
    trim_acked_never_drops_a_pending_or_unread_entry,
    a_group_that_read_nothing_keeps_the_whole_stream,
);

// -- trim_acked --------------------------------------------------------------------------------

const PERIOD: Duration = Duration::from_millis(50);

/// The group's `(pending ids, last-delivered id)`.
async fn group_state(env: &Env, group: &str) -> (Vec<(u64, u64)>, (u64, u64)) {
    let pending = env
        .cmd(
            "XPENDING",
            vec![
                env.key(KEY).into(),
                group.into(),
                "-".into(),
                "+".into(),
                100_000.into(),
            ],
        )
        .await
        .expect("XPENDING");
    let groups: Value = env
        .client
        .custom(
            fred::cmd!("XINFO", hash: ClusterHash::from(env.key(KEY).as_str())),
            vec!["GROUPS", &env.key(KEY)],
        )
        .await
        .expect("XINFO GROUPS");
    let text = format!("{groups:?}");
    let Value::Array(groups) = groups else {
        panic!("XINFO GROUPS: {text}")
    };
    let last = groups
        .into_iter()
        .find_map(|g| {
            let Value::Array(f) = g else { return None };
            let field = |name: &str| {
                f.chunks(2)
                    .find(|p| p[0].as_string().as_deref() == Some(name))
                    .and_then(|p| p[1].as_string())
            };
            (field("name").as_deref() == Some(group))
                .then(|| field("last-delivered-id"))
                .flatten()
        })
        .unwrap_or_else(|| panic!("group {group} in {text}"));
    (ids_of(pending), parse_id(&last))
}

/// Reads up to `count` new entries for the hand-driven group `group`; their ids.
async fn read_group(env: &Env, group: &str, count: usize) -> Vec<(u64, u64)> {
    if count == 0 {
        return Vec::new();
    }
    let key = env.key(KEY);
    let args: Vec<Value> = vec![
        "GROUP".into(),
        group.into(),
        "hand".into(),
        "COUNT".into(),
        i64::try_from(count).expect("count").into(),
        "STREAMS".into(),
        key.as_str().into(),
        ">".into(),
    ];
    let reply: Value = env
        .client
        .custom(
            fred::cmd!("XREADGROUP", hash: ClusterHash::from(key.as_str())),
            args,
        )
        .await
        .expect("XREADGROUP");
    match reply {
        Value::Array(mut streams) if !streams.is_empty() => match streams.swap_remove(0) {
            Value::Array(mut kv) if kv.len() == 2 => ids_of(kv.swap_remove(1)),
            _ => Vec::new(),
        },
        Value::Map(m) => m.inner().into_values().flat_map(ids_of).collect(),
        _ => Vec::new(),
    }
}

async fn ack(env: &Env, group: &str, ids: &[(u64, u64)]) {
    if ids.is_empty() {
        return;
    }
    let mut args: Vec<Value> = vec![env.key(KEY).into(), group.into()];
    args.extend(
        ids.iter()
            .map(|(ms, seq)| Value::from(format!("{ms}-{seq}"))),
    );
    let _: Value = env.cmd("XACK", args).await.expect("XACK");
}

/// Checks what the hand-driven group `slow` needs is all there, and returns the lowest id it
/// needs.
async fn check_kept(env: &Env, read: usize, published: usize) -> (u64, u64) {
    let ids = stream_ids(env).await;
    let present: HashSet<(u64, u64)> = ids.iter().copied().collect();
    let (pending, last) = group_state(env, "slow").await;
    for id in &pending {
        assert!(present.contains(id), "pending entry {id:?} was trimmed");
    }
    let unread = ids.iter().filter(|id| **id > last).count();
    assert_eq!(unread, published - read, "an unread entry was trimmed");
    pending.iter().copied().chain([last]).min().expect("an id")
}

/// Creates the group `other` at `0`, then starts an app whose group `fast` acknowledges
/// everything and trims what is acknowledged every [`PERIOD`].
async fn start_trimming(env: &Env, other: &str) -> (RedisBroker, Worker, RunningApp) {
    group_create(env, other, "0").await;
    let worker = Worker::acking();
    let source = RedisStream::new(KEY).group("fast").trim_acked(PERIOD);
    let broker = env.broker();
    let app = env
        .start(app_of(broker.clone(), source, worker.clone()))
        .await;
    (broker, worker, app)
}

async fn trim_acked_never_drops_a_pending_or_unread_entry(env: &Env) {
    let (broker, worker, app) = start_trimming(env, "slow").await;
    let mut rng = fastrand::Rng::with_seed(14);
    let (mut published, mut read) = (0_usize, 0_usize);
    let mut trimmed_while_pending = false;
    let slack = slack(env).await;
    for round in 0..12 {
        let batch = jobs(u32::try_from(published).expect("count"), 150);
        broker
            .publisher()
            .messages(&batch)
            .to(KEY)
            .publish()
            .await
            .expect("publish");
        published += batch.len();
        read += read_group(env, "slow", rng.usize(0..=150)).await.len();
        let (pending, _) = group_state(env, "slow").await;
        let acked: Vec<_> = pending.into_iter().filter(|_| rng.f32() < 0.7).collect();
        ack(env, "slow", &acked).await;
        env.eventually("the fast group handled everything", async || {
            worker.seen().len() == published
        })
        .await;
        env.advance(PERIOD * 3).await;
        let low = check_kept(env, read, published).await;
        // The stream shrinks to the lowest id the slow group needs, within a node.
        env.eventually(&format!("round {round}: trimmed to {low:?}"), async || {
            let ids = stream_ids(env).await;
            let needed = ids.iter().filter(|id| **id >= low).count();
            i64::try_from(ids.len() - needed).expect("len") <= slack
        })
        .await;
        trimmed_while_pending |= stream_ids(env).await.len() < published;
        check_kept(env, read, published).await;
    }
    assert!(
        trimmed_while_pending,
        "the trim ran while entries were pending"
    );
    // Everything read and acknowledged: the stream shrinks to the last entry and a node.
    loop {
        let got = read_group(env, "slow", 1000).await;
        if got.is_empty() {
            break;
        }
        read += got.len();
    }
    let (pending, _) = group_state(env, "slow").await;
    ack(env, "slow", &pending).await;
    env.eventually("the stream trimmed to its last entry", async || {
        xlen(env).await <= 1 + slack
    })
    .await;
    check_kept(env, read, published).await;
    env.stop(app).await;
}

async fn a_group_that_read_nothing_keeps_the_whole_stream(env: &Env) {
    let (broker, worker, app) = start_trimming(env, "idle").await;
    broker
        .publisher()
        .messages(&jobs(0, 300))
        .to(KEY)
        .publish()
        .await
        .expect("publish");
    env.eventually("all handled", async || worker.seen().len() == 300)
        .await;
    env.advance(PERIOD * 6).await;
    assert_eq!(xlen(env).await, 300, "the idle group needs every entry");
    let _: Value = env
        .client
        .custom(
            fred::cmd!("XGROUP", hash: ClusterHash::from(env.key(KEY).as_str())),
            vec!["DESTROY", &env.key(KEY), "idle"],
        )
        .await
        .expect("XGROUP DESTROY");
    let slack = slack(env).await;
    env.eventually("trimmed once the idle group is gone", async || {
        xlen(env).await <= 1 + slack
    })
    .await;
    env.stop(app).await;
}

// -- TestApp ---------------------------------------------------------------------------------

fn testapp(policy: stream::Publish, source: RedisStream) -> RustStream {
    RustStream::new(AppInfo::new("bounded", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379")
            .prefix("t:")
            .route(KEY, policy),
        |b| {
            b.include(subscriber(source, Worker::acking()).build());
        },
    )
}

fn broker_error(e: fred::error::Error) -> ruststream::Error {
    ruststream::redis::error::core(e)
}

#[tokio::test(start_paused = true)]
async fn testapp_maxlen_bounds_the_stream() -> ruststream::Result<()> {
    let source = RedisStream::new(KEY).group("g");
    let tb = TestApp::start(testapp(stream::Publish::new().maxlen(100), source)).await?;
    let b = tb.broker::<RedisBroker>();
    b.messages(&jobs(0, 250)).to(KEY).publish().await?;
    let client = b.client().await?;
    let len: i64 = client.xlen("t:{ev}").await.map_err(broker_error)?;
    assert_eq!(len, 100, "the model trims `~` as exactly as Redis may");
    // The batch went out before the app read: maxlen dropped the oldest 150 unread, which is
    // what a publish-side bound does (trim_acked is the one that waits for the groups).
    assert_eq!(
        b.subscriber(KEY).calls().len(),
        100,
        "the newest 100 were handled"
    );
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn testapp_trim_acked_waits_for_every_group() -> ruststream::Result<()> {
    let source = RedisStream::new(KEY)
        .group("g")
        .trim_acked(Duration::from_secs(1));
    let tb = TestApp::start(testapp(stream::Publish::new(), source)).await?;
    let b = tb.broker::<RedisBroker>();
    let client = b.client().await?;
    let q = |r: Result<Value, fred::error::Error>| r.map_err(broker_error);
    q(client
        .custom(fred::cmd!("XGROUP"), vec!["CREATE", "t:{ev}", "audit", "0"])
        .await)?;
    b.messages(&jobs(0, 50)).to(KEY).publish().await?;
    tb.advance(Duration::from_secs(5)).await?;
    let len: i64 = client.xlen("t:{ev}").await.map_err(broker_error)?;
    assert_eq!(len, 50, "the audit group has read nothing");
    let read = q(client
        .custom(
            fred::cmd!("XREADGROUP"),
            vec![
                "GROUP", "audit", "a", "COUNT", "50", "STREAMS", "t:{ev}", ">",
            ],
        )
        .await)?;
    let Value::Array(mut streams) = read else {
        panic!("XREADGROUP: {read:?}")
    };
    let Value::Array(mut kv) = streams.swap_remove(0) else {
        panic!("a stream")
    };
    let ids = ids_of(kv.swap_remove(1));
    let mut args: Vec<Value> = vec!["t:{ev}".into(), "audit".into()];
    args.extend(
        ids.iter()
            .take(30)
            .map(|(ms, seq)| format!("{ms}-{seq}").into()),
    );
    q(client.custom(fred::cmd!("XACK"), args).await)?;
    tb.advance(Duration::from_secs(2)).await?;
    let len: i64 = client.xlen("t:{ev}").await.map_err(broker_error)?;
    assert_eq!(
        len, 20,
        "trimmed up to the audit group's oldest pending entry"
    );
    tb.shutdown().await
}
