//! Readers come back after their connections fail, whatever command was in flight: a worker
//! reads through a proxy that either closes every connection (`cut_all`) or silences them
//! without closing anything (`stall_all`: a frozen peer, a network that drops everything), while
//! its blocking read waits on Redis; the next message must still be handled within a bound.
//!
//! Two outages in a row: a stream reader whose connection went silent gets a new one (the old
//! is replaced), and the replaced one is then cut; its consumer group, deleted during each
//! outage, is created again when the connection comes back (a replacement counts as a
//! reconnect), before the reader reads with it.

use std::time::Duration;

use ruststream::prelude::*;

use super::common::*;
use crate::harness::proxy::Proxy;
use crate::harness::{Env, logs, on, start, stop, wait_until};
use ruststream::RunningApp;

on!(
    [standalone]
    a_stream_reader_resumes_after_its_blocking_read_is_cut,
    a_reliable_list_reader_resumes_after_its_blocking_read_is_cut,
    a_simple_list_reader_resumes_after_its_blocking_read_is_cut,
    a_pubsub_subscriber_resumes_after_its_connection_is_cut,
    a_stream_reader_resumes_after_its_connection_goes_silent,
    a_reliable_list_reader_resumes_after_its_connection_goes_silent,
    a_simple_list_reader_resumes_after_its_connection_goes_silent,
    a_pubsub_subscriber_resumes_after_its_connection_goes_silent,
    a_stream_reader_rejoins_after_two_outages_in_a_row,
    a_capped_stream_reader_rejoins_after_two_outages_in_a_row,
);

/// How often each test breaks a worker's connections mid-read.
const ROUNDS: u32 = 4;
/// How long a blocking read waits on Redis: long, so the fault finds it in flight.
const BLOCK: Duration = Duration::from_secs(2);
/// The workers' command timeout: how long a command may go without a reply.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a message that may have been lost with a silenced read is published again.
const REPUBLISH: Duration = Duration::from_millis(500);
/// How long a stream entry stays pending on a consumer before it is claimed back.
const MIN_IDLE: Duration = Duration::from_secs(2);
/// How soon a message published after a fault must be handled: a silent connection is given
/// up after the read's wait plus the command timeout; reconnects back off up to 5 s.
const RESUME: Duration = Duration::from_secs(15);

/// How the proxy breaks the connections.
#[derive(Clone, Copy)]
enum Fault {
    /// Every connection closed.
    Cut,
    /// Every connection silent, none closed.
    Stall,
}

impl Fault {
    fn apply(self, proxy: &Proxy) {
        match self {
            Self::Cut => proxy.cut_all(),
            Self::Stall => proxy.stall_all(),
        }
    }
}

/// A worker's broker through `proxy` with the test's prefix and a short command timeout.
fn via(proxy: &Proxy, env: &Env) -> RedisBroker {
    RedisBroker::standalone(proxy.url())
        .prefix(&env.prefix)
        .command_timeout(COMMAND_TIMEOUT)
}

/// Breaks every connection of a worker reading through `proxy` with `fault` while its
/// blocking read `read` (the command's name as it goes on the wire) is in flight, [`ROUNDS`]
/// times; after each, `send(i)` publishes job `i`, which `rec` must see within [`RESUME`].
/// With `lossy` (a simple list: what a silenced `BRPOP` popped is gone, at most once), job `i`
/// is published again every [`REPUBLISH`] until it is seen.
async fn break_while_reading(
    proxy: &Proxy,
    fault: Fault,
    (read, lossy): (&str, bool),
    rec: &Rec,
    mut send: impl AsyncFnMut(u32),
) {
    let needle = format!("\r\n{read}\r\n");
    for i in 0..ROUNDS {
        // A read sent after the last job was handled is the one waiting on Redis now.
        let reads = proxy.sent_count(needle.as_bytes());
        wait_until(
            &format!("a {read} in flight before fault {i}"),
            RESUME,
            async || proxy.sent_count(needle.as_bytes()) > reads,
        )
        .await;
        fault.apply(proxy);
        send(i).await;
        let mut sent = tokio::time::Instant::now();
        wait_until(
            &format!("job {i}, published after fault {i}, handled"),
            RESUME,
            async || {
                if lossy && sent.elapsed() >= REPUBLISH {
                    send(i).await;
                    sent = tokio::time::Instant::now();
                }
                rec.seen().iter().any(|s| s.n == i)
            },
        )
        .await;
    }
    assert_eq!(rec.distinct(), ROUNDS as usize, "{:?}", rec.seen());
}

/// A worker reading the stream `key` (group `g`) through `proxy`, recording into the returned
/// [`Rec`]; and a publisher to the stream that goes through no proxy.
async fn stream_worker(env: &Env, proxy: &Proxy, key: &str) -> (RunningApp, Rec, RedisBroker) {
    stream_worker_capped(env, proxy, key, None).await
}

/// [`stream_worker`], its group capped at `cap` in flight when given: then every read runs the
/// read script, not the native read.
async fn stream_worker_capped(
    env: &Env,
    proxy: &Proxy,
    key: &str,
    cap: Option<u32>,
) -> (RunningApp, Rec, RedisBroker) {
    let rec = Rec::acking();
    let r = rec.clone();
    // An entry a silenced read delivered (its reply never came) is pending on this consumer:
    // it comes back after `min_idle`, like any lost reply.
    let source = RedisStream::new(key)
        .group("g")
        .block(BLOCK)
        .min_idle(MIN_IDLE);
    let source = match cap {
        Some(n) => source.max_in_flight(n),
        None => source,
    };
    let app = start(app_on(
        via(proxy, env).route(key, stream::Publish::new()),
        Duration::from_millis(100),
        |b| {
            b.include(subscriber(source, r).build());
        },
    ))
    .await;
    let publisher = env.broker_with(|b| b.route(key, stream::Publish::new()));
    publisher.connect().await.unwrap();
    (app, rec, publisher)
}

async fn stream_reader(env: &Env, fault: Fault, key: &str) {
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    let (app, rec, publisher) = stream_worker(env, &proxy, key).await;
    // The stream's blocking read is `XREAD BLOCK` from the last id (`read.lua` claims).
    break_while_reading(&proxy, fault, ("XREAD", false), &rec, async |i| {
        publisher
            .publisher()
            .message(&Job { n: i })
            .to(key)
            .publish()
            .await
            .unwrap();
    })
    .await;
    stop(app).await;
}

async fn list_reader(env: &Env, fault: Fault, key: &str, reliable: bool) {
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    let rec = Rec::acking();
    let r = rec.clone();
    let mut source = RedisList::new(key).block(BLOCK);
    if reliable {
        source = source.reliable();
    }
    let app = start(app_on(via(&proxy, env), Duration::from_millis(100), |b| {
        b.include(subscriber(source, r).build());
    }))
    .await;
    // Both modes wait with `BLMOVE K K` (which takes nothing) and claim with `claim.lua`.
    let read = "BLMOVE";
    let lossy = !reliable;
    break_while_reading(&proxy, fault, (read, lossy), &rec, async |i| {
        publish(env, key, &[Job { n: i }]).await;
    })
    .await;
    stop(app).await;
}

/// A subscriber has no read in flight: its connection breaks while it waits for messages, and
/// what is published once it is subscribed again arrives.
async fn pubsub_subscriber(env: &Env, fault: Fault, channel: &str) {
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    let rec = Rec::acking();
    let r = rec.clone();
    let app = start(app_on(via(&proxy, env), Duration::from_millis(100), |b| {
        b.include(subscriber(RedisChannel::new(channel), r).build());
    }))
    .await;
    let publisher = env.broker_with(|b| b.route(channel, pubsub::Publish::new()));
    publisher.connect().await.unwrap();
    let subscribes = b"\r\nSUBSCRIBE\r\n";
    for i in 0..ROUNDS {
        let before = proxy.sent_count(subscribes);
        fault.apply(&proxy);
        // Published again until it arrives: Pub/Sub keeps nothing for a subscriber that is not
        // subscribed (again) yet.
        wait_until(
            &format!("message {i}, published after fault {i}, handled"),
            RESUME,
            async || {
                if proxy.sent_count(subscribes) > before {
                    publisher
                        .publisher()
                        .message(&Job { n: i })
                        .to(channel)
                        .publish()
                        .await
                        .unwrap();
                }
                rec.seen().iter().any(|s| s.n == i)
            },
        )
        .await;
    }
    stop(app).await;
}

// A dropped connection under a blocking XREADGROUP must not silence the reader: fred resends the
// read on a new connection.
async fn a_stream_reader_resumes_after_its_blocking_read_is_cut(env: &Env) {
    stream_reader(env, Fault::Cut, "{live-cut-s}").await;
}

async fn a_reliable_list_reader_resumes_after_its_blocking_read_is_cut(env: &Env) {
    list_reader(env, Fault::Cut, "{live-cut-r}", true).await;
}

async fn a_simple_list_reader_resumes_after_its_blocking_read_is_cut(env: &Env) {
    list_reader(env, Fault::Cut, "{live-cut-l}", false).await;
}

async fn a_pubsub_subscriber_resumes_after_its_connection_is_cut(env: &Env) {
    pubsub_subscriber(env, Fault::Cut, "live-cut-c").await;
}

// The fault: a blocking read on a connection that stops answering (nothing closes it) never returns
// unless bounded; the reader would wait on it for ever and handle nothing again.
async fn a_stream_reader_resumes_after_its_connection_goes_silent(env: &Env) {
    stream_reader(env, Fault::Stall, "{live-stall-s}").await;
}

async fn a_reliable_list_reader_resumes_after_its_connection_goes_silent(env: &Env) {
    list_reader(env, Fault::Stall, "{live-stall-r}", true).await;
}

async fn a_simple_list_reader_resumes_after_its_connection_goes_silent(env: &Env) {
    list_reader(env, Fault::Stall, "{live-stall-l}", false).await;
}

// The fault: a subscriber whose connection goes silent would wait for messages for ever.
async fn a_pubsub_subscriber_resumes_after_its_connection_goes_silent(env: &Env) {
    pubsub_subscriber(env, Fault::Stall, "live-stall-c").await;
}

/// `XGROUP DESTROY key group` on the server (not through the proxy): the group must have existed.
async fn destroy_group(env: &Env, key: &str, group: &str) {
    let destroyed = env
        .cmd(
            "XGROUP",
            vec!["DESTROY".into(), env.key(key).into(), group.into()],
        )
        .await
        .expect("XGROUP DESTROY");
    assert_eq!(destroyed.as_i64(), Some(1), "the group {group} existed");
}

// The fault: a reader whose connection was replaced (it went silent) or came back may read from a
// server that lost its group (a restart without persistence, a failover to a replica that missed
// it, an operator's `XGROUP DESTROY`). Without creating it again, every read answers `NOGROUP`
// until the process restarts.
async fn a_stream_reader_rejoins_after_two_outages_in_a_row(env: &Env) {
    rejoins_after_two_outages(env, "{live-twice}", None).await;
}

// The same on a group that reads through its script (a cap): fred reconnects under its blocking
// wait and sends the wait again, so no read fails; the reader must still see the reconnect
// before its next read.
async fn a_capped_stream_reader_rejoins_after_two_outages_in_a_row(env: &Env) {
    rejoins_after_two_outages(env, "{live-twice-capped}", Some(100)).await;
}

async fn rejoins_after_two_outages(env: &Env, key: &str, cap: Option<u32>) {
    logs::capture();
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    // The reader's connections, as its logs name them.
    let target = proxy.url();
    let (app, rec, publisher) = stream_worker_capped(env, &proxy, key, cap).await;
    let send = async |n: u32| {
        publisher
            .publisher()
            .message(&Job { n })
            .to(key)
            .publish()
            .await
            .unwrap();
    };
    send(0).await;
    wait_until("job 0 handled", RESUME, async || rec.distinct() == 1).await;
    let replaced = || logs::lines_with(&["reading connection replaced", &target]).len();
    let needle = b"\r\nXREAD\r\n";
    // The first outage leaves the reader on a new connection; the second cuts that one.
    for (i, fault) in [(1, Fault::Stall), (2, Fault::Cut)] {
        let reads = proxy.sent_count(needle);
        wait_until(
            &format!("an XREAD in flight and nothing pending before outage {i}"),
            RESUME,
            async || proxy.sent_count(needle) > reads && env.pending(key, "g").await == 0,
        )
        .await;
        // Gone when the connection goes: the read in flight (`XREAD`) does not use the group,
        // so only a read after the outage could find it missing.
        destroy_group(env, key, "g").await;
        fault.apply(&proxy);
        send(i).await;
        wait_until(
            &format!("job {i}, published after outage {i}, handled"),
            RESUME,
            async || rec.seen().iter().any(|s| s.n == i),
        )
        .await;
        if i == 1 {
            assert!(replaced() >= 1, "the silent connection was replaced");
        }
    }
    assert_eq!(rec.distinct(), 3, "{:?}", rec.seen());
    // The group came back before any read needed it: no read found it missing. The queue
    // gauges may find it missing while the test has it destroyed: a gauge left unread, no read.
    let missing: Vec<String> = logs::lines_with(&["NOGROUP", &env.key(key)])
        .into_iter()
        .filter(|l| !l.contains("ruststream_redis::gauges:"))
        .collect();
    assert!(missing.is_empty(), "reads without the group: {missing:?}");
    stop(app).await;
}
