//! Cancels on a stream read by a group, beyond what the list tests run on both: the race in
//! both orders, the operator's cancel, and a cancelled entry of a dead consumer acked by another's
//! sweep, not run again.

use crate::harness;

use std::time::Duration;

use fred::prelude::Value;
use harness::{Env, on};
use ruststream::prelude::*;
use ruststream::{CancelOutcome, RunningApp};

use super::{Job, Worker, job};

on!(
    [memory, standalone, cluster]
    a_stream_cancel_before_the_settle_wins,
    a_stream_settle_before_the_cancel_wins,
    the_operator_cancels_on_a_stream_subscription,
    a_cancelled_stream_entry_of_a_dead_consumer_is_not_run_again,
);

/// A broker that publishes `key` as a stream.
fn stream_broker(env: &Env, key: &str) -> RedisBroker {
    env.broker_with(|b| b.route(key, ruststream::stream::Publish::new()))
}

/// Publishes job `id` in `mode` to the stream `key`; `delay` later, if given.
pub(super) async fn publish_stream(
    env: &Env,
    key: &str,
    id: &str,
    mode: &str,
    delay: Option<Duration>,
) {
    let broker = stream_broker(env, key);
    broker.connect().await.expect("connect");
    let publisher = broker.publisher();
    let job = Job::new(mode);
    let mut p = self::job(&publisher, &job, key, id);
    if let Some(d) = delay {
        p = p.delay(d);
    }
    p.publish().await.expect("publish");
}

/// Cancels `id` of the stream `key` twice (the second as a resend): both answer the same.
pub(super) async fn cancel_stream_twice(env: &Env, key: &str, id: &str) -> CancelOutcome {
    let publisher = stream_broker(env, key).publisher();
    let first = publisher.cancel(key, id).await.expect("cancel");
    let again = publisher.cancel(key, id).await.expect("cancel again");
    assert_eq!(first, again, "a resent cancel answers what the first did");
    first
}

pub(super) fn stream(key: &str) -> RedisStream {
    RedisStream::new(key)
        .group("g")
        .block(Duration::from_millis(100))
        .cancel_grace(Duration::from_millis(500))
}

/// Starts an app reading the stream `source` into `worker`.
pub(super) async fn run_stream(env: &Env, source: RedisStream, worker: &Worker) -> RunningApp {
    let w = worker.clone();
    env.start_with(move |m| {
        m.include(subscriber(source, w).build());
    })
    .await
}

/// Waits until nothing of group `g` of `key` is pending.
pub(super) async fn stream_settled(env: &Env, key: &str) {
    env.eventually("settled", async || env.pending(key, "g").await == 0)
        .await;
}

/// The cancel runs while the handler is held; the handler then asks for a retry: the cancel
/// ran first, so the entry is only acked (nothing re-added, nothing delayed).
async fn a_stream_cancel_before_the_settle_wins(env: &Env) {
    let worker = Worker::default();
    let held = stream("{sw}").cancel_grace(Duration::from_secs(30));
    let app = run_stream(env, held, &worker).await;
    publish_stream(env, "{sw}", "w", "hold", None).await;
    env.eventually("w running", async || worker.called("w") == 1)
        .await;
    assert_eq!(
        cancel_stream_twice(env, "{sw}", "w").await,
        CancelOutcome::Signalled
    );
    worker.go.notify_one();
    stream_settled(env, "{sw}").await;
    env.advance(Duration::from_millis(300)).await;
    env.stop(app).await;
    assert_eq!(worker.calls(), ["w"], "its retry was not carried out");
    let len = env
        .cmd("XLEN", vec![Value::from(env.key("{sw}"))])
        .await
        .expect("XLEN");
    assert_eq!(len.as_i64(), Some(1), "nothing re-added to the stream");
    assert_eq!(env.zcard("{sw}.delayed").await, 0);
}

/// The handler settles first: the cancel finds nothing running nor unread, and records
/// nothing.
async fn a_stream_settle_before_the_cancel_wins(env: &Env) {
    let worker = Worker::default();
    let app = run_stream(env, stream("{sa}"), &worker).await;
    publish_stream(env, "{sa}", "done", "ack", None).await;
    env.eventually("done handled", async || worker.called("done") == 1)
        .await;
    stream_settled(env, "{sa}").await;
    assert_eq!(
        cancel_stream_twice(env, "{sa}", "done").await,
        CancelOutcome::NotFound
    );
    env.stop(app).await;
    assert!(!env.exists("{sa}.cancels").await, "nothing recorded");
}

/// The operator's cancel (`cancel SUB --id`, the dashboard's form) on a stream subscription:
/// a delayed message is removed, an unread one marked (and never handled), an unknown id not
/// found; each answer the same when resent.
async fn the_operator_cancels_on_a_stream_subscription(env: &Env) {
    publish_stream(env, "{so}", "later", "ack", Some(Duration::from_secs(3600))).await;
    publish_stream(env, "{so}", "a", "ack", None).await;
    publish_stream(env, "{so}", "b", "ack", None).await;
    let operator = env
        .broker()
        .operator(&[ruststream::RedisSource::from(stream("{so}"))]);
    operator.connect().await.expect("operator");
    for (id, expect) in [
        ("later", CancelOutcome::Removed),
        ("a", CancelOutcome::Marked),
        ("nobody", CancelOutcome::Marked),
    ] {
        for _ in 0..2 {
            let got = operator.cancel_message("{so}", id).await.expect("cancel");
            assert_eq!(got, expect, "cancel {id}");
        }
    }
    let worker = Worker::default();
    let app = run_stream(env, stream("{so}"), &worker).await;
    env.eventually("b handled", async || worker.called("b") == 1)
        .await;
    stream_settled(env, "{so}").await;
    assert_eq!(
        operator
            .cancel_message("{so}", "other")
            .await
            .expect("cancel"),
        CancelOutcome::NotFound,
        "all read and settled: nothing to find"
    );
    env.stop(app).await;
    assert_eq!(worker.calls(), ["b"], "the marked message never ran");
    assert_eq!(env.zcard("{so}.delayed").await, 0);
}

/// A consumer signalled, then dead before its settle (its handler ignored the cancel and its app
/// stopped before the grace, leaving the entry pending): another consumer's sweep claims the
/// entry, acks it, and does not run it again.
async fn a_cancelled_stream_entry_of_a_dead_consumer_is_not_run_again(env: &Env) {
    let key = "{sd}";
    let source = |name: &str| {
        stream(key)
            .consumer(name)
            .min_idle(Duration::from_millis(300))
            .cancel_grace(Duration::from_secs(60))
    };
    let dying = Worker::default();
    let (s, d) = (source("a"), dying.clone());
    let app = env
        .app(move |m| {
            m.include(subscriber(s, d).build());
        })
        .shutdown_timeout(Duration::from_millis(100));
    let app = env.start(app).await;
    publish_stream(env, key, "x", "ignore", None).await;
    env.eventually("x running", async || dying.called("x") == 1)
        .await;
    assert_eq!(
        cancel_stream_twice(env, key, "x").await,
        CancelOutcome::Signalled
    );
    env.stop(app).await;
    assert_eq!(
        env.pending(key, "g").await,
        1,
        "left pending by its dead consumer"
    );
    let worker = Worker::default();
    let app = run_stream(env, source("b"), &worker).await;
    env.advance(Duration::from_millis(400)).await;
    stream_settled(env, key).await;
    env.stop(app).await;
    assert_eq!(
        worker.calls(),
        Vec::<String>::new(),
        "the cancelled entry ran again"
    );
}
