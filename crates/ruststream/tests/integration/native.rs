//! Native reads: a simple list and a plain consumer group read with their own commands (`RPOP`,
//! `XREADGROUP`), not a script, and stay exact against a pause or a cancel that races a read.
//!
//! The command counts come from `INFO commandstats` on a server of the test's own, so no other
//! test's commands are counted. The races are checked against what Redis holds: after `pause`
//! returns, the queue's length (a list) or the group's `entries-read` (a stream) never moves
//! again; a message still queued when its cancel returned is never handled.

use crate::combinations::streams::group_fields;
use crate::harness;
use crate::leases::command_calls;
use crate::lists::{Job, info};

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use harness::{Env, on, stand, start, stop, unique, wait_until};
use ruststream::CancelOutcome;
use ruststream::prelude::*;

use super::operate::operator_of;

on!(
    [standalone, cluster] multi_thread:
    a_pause_racing_native_list_reads_stops_every_take,
    a_pause_racing_native_stream_reads_stops_every_take,
    a_cancel_racing_native_list_reads_is_exact,
    a_cancel_racing_native_stream_reads_is_exact,
);

/// Records the ids handled.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<HashSet<String>>>);

impl Seen {
    fn len(&self) -> usize {
        self.0.lock().expect("lock").len()
    }

    fn has(&self, id: &str) -> bool {
        self.0.lock().expect("lock").contains(id)
    }
}

impl Handle<Job> for Seen {
    async fn handle(&self, _: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.0
            .lock()
            .expect("lock")
            .insert(ctx.message_id().to_owned());
        Ok(())
    }
}

/// Messages of one test run.
const N: u32 = 3_000;

/// Publishes jobs `0..n` to `to` (a list or a stream the broker routes), message `i` with the id
/// `m<i>`.
async fn publish(broker: &RedisBroker, to: &str, n: u32) {
    broker.connect().await.expect("connect");
    let publisher = broker.publisher();
    for i in 0..n {
        publisher
            .message(&Job { n: i })
            .to(to)
            .id(format!("m{i}"))
            .publish()
            .await
            .expect("publish");
    }
}

/// The reading a source has done so far: how many entries left the list, or the group's
/// `entries-read`.
async fn taken(env: &Env, key: &str, stream: bool) -> i64 {
    if !stream {
        return i64::from(N) - env.llen(key).await;
    }
    let fields = group_fields(env, key, "g").await;
    // Nil until the group has read past a gap Redis cannot count.
    let (_, read) = fields
        .iter()
        .find(|(k, _)| k == "entries-read")
        .expect("entries-read (Redis 7)");
    read.as_i64().unwrap_or(0)
}

async fn a_pause_racing_native_list_reads_stops_every_take(env: &Env) {
    pause_races_reads(env, "{npl}", false).await;
}

async fn a_pause_racing_native_stream_reads_stops_every_take(env: &Env) {
    pause_races_reads(env, "{nps}", true).await;
}

/// Pauses while the readers take, five times: once `pause` has returned, what was taken never
/// grows until the resume.
async fn pause_races_reads(env: &Env, key: &str, stream: bool) {
    let broker = env.broker_with(|b| routed(b, key, stream));
    let seen = Seen::default();
    publish(&broker, key, N).await;
    let op = operator_of(&app_of(&broker, key, stream, &seen)).await;
    let app = start(app_of(&broker, key, stream, &seen)).await;
    let mut rounds = 0;
    while rounds < 5 && taken(env, key, stream).await < i64::from(N) - 400 {
        rounds += 1;
        let round = rounds;
        let from = taken(env, key, stream).await;
        wait_until("the readers take", harness::WAIT, async || {
            taken(env, key, stream).await > from + 50
        })
        .await;
        op.pause(key, "test").await.expect("pause");
        let at_pause = taken(env, key, stream).await;
        // A negative observation needs a window: several reads' worth.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            taken(env, key, stream).await,
            at_pause,
            "round {round}: taken after the pause returned"
        );
        op.resume(key).await.expect("resume");
    }
    assert!(
        rounds >= 2,
        "the readers outran the pauses: {rounds} rounds"
    );
    wait_until(
        "every message handled",
        Duration::from_secs(60),
        async || seen.len() == N as usize,
    )
    .await;
    stop(app).await;
}

async fn a_cancel_racing_native_list_reads_is_exact(env: &Env) {
    cancel_races_reads(env, "npc", false).await;
}

async fn a_cancel_racing_native_stream_reads_is_exact(env: &Env) {
    cancel_races_reads(env, "nsc", true).await;
}

/// Cancels a message just ahead of the readers, on a fresh queue each round (the first cancel
/// of a queue is the one that races a native read: the record it makes sends later reads to
/// the script): a message still queued when its cancel returned is never handled, and every
/// other message is.
async fn cancel_races_reads(env: &Env, tag: &str, stream: bool) {
    let mut queued_at_cancel = 0;
    for round in 0..4u32 {
        let key = format!("{{{tag}{round}}}");
        let broker = env.broker_with(|b| routed(b, &key, stream));
        let seen = Seen::default();
        publish(&broker, &key, N).await;
        let app = start(app_of(&broker, &key, stream, &seen)).await;
        let front = taken(env, &key, stream).await;
        // Just ahead of what the readers have taken: the next reads reach it.
        let target = u32::try_from(front + 64 + i64::from(round) * 32).unwrap_or(0);
        let id = format!("m{target}");
        let outcome = broker.publisher().cancel(&key, &id).await.expect("cancel");
        let after = taken(env, &key, stream).await;
        let queued = i64::from(target) >= after;
        wait_until(
            "every other message handled",
            Duration::from_secs(60),
            async || seen.len() >= N as usize - 1,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop(app).await;
        if queued {
            queued_at_cancel += 1;
            assert_eq!(outcome, CancelOutcome::Marked, "round {round}");
            assert!(
                !seen.has(&id),
                "round {round}: a cancelled queued message ran"
            );
            assert_eq!(seen.len(), N as usize - 1, "round {round}");
        } else {
            assert!(
                seen.has(&id),
                "round {round}: a message taken before its cancel ran"
            );
        }
    }
    assert!(
        queued_at_cancel > 0,
        "no cancel found its message queued: the readers outran every cancel"
    );
}

/// `broker` with `key` routed to a stream when `stream`.
fn routed(broker: RedisBroker, key: &str, stream: bool) -> RedisBroker {
    if stream {
        broker.route(key, ruststream::stream::Publish::new())
    } else {
        broker
    }
}

/// An app reading `key` on `broker` (a simple list, or a stream's group `g`) into `seen`.
fn app_of(broker: &RedisBroker, key: &str, stream: bool, seen: &Seen) -> RustStream {
    let s = seen.clone();
    let key = key.to_owned();
    RustStream::new(info())
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(broker.clone(), move |m| {
            if stream {
                m.include(subscriber(RedisStream::new(key).group("g").concurrency(16), s).build());
            } else {
                m.include(subscriber(RedisList::new(key).concurrency(16), s).build());
            }
        })
}

/// A simple list and a plain consumer group read a few thousand messages without one
/// `EVALSHA` a read, each read watched for the next: counted with `INFO commandstats` on a
/// server of the test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_simple_list_and_a_plain_group_read_without_a_script() {
    let stand = stand::Stand::start("stand_standalone");
    let url = stand.var("RUSTSTREAM_REDIS_URL");
    let admin = stand::node_client(&url).await;
    let prefix = format!("{}:", unique("native"));
    for (key, stream, read) in [("l", false, "rpop"), ("s", true, "xreadgroup")] {
        let broker = routed(
            RedisBroker::standalone(url.clone()).prefix(prefix.clone()),
            key,
            stream,
        );
        let seen = Seen::default();
        let app = start(app_of(&broker, key, stream, &seen)).await;
        let _: () = admin
            .custom(fred::cmd!("CONFIG"), vec!["RESETSTAT"])
            .await
            .expect("CONFIG RESETSTAT");
        publish(&broker, key, N).await;
        wait_until(
            "every message handled",
            Duration::from_secs(60),
            async || seen.len() == N as usize,
        )
        .await;
        let calls = command_calls(&admin).await;
        stop(app).await;
        let reads = calls.get(read).copied().unwrap_or(0);
        let scripts = calls.get("evalsha").copied().unwrap_or(0);
        assert!(reads > 0, "{key}: no {read} in {calls:?}");
        assert!(
            scripts * 10 < reads,
            "{key}: {scripts} EVALSHA for {reads} {read}: a read ran a script ({calls:?})"
        );
        // Each native read is followed by the `WATCH` for the next, in the same write.
        let watches = calls.get("watch").copied().unwrap_or(0);
        assert!(
            watches >= reads,
            "{key}: {watches} WATCH for {reads} {read}: a read went unwatched ({calls:?})"
        );
    }
}
