//! Readers come back after their connections fail, whatever command was in flight: a worker
//! reads through a proxy that either closes every connection (`cut_all`) or silences them
//! without closing anything (`stall_all`: a frozen peer, a network that drops everything), while
//! its blocking read waits on Redis; the next message must still be handled within a bound.

use std::time::Duration;

use ruststream::prelude::*;

use super::common::*;
use crate::harness::proxy::Proxy;
use crate::harness::{Env, on, start, stop, wait_until};

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

async fn stream_reader(env: &Env, fault: Fault, key: &str) {
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    let rec = Rec::acking();
    let r = rec.clone();
    // An entry a silenced read delivered (its reply never came) is pending on this consumer:
    // it comes back after `min_idle`, like any lost reply.
    let source = RedisStream::new(key)
        .group("g")
        .block(BLOCK)
        .min_idle(MIN_IDLE);
    let app = start(app_on(
        via(&proxy, env).route(key, stream::Publish::new()),
        Duration::from_millis(100),
        |b| {
            b.include(subscriber(source, r).build());
        },
    ))
    .await;
    let publisher = env.broker_with(|b| b.route(key, stream::Publish::new()));
    publisher.connect().await.unwrap();
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

// Not an observation of a failure: a dropped connection under a blocking XREADGROUP was
// suspected of silencing the reader (issue 27); fred resends the read on a new connection.
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

// Before: a blocking read on a connection that stopped answering (nothing closed it) never
// returned: the reader waited on it for ever, and nothing was handled again.
async fn a_stream_reader_resumes_after_its_connection_goes_silent(env: &Env) {
    stream_reader(env, Fault::Stall, "{live-stall-s}").await;
}

async fn a_reliable_list_reader_resumes_after_its_connection_goes_silent(env: &Env) {
    list_reader(env, Fault::Stall, "{live-stall-r}", true).await;
}

async fn a_simple_list_reader_resumes_after_its_connection_goes_silent(env: &Env) {
    list_reader(env, Fault::Stall, "{live-stall-l}", false).await;
}

// Before: a subscriber whose connection went silent waited for messages for ever.
async fn a_pubsub_subscriber_resumes_after_its_connection_goes_silent(env: &Env) {
    pubsub_subscriber(env, Fault::Stall, "live-stall-c").await;
}
