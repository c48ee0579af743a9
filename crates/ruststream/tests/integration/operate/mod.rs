//! The operator's tools: `inspect`, dead letters (list, show, requeue, purge), delayed
//! entries (list, promote, cancel) and pause/resume, through `ruststream::operate` (the library
//! the CLI and the dashboard share) and through its command words (`run_args`, what `run_main`
//! runs), on the stand's standalone server and cluster.

mod history;
mod inspect;
mod jobs;
mod pause;
mod stories;
mod timeline;

use std::future::Future;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ruststream::Mount;
use ruststream::operate::{operators, run_args};
use ruststream::prelude::*;
use ruststream::redis::operate::{Operator, Select};

use crate::harness;
use harness::{Env, on};

on!(
    [standalone, cluster]
    a_poisoned_message_is_found_read_fixed_and_requeued_with_attempt_1,
    requeue_all_on_a_stream_and_purge_on_a_simple_list,
    delayed_entries_are_listed_promoted_and_cancelled,
    the_command_words_and_their_exit_codes,
);

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Job {
    n: u32,
    poison: bool,
}
outgoing!(Job);

/// What a handler saw of one delivery.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    n: u32,
    attempt: u32,
    history: Option<String>,
}

/// Retries poisoned jobs while `broken`; records every delivery.
#[derive(Clone, Default)]
struct Poisonable {
    seen: Arc<Mutex<Vec<Seen>>>,
    broken: Arc<AtomicBool>,
}

impl Handle<Job> for Poisonable {
    fn handle(
        &self,
        job: &Job,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        self.seen.lock().unwrap().push(Seen {
            n: job.n,
            attempt: ctx.attempt(),
            history: ctx.header("dead-history").map(str::to_owned),
        });
        let fail = job.poison && self.broken.load(Ordering::SeqCst);
        async move {
            if fail {
                Err(HandlerOutcome::retry())
            } else {
                Ok(())
            }
        }
    }
}

impl Poisonable {
    fn broken() -> Self {
        let p = Self::default();
        p.broken.store(true, Ordering::SeqCst);
        p
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn job(n: u32, poison: bool) -> Job {
    Job { n, poison }
}

/// The operator of `app` (its one broker), connected.
pub(crate) async fn operator_of(app: &RustStream) -> Operator {
    let op = operators(app).pop().expect("the app has a Redis broker");
    op.connect().await.expect("the operator connects");
    op
}

async fn dead_count(op: &Operator, name: &str) -> usize {
    op.dead_letters(name, 1000)
        .await
        .expect("dead letters")
        .len()
}

async fn a_poisoned_message_is_found_read_fixed_and_requeued_with_attempt_1(env: &Env) {
    let handler = Poisonable::broken();
    let source = || {
        RedisList::new("{orders}")
            .reliable()
            .max_attempts(2)
            .retry(Backoff::fixed(Duration::from_millis(10)))
    };
    let mount = |h: Poisonable| {
        move |b: &mut Mount<RedisBroker>| {
            b.include(subscriber(source(), h).build());
        }
    };
    let op = operator_of(&env.app(mount(handler.clone()))).await;
    let running = env.start_with(mount(handler.clone())).await;
    let publisher = env.broker().publisher();
    publisher
        .message(&job(1, true))
        .to("{orders}")
        .publish()
        .await
        .unwrap();
    publisher
        .message(&job(2, false))
        .to("{orders}")
        .publish()
        .await
        .unwrap();
    env.eventually("the poisoned job is dead", async || {
        dead_count(&op, "{orders}").await == 1
    })
    .await;

    // Found and read: decoded, with its reason and its payload as JSON.
    let dead = op.dead_letters("{orders}", 10).await.unwrap();
    let letter = &dead[0];
    assert_eq!(letter.attempt, 2);
    assert_eq!(letter.reason.as_deref(), Some("max-attempts"));
    assert_eq!(letter.payload, serde_json::json!({"n": 1, "poison": true}));
    assert!(!letter.headers.contains_key("reason"), "{letter:?}");
    let shown = op.dead_letter("{orders}", &letter.id).await.unwrap();
    assert_eq!(shown.map(|d| d.id), Some(letter.id.clone()));
    assert!(
        op.dead_letter("{orders}", "no-such-id")
            .await
            .unwrap()
            .is_none()
    );

    // Fixed, then requeued: the handler sees it again with attempt 1 and the history.
    handler.broken.store(false, Ordering::SeqCst);
    let moved = op
        .requeue("{orders}", &Select::Id(letter.id.clone()))
        .await
        .unwrap();
    assert_eq!(moved, 1);
    env.eventually("the requeued job is handled", async || {
        handler
            .seen()
            .iter()
            .any(|s| s.n == 1 && s.history.is_some())
    })
    .await;
    let again: Vec<Seen> = handler
        .seen()
        .into_iter()
        .filter(|s| s.history.is_some())
        .collect();
    assert_eq!(
        again,
        vec![Seen {
            n: 1,
            attempt: 1,
            history: Some("max-attempts".into())
        }]
    );
    assert_eq!(dead_count(&op, "{orders}").await, 0);
    assert_eq!(
        op.requeue("{orders}", &Select::Id(letter.id.clone()))
            .await
            .unwrap(),
        0,
        "an id requeued already matches nothing"
    );
    env.stop(running).await;
}

async fn requeue_all_on_a_stream_and_purge_on_a_simple_list(env: &Env) {
    let handler = Poisonable::broken();
    let h = handler.clone();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(
            subscriber(
                RedisStream::new("{events}").group("g").max_attempts(1),
                h.clone(),
            )
            .build(),
        );
        b.include(subscriber(RedisList::new("{cache}"), Poisonable::default()).build());
    };
    let op = operator_of(&env.app(mount.clone())).await;
    let running = env.start_with(mount).await;
    let publisher = env.broker().publisher();
    for n in 0..5 {
        publisher
            .message(&job(n, true))
            .to("{events}")
            .publish()
            .await
            .unwrap();
    }
    env.eventually("five stream entries are dead", async || {
        dead_count(&op, "{events}").await == 5
    })
    .await;
    handler.broken.store(false, Ordering::SeqCst);
    let moved = op
        .requeue("{events}", &Select::All { limit: Some(3) })
        .await
        .unwrap();
    assert_eq!(moved, 3);
    assert_eq!(dead_count(&op, "{events}").await, 2);
    assert_eq!(
        op.requeue("{events}", &Select::All { limit: None })
            .await
            .unwrap(),
        2
    );
    env.eventually("every requeued entry is handled once more", async || {
        handler
            .seen()
            .iter()
            .filter(|s| s.history.is_some())
            .count()
            == 5
    })
    .await;
    assert!(
        handler
            .seen()
            .iter()
            .filter(|s| s.history.is_some())
            .all(|s| s.attempt == 1)
    );

    // A simple list's dead letters: an id-less raw value is `#N`; purge by id, then the rest.
    let dead = "{cache}.dead";
    env.lpush_raw(dead, "not a frame").await;
    env.lpush_raw(dead, "second").await;
    env.lpush_raw(dead, "third").await;
    let letters = op.dead_letters("{cache}", 10).await.unwrap();
    let ids: Vec<&str> = letters.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["#1", "#2", "#3"]);
    assert_eq!(letters[0].payload, serde_json::json!("not a frame"));
    assert_eq!(
        op.purge("{cache}", &Select::Id("#2".into())).await.unwrap(),
        1
    );
    let left: Vec<serde_json::Value> = op
        .dead_letters("{cache}", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.payload)
        .collect();
    assert_eq!(
        left,
        [serde_json::json!("not a frame"), serde_json::json!("third")]
    );
    assert_eq!(
        op.purge("{cache}", &Select::All { limit: Some(1) })
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        op.purge("{cache}", &Select::All { limit: None })
            .await
            .unwrap(),
        1
    );
    assert_eq!(env.llen(dead).await, 0);
    env.stop(running).await;
}

async fn delayed_entries_are_listed_promoted_and_cancelled(env: &Env) {
    let handler = Poisonable::default();
    let h = handler.clone();
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(subscriber(RedisList::new("{later}").reliable(), h.clone()).build());
    };
    let op = operator_of(&env.app(mount.clone())).await;
    let running = env.start_with(mount).await;
    let publisher = env.broker().publisher();
    for n in 0..3 {
        publisher
            .message(&job(n, false))
            .to("{later}")
            .id(format!("job-{n}"))
            .delay(Duration::from_secs(3600 + u64::from(n)))
            .publish()
            .await
            .unwrap();
    }
    let listed = op.delayed("{later}", 10).await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["job-0", "job-1", "job-2"]);
    assert!(listed[0].due_in_ms > 3_500_000, "{:?}", listed[0]);
    assert_eq!(
        listed[1].payload,
        serde_json::json!({"n": 1, "poison": false})
    );

    assert_eq!(
        op.promote("{later}", &Select::Id("job-1".into()))
            .await
            .unwrap(),
        1
    );
    env.eventually("the promoted job is handled", async || {
        handler.seen().iter().any(|s| s.n == 1)
    })
    .await;
    assert_eq!(
        op.cancel("{later}", &Select::Id("job-0".into()))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        op.cancel("{later}", &Select::Id("job-0".into()))
            .await
            .unwrap(),
        0
    );
    let left: Vec<String> = op
        .delayed("{later}", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(left, ["job-2"]);
    assert_eq!(env.hlen("{later}.delayed.payloads").await, 1);
    assert_eq!(
        op.promote("{later}", &Select::All { limit: None })
            .await
            .unwrap(),
        1
    );
    env.eventually("every promoted job is handled", async || {
        handler.seen().iter().any(|s| s.n == 2)
    })
    .await;
    assert!(
        handler.seen().iter().all(|s| s.n != 0),
        "a cancelled job ran"
    );
    env.stop(running).await;
}

async fn the_command_words_and_their_exit_codes(env: &Env) {
    let mount = |b: &mut Mount<RedisBroker>| {
        b.include(subscriber(RedisList::new("{cli}").reliable(), Poisonable::default()).build());
        b.include(subscriber(RedisChannel::new("ticks"), Poisonable::default()).build());
    };
    let app = || env.app(mount);
    env.lpush_raw("{cli}.dead", "a").await;
    env.lpush_raw("{cli}.dead", "b").await;
    let code = |words: &'static [&'static str]| async move { run_args(app(), words).await };
    assert_eq!(code(&["inspect", "--json"]).await, ExitCode::SUCCESS);
    assert_eq!(
        code(&["dead", "list", "{cli}", "--json"]).await,
        ExitCode::SUCCESS
    );
    assert_eq!(
        code(&["inspect", "nope"]).await,
        ExitCode::from(2),
        "unknown subscription"
    );
    assert_eq!(
        code(&["dead", "frobnicate", "{cli}"]).await,
        ExitCode::from(2),
        "bad usage"
    );
    assert_eq!(
        code(&["dead", "requeue", "{cli}"]).await,
        ExitCode::from(2),
        "no --id/--all"
    );
    assert_eq!(
        code(&["dead", "show", "{cli}", "--id", "missing"]).await,
        ExitCode::from(3),
        "nothing matched"
    );
    assert_eq!(
        code(&["flow", "show", "missing"]).await,
        ExitCode::from(3),
        "no flow on any queue"
    );
    assert_eq!(
        code(&["flow", "show", "missing", "--subscription", "{cli}"]).await,
        ExitCode::from(3),
        "no flow on {{cli}}"
    );
    // Tests have no terminal: a purge without --yes is refused and deletes nothing.
    assert_eq!(
        code(&["dead", "purge", "{cli}", "--all"]).await,
        ExitCode::from(2)
    );
    assert_eq!(env.llen("{cli}.dead").await, 2);
    assert_eq!(
        code(&["dead", "purge", "{cli}", "--id", "#1", "--yes"]).await,
        ExitCode::SUCCESS
    );
    assert_eq!(env.llen("{cli}.dead").await, 1);
    assert_eq!(
        code(&["pause", "ticks"]).await,
        ExitCode::FAILURE,
        "Pub/Sub cannot pause"
    );
    assert_eq!(code(&["pause", "{cli}"]).await, ExitCode::SUCCESS);
    assert!(env.exists("{cli}.paused").await);
    assert_eq!(code(&["resume", "{cli}"]).await, ExitCode::SUCCESS);
    assert!(!env.exists("{cli}.paused").await);
}

/// Through the sentinels: the operator finds the primary the sentinels name, as the app does.
#[tokio::test]
async fn the_operator_works_through_the_sentinels() {
    let Some((service, hosts)) = harness::sentinel_stand() else {
        return;
    };
    let prefix = format!("{}:", harness::unique("sentinel-operate"));
    let broker = RedisBroker::sentinel(service, hosts).prefix(&prefix);
    let app = RustStream::new(AppInfo::new("sentinel", "0.0.0")).with_broker(broker.clone(), |b| {
        b.include(subscriber(RedisList::new("{s}").reliable(), Poisonable::default()).build());
    });
    let op = operator_of(&app).await;
    broker.connect().await.unwrap();
    broker
        .publisher()
        .message(&job(1, false))
        .to("{s}")
        .delay(Duration::from_secs(600))
        .id("d1")
        .publish()
        .await
        .unwrap();
    let i = op.inspect(Some("{s}")).await.unwrap().remove(0);
    assert_eq!(
        (i.ready, i.delayed, i.paused),
        (Some(0), Some(1), Some(false))
    );
    op.pause("{s}", "test").await.unwrap();
    assert_eq!(op.inspect(Some("{s}")).await.unwrap()[0].paused, Some(true));
    op.resume("{s}").await.unwrap();
    assert_eq!(op.cancel("{s}", &Select::Id("d1".into())).await.unwrap(), 1);
    assert_eq!(op.inspect(Some("{s}")).await.unwrap()[0].delayed, Some(0));
}
