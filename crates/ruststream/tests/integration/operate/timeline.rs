//! A job's history: published from its UUIDv7 id, each retry with the handler's error and the
//! attempt it ended, then its dead letter, in order; a message snoozed 30 times keeps only the
//! last 10 events in its `rs.history` header.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ruststream::prelude::*;
use ruststream::redis::operate::JobState;
use ruststream::redis::timeline::{HISTORY_EVENTS, HISTORY_HEADER};
use ruststream::{IntoHandlerResult, Mount};

use crate::harness;
use harness::{Env, on};

use super::{Job, job, operator_of};

on!(
    [standalone, cluster]
    a_job_that_failed_twice_then_died_tells_its_history_in_order,
    thirty_snoozes_keep_the_last_ten_events,
);

/// Fails every delivery with an error naming its attempt (HTML in it), through the conversion
/// a `#[subscriber]` function's `Err(e)` takes.
#[derive(Clone)]
struct Declines;

impl Handle<Job> for Declines {
    async fn handle(&self, _: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let failed: Result<(), String> =
            Err(format!("<b>card</b> declined on attempt {}", ctx.attempt()));
        failed.into_handler_result()
    }
}

/// Snoozes a message 30 times, then drops it.
#[derive(Clone, Default)]
struct Snoozes(Arc<AtomicU32>);

impl Handle<Job> for Snoozes {
    async fn handle(&self, _: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        if self.0.fetch_add(1, Ordering::SeqCst) < 30 {
            Err(HandlerOutcome::snooze(Duration::ZERO))
        } else {
            Err(HandlerOutcome::drop())
        }
    }
}

async fn a_job_that_failed_twice_then_died_tells_its_history_in_order(env: &Env) {
    let mount = |b: &mut Mount<RedisBroker>| {
        b.include(
            subscriber(
                RedisList::new("{told}")
                    .reliable()
                    .max_attempts(3)
                    .retry(Backoff::fixed(Duration::from_millis(10))),
                Declines,
            )
            .build(),
        );
    };
    let op = operator_of(&env.app(mount)).await;
    let _running = env.start_with(mount).await;
    env.broker()
        .publisher()
        .message(&job(1, false))
        .to("{told}")
        .publish()
        .await
        .expect("publish");
    env.eventually("the job is dead", async || {
        op.jobs("{told}", JobState::Dead, 0, 10)
            .await
            .is_ok_and(|p| p.total == 1)
    })
    .await;

    let dead = op
        .jobs("{told}", JobState::Dead, 0, 10)
        .await
        .expect("dead");
    let found = op.find_job(&dead.jobs[0].id).await.expect("a search");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        !found[0].headers.contains_key(HISTORY_HEADER),
        "the history is not shown among the headers"
    );
    let timeline = found[0].timeline();
    let seen: Vec<_> = timeline
        .iter()
        .map(|e| (e.kind.as_str(), e.attempt, e.detail.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("published", None, ""),
            ("retry", Some(1), "<b>card</b> declined on attempt 1"),
            ("retry", Some(2), "<b>card</b> declined on attempt 2"),
            ("dead", Some(3), "max-attempts"),
        ]
    );
    let times: Vec<i64> = timeline.iter().filter_map(|e| e.at_ms).collect();
    assert_eq!(times.len(), 4, "every event has its time: {timeline:?}");
    assert!(times.is_sorted(), "newest last: {times:?}");
}

async fn thirty_snoozes_keep_the_last_ten_events(env: &Env) {
    let handler = Snoozes::default();
    let mount = {
        let handler = handler.clone();
        move |b: &mut Mount<RedisBroker>| {
            b.include(
                subscriber(
                    RedisList::new("{dozy}").reliable().max_snoozes(100),
                    handler.clone(),
                )
                .build(),
            );
        }
    };
    let op = operator_of(&env.app(mount.clone())).await;
    let _running = env.start_with(mount).await;
    env.broker()
        .publisher()
        .message(&job(1, false))
        .to("{dozy}")
        .id("dozy-1")
        .publish()
        .await
        .expect("publish");
    env.eventually("the job is dropped", async || {
        op.jobs("{dozy}", JobState::Dead, 0, 10)
            .await
            .is_ok_and(|p| p.total == 1)
    })
    .await;

    assert_eq!(handler.0.load(Ordering::SeqCst), 31);
    let found = op.find_job("dozy-1").await.expect("a search");
    let job = &found[0];
    assert_eq!(job.history.len(), HISTORY_EVENTS, "{:?}", job.history);
    assert!(job.history[..9].iter().all(|e| e.kind == "snooze"));
    assert_eq!(job.history[9].kind, "dead");
    assert_eq!(job.history[9].detail, "dropped");
    let timeline = job.timeline();
    assert_eq!(timeline[0].kind, "published");
    assert_eq!(
        timeline[0].at_ms, None,
        "a producer's own id says nothing of when"
    );
    assert_eq!(timeline.len(), HISTORY_EVENTS + 1);
}
