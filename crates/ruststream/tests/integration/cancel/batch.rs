//! A batch handler is told of its cancelled item, which settles cancelled.

use crate::harness;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Env, WAIT, on};
use ruststream::prelude::*;
use ruststream::{CancelOutcome, ErrorKind};

use super::{Job, awaited, cancel_twice, list, publish, settled};

on!([memory, standalone, cluster] a_batch_handler_is_told_of_its_cancelled_item);

/// A batch handler that waits (bounded) for each `watch` item's cancel, counting those told.
#[derive(Clone, Default)]
struct BatchWorker {
    batches: Arc<Mutex<Vec<Vec<String>>>>,
    told: Arc<AtomicUsize>,
}

impl ruststream::HandleBatch<Job> for BatchWorker {
    async fn handle_batch(
        &self,
        jobs: &[Job],
        ctx: &mut ruststream::BatchContext<'_>,
    ) -> ruststream::BatchOutcome {
        let ids = ctx.infos().map(|i| i.message_id.clone()).collect();
        self.batches.lock().expect("lock").push(ids);
        for (i, job) in jobs.iter().enumerate() {
            if job.mode == "watch"
                && tokio::time::timeout(WAIT, ctx.cancelled(i)).await.is_ok()
                && ctx.is_cancelled(i)
            {
                self.told.fetch_add(1, Ordering::SeqCst);
            }
        }
        ruststream::BatchOutcome::ack()
    }
}

/// A batch of two, one item cancelled while the batch runs: the handler is told of that item
/// (`BatchContext::cancelled(i)`), the batch call is not dropped, the other item is acked, and
/// the cancelled one settles cancelled (its awaiter fails with `Error::Cancelled`) although the
/// batch acked it.
async fn a_batch_handler_is_told_of_its_cancelled_item(env: &Env) {
    let key = "{cb}";
    publish(env, key, "plain", "ack").await;
    let producer = env.broker();
    let waiting = {
        let producer = producer.clone();
        tokio::spawn(async move { awaited(&producer, key, "watched", "watch").await })
    };
    env.eventually("both queued", async || env.llen(key).await == 2)
        .await;
    let worker = BatchWorker::default();
    let w = worker.clone();
    let app = env
        .start_with(move |m| {
            m.include(
                subscriber(list(key), w)
                    .batch(2)
                    .max_wait(Duration::from_secs(1))
                    .build(),
            );
        })
        .await;
    env.eventually("the batch runs", async || {
        !worker.batches.lock().expect("lock").is_empty()
    })
    .await;
    assert_eq!(
        cancel_twice(env, key, "watched").await,
        CancelOutcome::Signalled
    );
    let awaited = harness::bounded("the awaiter", WAIT, waiting)
        .await
        .expect("the awaiter's task");
    assert_eq!(
        awaited
            .expect_err("a cancelled job fails its awaiter")
            .kind(),
        ErrorKind::Cancelled
    );
    settled(env, key).await;
    env.stop(app).await;
    assert_eq!(worker.told.load(Ordering::SeqCst), 1, "told of its item");
    let batches = worker.batches.lock().expect("lock").clone();
    assert_eq!(batches.len(), 1, "one batch, not run again: {batches:?}");
    assert_eq!(batches[0].len(), 2, "both items in it: {batches:?}");
    assert_eq!(env.llen(key).await, 0, "nothing left queued");
    assert_eq!(
        env.llen(&format!("{key}.dead")).await,
        0,
        "a cancel is no dead letter"
    );
}
