//! Pause and resume: a pause holds every reader until `resume` and outlives a restart, and a queue
//! with partitions is seen and paused per partition or whole.

use std::process::ExitCode;
use std::time::Duration;

use ruststream::Mount;
use ruststream::operate::run_args;
use ruststream::prelude::*;

use crate::harness;
use harness::{Env, on};

use super::{Poisonable, job, operator_of};

on!(
    [standalone, cluster]
    a_pause_holds_every_reader_until_resume_and_outlives_a_restart,
    a_queue_with_partitions_is_seen_and_paused_per_partition_or_whole,
);

async fn a_pause_holds_every_reader_until_resume_and_outlives_a_restart(env: &Env) {
    let handler = Poisonable::default();
    let h = handler.clone();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(
            subscriber(
                RedisList::new("{paused}")
                    .reliable()
                    .block(Duration::from_millis(200)),
                h.clone(),
            )
            .build(),
        );
    };
    let op = operator_of(&env.app(mount.clone())).await;
    let publisher = env.broker().publisher();

    // Paused before the instances start: they read the pause key when they open.
    op.pause("{paused}", "test").await.unwrap();
    assert_eq!(
        op.inspect(Some("{paused}")).await.unwrap()[0].paused,
        Some(true)
    );
    let first = env.start_with(mount.clone()).await;
    let second = env.start_with(mount.clone()).await;
    publisher
        .message(&job(7, false))
        .to("{paused}")
        .publish()
        .await
        .unwrap();
    // A negative observation needs a window: two reads and a pause poll.
    tokio::time::sleep(ruststream::redis::operate::PAUSE_POLL + Duration::from_millis(400)).await;
    assert!(handler.seen().is_empty(), "a paused subscription claimed");
    assert_eq!(env.llen("{paused}").await, 1);

    // Resumed: both instances read again at once (the PUBLISH wakes their gates).
    op.resume("{paused}").await.unwrap();
    env.eventually("the job is handled after resume", async || {
        handler.seen().len() == 1
    })
    .await;

    // Paused while running: within one read (200 ms) and the gate's wake-up, nothing more is
    // claimed, in either instance.
    op.pause("{paused}", "test").await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    publisher
        .message(&job(8, false))
        .to("{paused}")
        .publish()
        .await
        .unwrap();
    tokio::time::sleep(ruststream::redis::operate::PAUSE_POLL).await;
    assert_eq!(handler.seen().len(), 1, "a paused subscription claimed");

    // The pause is in Redis: a restarted instance stays paused too.
    env.stop(first).await;
    env.stop(second).await;
    let restarted = env.start_with(mount).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        handler.seen().len(),
        1,
        "a restarted paused subscription claimed"
    );
    op.resume("{paused}").await.unwrap();
    env.eventually("the second job is handled after resume", async || {
        handler.seen().len() == 2
    })
    .await;
    env.stop(restarted).await;
}

/// A queue spread over partitions: `inspect` by its name shows each partition, `dead` works on
/// one partition by its key, `pause`/`resume` by its name act on every partition.
async fn a_queue_with_partitions_is_seen_and_paused_per_partition_or_whole(env: &Env) {
    let mount = |b: &mut Mount<RedisBroker>| {
        let jobs = RedisList::new("jobs").reliable().partitions(3);
        b.include(subscriber(jobs, Poisonable::default()).build());
    };
    let app = || env.app(mount);
    let op = operator_of(&app()).await;
    let names: Vec<&str> = op.subscriptions().iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, ["{jobs:0}", "{jobs:1}", "{jobs:2}"]);
    env.lpush_raw("{jobs:1}", "x").await;
    let seen = op.inspect(Some("jobs")).await.expect("inspect");
    let ready: Vec<(String, Option<u64>)> = seen
        .iter()
        .map(|i| (i.keys.name.clone(), i.ready))
        .collect();
    assert_eq!(
        ready,
        [
            ("{jobs:0}".into(), Some(0)),
            ("{jobs:1}".into(), Some(1)),
            ("{jobs:2}".into(), Some(0))
        ]
    );
    let code = |words: &'static [&'static str]| async move { run_args(app(), words).await };
    assert_eq!(
        code(&["inspect", "jobs", "--json"]).await,
        ExitCode::SUCCESS
    );
    assert_eq!(code(&["dead", "list", "{jobs:2}"]).await, ExitCode::SUCCESS);
    assert_eq!(code(&["pause", "jobs"]).await, ExitCode::SUCCESS);
    for i in 0..3 {
        assert!(
            env.exists(&format!("{{jobs:{i}}}.paused")).await,
            "partition {i}"
        );
    }
    assert_eq!(code(&["resume", "{jobs:1}"]).await, ExitCode::SUCCESS);
    assert!(!env.exists("{jobs:1}.paused").await);
    assert!(env.exists("{jobs:0}.paused").await);
    assert_eq!(code(&["resume", "jobs"]).await, ExitCode::SUCCESS);
    for i in 0..3 {
        assert!(
            !env.exists(&format!("{{jobs:{i}}}.paused")).await,
            "partition {i}"
        );
    }
}
