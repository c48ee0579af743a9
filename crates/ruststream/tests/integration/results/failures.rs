//! An awaiter told of its job's failure: dropped, out of attempts (only after its retries),
//! undecodable, retried on a simple list or on Pub/Sub (neither can retry), and a batch handler's
//! dead letters.

use crate::harness;

use std::time::Duration;

use fred::prelude::*;
use harness::{Env, WAIT, on};
use ruststream::Error;
use ruststream::prelude::*;

use super::{
    Done, Job, KEY, Mode, Other, Worker, await_job, producer, publish_job, reliable, stop_all,
    two_workers, worker,
};

on!(
    [memory, standalone, cluster] multi_thread:
    a_dropped_job_fails_its_awaiter_with_the_reason,
    a_job_out_of_attempts_fails_its_awaiter_only_after_its_retries,
    an_undecodable_job_fails_its_awaiter,
    a_retry_on_a_simple_list_fails_its_awaiter,
    a_batch_handler_sets_results_and_its_dead_letters_fail_their_awaiters,
    a_pubsub_retry_fails_its_awaiter,
);

/// Asserts `result` is the failure of job `id` with a reason `reason` accepts.
fn assert_failed(result: ruststream::Result<Done>, id: &str, reason: impl Fn(&str) -> bool) {
    match result {
        Err(Error::JobFailed { id: got, reason: r }) => {
            assert_eq!(got, id);
            assert!(reason(&r), "unexpected reason {r:?}");
        }
        other => panic!("expected job {id} to fail, got {other:?}"),
    }
}

async fn a_dropped_job_fails_its_awaiter_with_the_reason(env: &Env) {
    let handler = Worker::new("", Mode::Drop);
    let apps = two_workers(env, &handler).await;
    let publisher = producer(env);
    let started = tokio::time::Instant::now();
    let result = await_job(&publisher, KEY, 1, "dropped-1", WAIT).await;
    assert_failed(result, "dropped-1", |r| r == "dropped");
    assert!(
        started.elapsed() < WAIT / 2,
        "the failure came promptly, not as a timeout: {:?}",
        started.elapsed()
    );
    // A message nobody awaits costs no record when it fails.
    publish_job(&publisher, 2, "not-awaited").await;
    env.eventually("both in the dead-letter list", async || {
        env.llen("{jobs}.dead").await == 2
    })
    .await;
    assert!(!env.exists("ruststream:job:{not-awaited}").await);
    assert!(env.exists("ruststream:job:{dropped-1}").await);
    stop_all(env, apps).await;
}

async fn a_job_out_of_attempts_fails_its_awaiter_only_after_its_retries(env: &Env) {
    let handler = Worker::new("", Mode::Retry);
    let source = || reliable(KEY).max_attempts(3);
    let apps = [
        worker(env, source(), handler.named("a"), |b| b).await,
        worker(env, source(), handler.named("b"), |b| b).await,
    ];
    let result = await_job(&producer(env), KEY, 1, "retried", WAIT).await;
    // The retries to come did not fail it: only the last attempt's dead letter did.
    assert_eq!(handler.attempts(), [1, 2, 3]);
    assert_failed(result, "retried", |r| r == "max-attempts");
    stop_all(env, apps).await;
}

async fn an_undecodable_job_fails_its_awaiter(env: &Env) {
    let handler = Worker::new("", Mode::Double);
    let apps = two_workers(env, &handler).await;
    let other = Other {
        text: "not a job".into(),
    };
    let result = producer(env)
        .message(&other)
        .to(KEY)
        .id("undecodable")
        .publish()
        .await_result::<Done>(WAIT)
        .await;
    assert_failed(result, "undecodable", |r| r.starts_with("decode"));
    assert!(handler.attempts().is_empty(), "the handler never ran");
    stop_all(env, apps).await;
}

async fn a_retry_on_a_simple_list_fails_its_awaiter(env: &Env) {
    let handler = Worker::new("", Mode::Retry);
    let apps = [
        worker(env, RedisList::new("{simple}"), handler.named("a"), |b| b).await,
        worker(env, RedisList::new("{simple}"), handler.named("b"), |b| b).await,
    ];
    let result = await_job(&producer(env), "{simple}", 1, "simple-1", WAIT).await;
    assert_failed(result, "simple-1", |r| r.contains("cannot redeliver"));
    assert_eq!(handler.attempts(), [1]);
    stop_all(env, apps).await;
}

async fn a_pubsub_retry_fails_its_awaiter(env: &Env) {
    const CHANNEL: &str = "{events}";
    let handler = Worker::new("", Mode::Retry);
    let apps = [
        worker(env, RedisChannel::new(CHANNEL), handler.named("a"), |b| b).await,
        worker(env, RedisChannel::new(CHANNEL), handler.named("b"), |b| b).await,
    ];
    let nodes = env.node_clients().await;
    env.eventually("both apps subscribed", async || {
        let mut total = 0;
        for node in &nodes {
            let reply: Vec<Value> = node
                .custom(
                    fred::cmd!("PUBSUB"),
                    vec!["NUMSUB".to_owned(), env.key(CHANNEL)],
                )
                .await
                .expect("PUBSUB NUMSUB");
            total += reply.get(1).and_then(Value::as_i64).unwrap_or(0);
        }
        total == 2
    })
    .await;
    let publisher = env
        .broker_with(|b| b.route(CHANNEL, pubsub::Publish::new()))
        .publisher();
    let result = await_job(&publisher, CHANNEL, 1, "event-1", WAIT).await;
    // Each subscriber's retry is a dead letter; the first recorded stays.
    assert_failed(result, "event-1", |r| r.starts_with("no-redelivery"));
    env.eventually("both subscribers ran", async || {
        handler.attempts() == [1, 1]
    })
    .await;
    stop_all(env, apps).await;
}

/// Per item: an even job's result is `2n`, an odd job is dropped.
#[derive(Clone)]
struct EvenOnly;

impl HandleBatch<Job> for EvenOnly {
    async fn handle_batch(&self, jobs: &[Job], ctx: &mut BatchContext<'_>) -> BatchOutcome {
        let mut each = Vec::new();
        for (i, job) in jobs.iter().enumerate() {
            if job.n % 2 == 1 {
                each.push(HandlerOutcome::drop());
                continue;
            }
            let done = Done {
                n: job.n * 2,
                by: format!("batch of {}", jobs.len()),
            };
            ctx.progress(i, &1u32).await.expect("progress");
            ctx.set_result(i, &done).await.expect("set_result");
            each.push(HandlerOutcome::ack());
        }
        BatchOutcome::each(each)
    }
}

async fn a_batch_handler_sets_results_and_its_dead_letters_fail_their_awaiters(env: &Env) {
    let batch_worker = async || {
        let app = RustStream::new(AppInfo::new("results-batch", "0.0.0"))
            .shutdown_timeout(Duration::from_secs(1))
            .with_broker(env.broker_with(|b| b), |b| {
                let source = RedisList::new(KEY).reliable().concurrency(4);
                b.include(
                    subscriber(source, EvenOnly)
                        .batch(2)
                        .max_wait(Duration::from_millis(50))
                        .build(),
                );
            });
        env.start(app).await
    };
    let apps = [batch_worker().await, batch_worker().await];
    let publisher = producer(env);
    let results = futures::future::join_all((0..4).map(|n| {
        let publisher = &publisher;
        async move { await_job(publisher, KEY, n, &format!("batch-{n}"), WAIT).await }
    }))
    .await;
    for (n, result) in (0u32..).zip(results) {
        if n % 2 == 0 {
            assert_eq!(result.expect("an even job's result").n, n * 2);
        } else {
            assert_failed(result, &format!("batch-{n}"), |r| r == "dropped");
        }
    }
    assert_eq!(
        publisher
            .progress::<u32>("batch-2")
            .await
            .expect("progress"),
        Some(1)
    );
    stop_all(env, apps).await;
}
