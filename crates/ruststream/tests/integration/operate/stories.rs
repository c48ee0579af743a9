//! A job's whole story through the operator library and the `job` command words: a stream's
//! pending entries (with their consumer and idle time) and the entries waiting for its group;
//! completed jobs where results are kept; a retrying job's step records; a flow child's flow.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ruststream::Mount;
use ruststream::operate::run_args;
use ruststream::prelude::*;
use ruststream::redis::operate::{JobState, StepState};
use tokio::sync::Semaphore;

use crate::harness;
use harness::{Env, WAIT, on, wait_until};

use super::{Job, job, operator_of};

on!(
    [standalone, cluster]
    a_stream_lists_its_pending_and_waiting_entries,
    completed_jobs_steps_and_flows_tell_the_story,
    rate_limits_show_their_use_and_caps_their_bound,
    a_fair_lists_groups_waiting_entries_are_listed,
);

/// Holds every handler until it is opened.
#[derive(Clone)]
struct Gate(Arc<Semaphore>);

impl Gate {
    fn shut() -> Self {
        Self(Arc::new(Semaphore::new(0)))
    }

    fn open(&self) {
        self.0.add_permits(Semaphore::MAX_PERMITS / 2);
    }
}

impl Handle<Job> for Gate {
    async fn handle(&self, _: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let permit = self
            .0
            .acquire()
            .await
            .map_err(|_| HandlerOutcome::retry())?;
        permit.forget();
        Ok(())
    }
}

async fn a_stream_lists_its_pending_and_waiting_entries(env: &Env) {
    let began = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .expect("a clock after 1970")
        - 1000;
    let gate = Gate::shut();
    let handler = gate.clone();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(
            subscriber(
                RedisStream::new("{feed}").group("g").concurrency(1),
                handler.clone(),
            )
            .build(),
        );
    };
    let app = env.app(mount.clone());
    let op = operator_of(&app).await;
    let publisher = env.broker().publisher();
    let running = env.start(app).await;
    for n in 0..6 {
        publisher
            .message(&job(n, false))
            .to("{feed}")
            .id(format!("ev-{n}"))
            .header("tenant", "acme")
            .publish()
            .await
            .expect("publish");
    }
    wait_until("the reader holds an entry", WAIT, async || {
        op.jobs("{feed}", JobState::Running, 0, 10)
            .await
            .is_ok_and(|p| p.total >= 1)
    })
    .await;
    let pending = op
        .jobs("{feed}", JobState::Running, 0, 10)
        .await
        .expect("pending");
    let waiting = op
        .jobs("{feed}", JobState::Queued, 0, 10)
        .await
        .expect("waiting");
    assert_eq!(pending.total + waiting.total, 6, "{pending:?} {waiting:?}");
    assert_eq!(pending.jobs.len() as u64, pending.total);
    assert_eq!(waiting.jobs.len() as u64, waiting.total);
    let first = &pending.jobs[0];
    assert_eq!(first.id, "ev-0", "the oldest is held first");
    assert!(first.worker.as_deref().is_some_and(|w| !w.is_empty()));
    assert!(first.entry.is_some() && first.running_ms.is_some());
    assert_eq!(first.deliveries, Some(1));
    // Its timeline ends with its claim: the consumer, and when (the server's now less its idle
    // time), not before the test began.
    let claimed = first.timeline().pop().expect("a timeline");
    assert_eq!(claimed.kind, "claimed");
    assert_eq!(Some(&claimed.detail), first.worker.as_ref());
    assert!(claimed.at_ms.is_some_and(|at| at >= began), "{claimed:?}");
    assert_eq!(
        first.headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    assert_eq!(first.payload["n"], 0);
    let ids: Vec<&str> = pending
        .jobs
        .iter()
        .chain(&waiting.jobs)
        .map(|j| j.id.as_str())
        .collect();
    assert_eq!(ids, ["ev-0", "ev-1", "ev-2", "ev-3", "ev-4", "ev-5"]);
    let last = waiting.jobs.last().expect("a waiting entry");
    let page = op
        .jobs("{feed}", JobState::Queued, waiting.jobs.len() - 1, 10)
        .await
        .expect("a later page");
    assert_eq!(page.jobs.len(), 1);
    assert_eq!(page.jobs[0].id, last.id);

    let found = op.find_job("ev-5").await.expect("a search");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].state, JobState::Queued);
    let app = || env.app(mount.clone());
    assert_eq!(
        run_args(app(), ["job", "list", "running"]).await,
        ExitCode::SUCCESS
    );
    assert_eq!(
        run_args(app(), ["job", "show", "ev-0", "--json"]).await,
        ExitCode::SUCCESS
    );

    gate.open();
    wait_until("every entry is handled", WAIT, async || {
        let p = op.jobs("{feed}", JobState::Running, 0, 10).await;
        let w = op.jobs("{feed}", JobState::Queued, 0, 10).await;
        matches!((p, w), (Ok(p), Ok(w)) if p.total == 0 && w.total == 0)
    })
    .await;
    env.stop(running).await;
}

/// Records a step; then sets a result, or (poisoned) asks to be retried in a minute.
#[derive(Clone)]
struct Charges;

impl Handle<Job> for Charges {
    async fn handle(&self, j: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let receipt: String = ctx
            .step("charge", || async {
                Ok::<_, String>(format!("receipt-{}", j.n))
            })
            .await?;
        if j.poison {
            return Err(HandlerOutcome::retry_after(Duration::from_secs(60)));
        }
        ctx.set_result(&serde_json::json!({ "receipt": receipt }))
            .await
            .map_err(|_| HandlerOutcome::retry())?;
        Ok(())
    }
}

async fn completed_jobs_steps_and_flows_tell_the_story(env: &Env) {
    let mount = |parts: bool| {
        move |b: &mut Mount<RedisBroker>| {
            b.include(subscriber(RedisList::new("{story}").reliable(), Charges).build());
            if parts {
                b.include(subscriber(RedisList::new("{parts}").reliable(), Charges).build());
            }
        }
    };
    // The operator knows `{parts}`; the app running does not read it, so a child waits there.
    let op = operator_of(&env.app(mount(true))).await;
    let running = env.start(env.app(mount(false))).await;
    let publisher = env.broker().publisher();
    publisher
        .message(&job(1, false))
        .to("{story}")
        .id("paid-1")
        .publish()
        .await
        .expect("publish");
    publisher
        .message(&job(2, true))
        .to("{story}")
        .id("retried-2")
        .publish()
        .await
        .expect("publish");
    publisher
        .flow(&job(10, false))
        .to("{story}")
        .id("f-1")
        .child(&job(11, false), "{parts}")
        .publish()
        .await
        .expect("publish the flow");

    wait_until("the first job completes", WAIT, async || {
        op.completed(0, 10)
            .await
            .is_ok_and(|p| p.jobs.iter().any(|j| j.id == "paid-1"))
    })
    .await;
    let done = op.completed(0, 10).await.expect("completed");
    let paid = done.jobs.iter().find(|j| j.id == "paid-1").expect("paid-1");
    assert_eq!(paid.state, JobState::Completed);
    assert_eq!(
        paid.result,
        Some(serde_json::json!({"receipt": "receipt-1"}))
    );
    assert!(paid.finished_ms_ago.is_some());
    let page = op
        .jobs("{story}", JobState::Completed, 0, 10)
        .await
        .expect("completed through jobs");
    assert_eq!(page.total, done.total);

    wait_until("the second job waits for its retry", WAIT, async || {
        op.jobs("{story}", JobState::Retrying, 0, 10)
            .await
            .is_ok_and(|p| p.jobs.iter().any(|j| j.id == "retried-2"))
    })
    .await;
    let steps = op
        .steps("{story}", "retried-2")
        .await
        .expect("steps")
        .expect("a step record");
    assert_eq!(steps.steps.len(), 1);
    assert_eq!(steps.steps[0].name, "charge");
    assert_eq!(steps.steps[0].size, "\"receipt-2\"".len() as u64);
    assert_eq!(steps.steps[0].state, StepState::Recorded);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis();
    let began = u128::from(steps.steps[0].began_ms.expect("when the step began"));
    assert!(
        began > now - 60_000 && began < now + 60_000,
        "began {began}, now {now}"
    );
    assert!(
        steps.steps[0].took_ms.is_some_and(|ms| ms < 60_000),
        "how long the step took"
    );
    assert!(steps.expires_in_ms.is_some_and(|ms| ms > 0));
    assert!(
        op.steps("{story}", "paid-1")
            .await
            .expect("steps")
            .is_none()
    );

    let child = op
        .find_job("f-1.0")
        .await
        .expect("a search")
        .into_iter()
        .next()
        .expect("the child waits in {parts}");
    assert_eq!(child.state, JobState::Queued);
    let flow = op
        .parent_flow(&child)
        .await
        .expect("the flow")
        .expect("the child's flow");
    assert_eq!((flow.id.as_str(), flow.state.as_str()), ("f-1", "pending"));
    assert_eq!(flow.children.len(), 1);
    let open = op.open_flows("{story}").await.expect("open flows");
    assert_eq!(
        open.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
        ["f-1"]
    );
    assert!(op.open_flows("{parts}").await.expect("none").is_empty());

    let app = || env.app(mount(true));
    assert_eq!(
        run_args(app(), ["job", "list", "completed"]).await,
        ExitCode::SUCCESS
    );
    assert_eq!(
        run_args(app(), ["job", "show", "retried-2"]).await,
        ExitCode::SUCCESS
    );
    assert_eq!(
        run_args(app(), ["job", "show", "f-1.0", "--json"]).await,
        ExitCode::SUCCESS
    );
    env.stop(running).await;
}

async fn rate_limits_show_their_use_and_caps_their_bound(env: &Env) {
    let per = Duration::from_secs(60);
    let handler = super::Poisonable::default();
    let seen = handler.clone();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(
            subscriber(
                RedisList::new("{limited}")
                    .reliable()
                    .rate_limit(5, per)
                    .max_in_flight(2),
                handler.clone(),
            )
            .build(),
        );
        b.include(
            subscriber(
                RedisList::new("{tenants}").rate_limit_by("tenant", 5, per),
                handler.clone(),
            )
            .build(),
        );
        b.include(
            subscriber(
                RedisList::new("parts")
                    .reliable()
                    .partitions(2)
                    .rate_limit(5, per),
                handler.clone(),
            )
            .build(),
        );
    };
    let app = env.app(mount.clone());
    let op = operator_of(&app).await;
    let idle = op
        .rate_use("{limited}")
        .await
        .expect("use")
        .expect("a limit");
    assert_eq!((idle.used, idle.limit.n, idle.limit.per_ms), (0, 5, 60_000));
    let running = env.start(app).await;
    let publisher = env.broker().publisher();
    for n in 0..3 {
        publisher
            .message(&job(n, false))
            .to("{limited}")
            .publish()
            .await
            .expect("publish");
    }
    for (n, tenant) in [(10, "acme"), (11, "acme"), (12, "globex")] {
        publisher
            .message(&job(n, false))
            .to("{tenants}")
            .header("tenant", tenant)
            .publish()
            .await
            .expect("publish");
    }
    for (n, partition) in [(20, "{parts:0}"), (21, "{parts:1}")] {
        publisher
            .message(&job(n, false))
            .to(partition)
            .publish()
            .await
            .expect("publish");
    }
    wait_until("all eight are handled", WAIT, async || {
        seen.seen().len() == 8
    })
    .await;
    let whole = op
        .rate_use("{limited}")
        .await
        .expect("use")
        .expect("a limit");
    assert_eq!(whole.used, 3, "{whole:?}");
    let keyed = op
        .rate_use("{tenants}")
        .await
        .expect("use")
        .expect("a limit");
    assert_eq!(keyed.limit.by_header.as_deref(), Some("tenant"));
    assert_eq!(keyed.keys, 2);
    assert_eq!(
        keyed.busiest,
        [("acme".to_owned(), 2), ("globex".to_owned(), 1)]
    );
    // A partitioned queue's limit holds over the whole queue: its first partition carries it.
    let limited: Vec<_> = op
        .subscriptions()
        .iter()
        .filter(|q| q.partition_of.as_deref() == Some("parts") && q.rate_limit.is_some())
        .collect();
    assert_eq!(limited.len(), 1, "shown once: {limited:?}");
    let parts = op
        .rate_use(&limited[0].name)
        .await
        .expect("use")
        .expect("a limit");
    // The partitions' reader reserves permits ahead, so all it holds counts as spent.
    assert_eq!(parts.limit.n, 5, "{parts:?}");
    assert!((2..=5).contains(&parts.used), "{parts:?}");
    let keys = op.find("{limited}").expect("the subscription");
    assert_eq!(keys.max_in_flight, Some(2));
    env.stop(running).await;
}

async fn a_fair_lists_groups_waiting_entries_are_listed(env: &Env) {
    let mount = |b: &mut Mount<RedisBroker>| {
        b.include(
            subscriber(
                RedisList::new("{fair}").reliable().groups(),
                super::Poisonable::default(),
            )
            .build(),
        );
    };
    // Nothing runs: what is published waits in its group.
    let op = operator_of(&env.app(mount)).await;
    let publisher = env.broker().publisher();
    for (n, group) in [
        (0, Some("acme")),
        (1, Some("globex")),
        (2, Some("acme")),
        (3, None),
    ] {
        let order = job(n, false);
        let message = publisher
            .message(&order)
            .to("{fair}")
            .id(format!("fair-{n}"));
        let message = match group {
            Some(g) => message.group(g),
            None => message,
        };
        message.publish().await.expect("publish");
    }
    let all = op
        .jobs("{fair}", JobState::Queued, 0, 10)
        .await
        .expect("queued");
    assert_eq!(all.total, 4);
    let mut ids: Vec<&str> = all.jobs.iter().map(|j| j.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["fair-0", "fair-1", "fair-2", "fair-3"]);
    let acme: Vec<&str> = all
        .jobs
        .iter()
        .filter(|j| j.headers.get("rs.group").map(String::as_str) == Some("acme"))
        .map(|j| j.id.as_str())
        .collect();
    assert_eq!(acme, ["fair-0", "fair-2"], "a group's entries oldest first");
    let second = op
        .jobs("{fair}", JobState::Queued, 3, 10)
        .await
        .expect("a later page");
    assert_eq!(second.jobs.len(), 1);
    let found = op.find_job("fair-1").await.expect("a search");
    assert_eq!(found.len(), 1);
}
