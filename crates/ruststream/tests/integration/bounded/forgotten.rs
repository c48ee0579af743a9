//! What is forgotten once nothing uses it: the periodic registry's jobs no instance runs any more
//! (after their bound; a live one is kept), and a stream group's consumers of gone instances
//! (removed by the recovery sweep).

use crate::harness;

use std::time::Duration;

use fred::prelude::*;
use fred::types::ClusterHash;
use harness::{Env, on};
use ruststream::RunningApp;
use ruststream::prelude::*;

use super::{Job, Worker, app_of, consumer_names};

on!(
    [memory, standalone, cluster] multi_thread:
    the_periodic_registry_forgets_a_job_not_seen_for_its_bound,
    a_streams_sweep_forgets_the_consumers_of_gone_instances,
);

on!([memory] the_periodic_registry_forgets_a_removed_job_after_a_week_and_keeps_a_live_one);

// -- the periodic registry ---------------------------------------------------------------------

/// A daily job `name` publishing a [`Job`] to `{ticks}`.
fn daily(name: &str) -> Periodic {
    Periodic::new(name, "0 0 0 * * *", ruststream::periodic::Tz::UTC)
        .to("{ticks}")
        .message(|| Job { n: 0 })
}

/// The registry, last-tick and seen hashes' full names (in the registry's slot on a cluster).
fn registry_keys(env: &Env) -> [String; 3] {
    let registry = env.key("ruststream:periodic");
    let derived = |suffix: &str| {
        if env.is_cluster() {
            format!("{{{registry}}}{suffix}")
        } else {
            format!("{registry}{suffix}")
        }
    };
    [registry.clone(), derived(".last"), derived(".seen")]
}

/// The job names of the hash `key`, sorted.
async fn names(env: &Env, key: &str) -> Vec<String> {
    let mut names: Vec<String> = env.client.hkeys(key).await.expect("HKEYS");
    names.sort();
    names
}

async fn start_jobs(env: &Env, jobs: Vec<Periodic>) -> RunningApp {
    env.start_with(move |b| {
        for j in jobs {
            b.periodic(j);
        }
    })
    .await
}

async fn the_periodic_registry_forgets_a_job_not_seen_for_its_bound(env: &Env) {
    let [registry, last, seen] = registry_keys(env);
    let app = start_jobs(env, vec![daily("kept"), daily("removed")]).await;
    env.stop(app).await;
    assert_eq!(names(env, &registry).await, ["kept", "removed"]);
    // `removed` was last seen long ago (its keep-until time is past), as if its code was
    // removed a week ago; `kept` is registered again by the next start.
    let _: i64 = env
        .client
        .hset(&seen, ("removed", "1000"))
        .await
        .expect("HSET");
    let _: i64 = env
        .client
        .hset(&last, ("removed", "1000"))
        .await
        .expect("HSET");
    let app = start_jobs(env, vec![daily("kept")]).await;
    env.stop(app).await;
    assert_eq!(
        names(env, &registry).await,
        ["kept"],
        "the registry forgot it"
    );
    assert_eq!(names(env, &seen).await, ["kept"]);
    assert!(
        !names(env, &last).await.contains(&"removed".to_owned()),
        "its last tick is forgotten too"
    );
}

async fn the_periodic_registry_forgets_a_removed_job_after_a_week_and_keeps_a_live_one(env: &Env) {
    let [registry, _, seen] = registry_keys(env);
    let app = start_jobs(env, vec![daily("live"), daily("removed")]).await;
    env.stop(app).await;
    // The next version of the code has `live` only, and runs for 8 days: its daily ticks mark
    // it seen, and the tick after `removed`'s week is over forgets `removed`.
    let app = start_jobs(env, vec![daily("live")]).await;
    env.advance(Duration::from_secs(6 * 24 * 3600)).await;
    assert_eq!(
        names(env, &registry).await,
        ["live", "removed"],
        "a job is kept a week"
    );
    env.advance(Duration::from_secs(2 * 24 * 3600)).await;
    env.eventually("the removed job forgotten", async || {
        names(env, &registry).await == ["live"]
    })
    .await;
    assert_eq!(names(env, &seen).await, ["live"]);
    env.stop(app).await;
}

// -- stream consumers ---------------------------------------------------------------------------

async fn a_streams_sweep_forgets_the_consumers_of_gone_instances(env: &Env) {
    let stream = env.key("{dc}");
    let _: Value = env
        .client
        .custom(
            fred::cmd!("XGROUP", hash: ClusterHash::from(stream.as_str())),
            vec!["CREATE", &stream, "g", "0", "MKSTREAM"],
        )
        .await
        .expect("XGROUP CREATE");
    for gone in ["gone-1", "gone-2", "live-2"] {
        let _: Value = env
            .client
            .custom(
                fred::cmd!("XGROUP", hash: ClusterHash::from(stream.as_str())),
                vec!["CREATECONSUMER", &stream, "g", gone],
            )
            .await
            .expect("XGROUP CREATECONSUMER");
    }
    // `gone-3` holds a pending entry: it is left to the sweep, which claims it first.
    let _: String = env
        .client
        .xadd(&stream, false, None, "*", ("payload", r#"{"n":1}"#))
        .await
        .expect("XADD");
    let _: Value = env
        .client
        .xreadgroup("g", "gone-3", Some(1), None, false, &stream, ">")
        .await
        .expect("XREADGROUP");
    let worker = Worker::acking();
    let source = RedisStream::new("{dc}")
        .group("g")
        .consumer("live")
        .min_idle(Duration::from_millis(100))
        .block(Duration::from_millis(100));
    let app = env
        .start(app_of(env.broker(), source, worker.clone()))
        .await;
    env.eventually("the pending entry swept and handled", async || {
        worker.seen().len() == 1
    })
    .await;
    // `live-2`, the subscription's second reader (two by default at concurrency 128), is as
    // idle as the gone ones (it exists before it reads, and on Redis 7.0 a read that got
    // nothing neither makes a consumer nor resets its idle time) and is never forgotten; `live`
    // is in the group only if it was the reader that claimed the pending entry.
    env.eventually("only the live consumers are left", async || {
        let names = consumer_names(env, "{dc}").await;
        names.contains(&"live-2".to_owned()) && names.iter().all(|n| n.starts_with("live"))
    })
    .await;
    env.stop(app).await;
}
