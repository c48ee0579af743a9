//! Cancels composed with the other features, on a list and on a stream: priority levels (the
//! cancel covers each), a concurrency cap (a dropped handler frees it) and partitions (the cancel
//! tries each; every partition's reader hears the signal).

use crate::harness;

use std::sync::atomic::Ordering;
use std::time::Duration;

use harness::{Env, on};
use ruststream::CancelOutcome;

use super::streams::stream_settled;

use super::{Job, Queue, Worker, job, list, run, settled};

on!(
    [memory, standalone, cluster]
    a_cancel_covers_every_priority_level,
    a_dropped_handler_frees_the_cap,
    a_dropped_stream_handler_frees_the_cap,
    a_cancel_reaches_each_partition,
    a_stream_cancel_reaches_each_partition,
);

async fn a_cancel_covers_every_priority_level(env: &Env) {
    let broker =
        env.broker_with(|b| b.route("{cp}", ruststream::list::Publish::new().priorities(3)));
    broker.connect().await.expect("connect");
    let publisher = broker.publisher();
    for (id, level) in [("low", 0), ("high", 2), ("mid", 1)] {
        job(&publisher, &Job::new("ack"), "{cp}", id)
            .priority(level)
            .publish()
            .await
            .expect("publish");
    }
    assert_eq!(
        publisher.cancel("{cp}", "high").await.expect("cancel"),
        CancelOutcome::Marked
    );
    let worker = Worker::default();
    let app = run(env, list("{cp}").priorities(3).concurrency(1), &worker).await;
    env.eventually("the others handled", async || worker.calls().len() == 2)
        .await;
    env.advance(Duration::from_millis(300)).await;
    env.stop(app).await;
    assert_eq!(
        worker.calls(),
        ["mid", "low"],
        "the cancelled top level never ran"
    );
}

/// A cap of 1: the first message's handler ignores its cancel and holds the cap until it is
/// dropped after the grace; then the second runs.
async fn a_dropped_handler_frees_the_cap(env: &Env) {
    dropped_frees_the_cap(env, Queue::List("{cc}")).await;
}

async fn a_dropped_stream_handler_frees_the_cap(env: &Env) {
    dropped_frees_the_cap(env, Queue::Stream("{sc}")).await;
}

async fn dropped_frees_the_cap(env: &Env, q: Queue) {
    let worker = Worker::default();
    let app = q.source().max_in_flight(1).run(env, &worker).await;
    q.publish(env, "first", "ignore", None).await;
    env.eventually("first running", async || worker.called("first") == 1)
        .await;
    q.publish(env, "second", "ack", None).await;
    env.advance(Duration::from_millis(300)).await;
    assert_eq!(worker.calls(), ["first"], "the cap holds the second back");
    assert_eq!(q.cancel_twice(env, "first").await, CancelOutcome::Signalled);
    env.eventually("second handled", async || worker.called("second") == 1)
        .await;
    q.settled(env).await;
    env.stop(app).await;
    assert!(worker.dropped_at().is_some(), "the first was dropped");
}

async fn a_cancel_reaches_each_partition(env: &Env) {
    cancel_reaches_each_partition(env, Queue::List("cpart")).await;
}

async fn a_stream_cancel_reaches_each_partition(env: &Env) {
    cancel_reaches_each_partition(env, Queue::Stream("spart")).await;
}

/// Three running messages over two partitions: the cancel finds each (it tries every
/// partition), and each partition's reader hears the signal.
async fn cancel_reaches_each_partition(env: &Env, q: Queue) {
    let worker = Worker::default();
    let app = q.source().partitions(2).run(env, &worker).await;
    let key = q.key();
    let broker = match q {
        Queue::List(_) => env.broker(),
        Queue::Stream(_) => {
            env.broker_with(|b| b.route(key, ruststream::stream::Publish::new().partitions(2)))
        }
    };
    broker.connect().await.expect("connect");
    let publisher = broker.publisher();
    for id in ["p0", "p1", "p2"] {
        let j = Job::new("watch");
        job(&publisher, &j, key, id)
            .publish()
            .await
            .expect("publish");
    }
    env.eventually("all running", async || worker.calls().len() == 3)
        .await;
    for id in ["p0", "p1", "p2"] {
        let first = publisher.cancel(key, id).await.expect("cancel");
        let again = publisher.cancel(key, id).await.expect("cancel again");
        assert_eq!(
            (first, again),
            (CancelOutcome::Signalled, CancelOutcome::Signalled)
        );
    }
    for part in ["{%:0}", "{%:1}"] {
        let part = part.replace('%', key);
        match q {
            Queue::List(_) => settled(env, &part).await,
            Queue::Stream(_) => stream_settled(env, &part).await,
        }
    }
    env.stop(app).await;
    assert_eq!(worker.saw_cancel.load(Ordering::SeqCst), 3, "each told");
    assert_eq!(worker.calls().len(), 3, "none delivered again");
}
