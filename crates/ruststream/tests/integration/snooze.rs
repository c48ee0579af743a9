//! Snooze: `HandlerOutcome::snooze(d)` puts a message back after `d`
//! without spending an attempt, through the delayed path retries use. The snooze count travels
//! with the message (`ctx.snoozes()`, across retries too); past `.max_snoozes(n)` the message
//! is dead-lettered `snoozed-too-often`. On a reliable list, a stream group, and a list with
//! priorities (it comes back onto its level); a simple list cannot redeliver (the snooze is
//! ignored, as a retry is).

use crate::harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Env, WAIT, on, wait_until};
use ruststream::prelude::*;
use ruststream::{Source, list, subscriber};
use tokio::time::Instant;

on!(
    [memory, standalone, cluster] multi_thread:
    a_snooze_keeps_the_attempt_and_counts_the_snoozes,
    the_snooze_count_survives_a_retry,
    past_max_snoozes_is_dead_lettered_snoozed_too_often,
    a_snooze_on_a_stream,
    a_snoozed_message_goes_back_to_its_level,
);

on!([memory] a_snooze_on_a_simple_list_is_ignored);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

const NAP: Duration = Duration::from_millis(100);

/// One delivery as the handler saw it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    attempt: u32,
    snoozes: u32,
    /// The `rs.priority` header.
    priority: Option<String>,
    /// Whether the library's snooze header leaked into the user's headers.
    leaked: bool,
    at: Instant,
}

/// Records every delivery, then settles as `decide(attempt, snoozes)` says.
#[derive(Clone)]
struct Snoozer {
    seen: Arc<Mutex<Vec<Seen>>>,
    decide: fn(u32, u32) -> Result<(), HandlerOutcome>,
}

impl Snoozer {
    fn new(decide: fn(u32, u32) -> Result<(), HandlerOutcome>) -> Self {
        Self {
            seen: Arc::default(),
            decide,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    /// `(attempt, snoozes)` of every delivery.
    fn counts(&self) -> Vec<(u32, u32)> {
        self.seen().iter().map(|s| (s.attempt, s.snoozes)).collect()
    }
}

impl Handle<Job> for Snoozer {
    async fn handle(&self, _: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.seen.lock().expect("lock").push(Seen {
            attempt: ctx.attempt(),
            snoozes: ctx.snoozes(),
            priority: ctx.header("rs.priority").map(str::to_owned),
            leaked: ctx.header("rs.snoozes").is_some(),
            at: Instant::now(),
        });
        (self.decide)(ctx.attempt(), ctx.snoozes())
    }
}

/// Snoozes three times, then acknowledges.
fn three_naps(_: u32, snoozes: u32) -> Result<(), HandlerOutcome> {
    if snoozes < 3 {
        Err(HandlerOutcome::snooze(NAP))
    } else {
        Ok(())
    }
}

async fn run(
    env: &Env,
    source: impl Source<Broker = RedisBroker>,
    producer: RedisBroker,
    to: &str,
    handler: &Snoozer,
    done: impl AsyncFnMut() -> bool,
) {
    let h = handler.clone();
    let running = env
        .start_with(move |b| {
            b.include(subscriber(source, h).build());
        })
        .await;
    producer.connect().await.expect("connect");
    producer
        .publisher()
        .message(&Job { n: 1 })
        .to(to)
        .publish()
        .await
        .expect("publish");
    wait_until("done", WAIT, done).await;
    env.stop(running).await;
}

/// Each snooze comes back after its delay with attempt 1 and one more snooze; the library's
/// header is not among the user's.
async fn a_snooze_keeps_the_attempt_and_counts_the_snoozes(env: &Env) {
    let handler = Snoozer::new(three_naps);
    let list = RedisList::new("{sz}").reliable();
    run(env, list, env.broker(), "{sz}", &handler, async || {
        handler.seen().len() == 4 && env.llen("{sz}.processing").await == 0
    })
    .await;
    assert_eq!(handler.counts(), [(1, 0), (1, 1), (1, 2), (1, 3)]);
    let seen = handler.seen();
    assert!(
        seen.iter().all(|s| !s.leaked),
        "rs.snoozes is not a user header"
    );
    for pair in seen.windows(2) {
        assert!(pair[1].at - pair[0].at >= NAP, "back before its delay");
    }
    assert_eq!(env.llen("{sz}").await, 0);
    assert_eq!(env.llen("{sz}.dead").await, 0, "nothing dead");
}

/// Snoozed once, then retried: the retry raises the attempt and keeps the snooze count.
async fn the_snooze_count_survives_a_retry(env: &Env) {
    let handler = Snoozer::new(|attempt, snoozes| match (attempt, snoozes) {
        (1, 0) => Err(HandlerOutcome::snooze(NAP)),
        (1, _) => Err(HandlerOutcome::retry()),
        _ => Ok(()),
    });
    let list = RedisList::new("{sr}")
        .reliable()
        .retry(Backoff::fixed(Duration::from_millis(50)));
    run(env, list, env.broker(), "{sr}", &handler, async || {
        handler.seen().len() == 3 && env.llen("{sr}.processing").await == 0
    })
    .await;
    assert_eq!(handler.counts(), [(1, 0), (1, 1), (2, 1)]);
}

/// Always snoozing with `max_snoozes(2)`: two snoozes, and the third is a dead letter with
/// reason `snoozed-too-often`, on attempt 1 and with its count.
async fn past_max_snoozes_is_dead_lettered_snoozed_too_often(env: &Env) {
    let handler = Snoozer::new(|_, _| Err(HandlerOutcome::snooze(NAP)));
    let list = RedisList::new("{sm}").reliable().max_snoozes(2);
    run(env, list, env.broker(), "{sm}", &handler, async || {
        env.llen("{sm}.dead").await == 1
    })
    .await;
    assert_eq!(handler.counts(), [(1, 0), (1, 1), (1, 2)]);
    let dead = env.frames("{sm}.dead").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempt, 1, "a snooze spends no attempt");
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("snoozed-too-often")
    );
    assert_eq!(
        dead[0].headers.get("rs.snoozes").map(String::as_str),
        Some("2")
    );
}

/// On a stream group: the settle re-adds the entry with its count and attempt.
async fn a_snooze_on_a_stream(env: &Env) {
    let handler = Snoozer::new(three_naps);
    let stream = RedisStream::new("{ss}").group("g");
    let producer = env.broker_with(|b| b.route("{ss}", ruststream::stream::Publish::new()));
    run(env, stream, producer, "{ss}", &handler, async || {
        handler.seen().len() == 4 && env.pending("{ss}", "g").await == 0
    })
    .await;
    assert_eq!(handler.counts(), [(1, 0), (1, 1), (1, 2), (1, 3)]);
    assert!(handler.seen().iter().all(|s| !s.leaked));
}

/// A message of level 1 snoozed comes back onto level 1.
async fn a_snoozed_message_goes_back_to_its_level(env: &Env) {
    let handler = Snoozer::new(|_, snoozes| {
        if snoozes == 0 {
            Err(HandlerOutcome::snooze(NAP))
        } else {
            Ok(())
        }
    });
    let h = handler.clone();
    let list = RedisList::new("{sp}").reliable().priorities(2);
    let running = env
        .start_with(move |b| {
            b.include(subscriber(list, h).build());
        })
        .await;
    let producer = env.broker_with(|b| b.route("{sp}", list::Publish::new().priorities(2)));
    producer.connect().await.expect("connect");
    producer
        .publisher()
        .message(&Job { n: 1 })
        .to("{sp}")
        .priority(1)
        .publish()
        .await
        .expect("publish");
    wait_until("snoozed and back", WAIT, async || {
        handler.seen().len() == 2 && env.llen("{sp}.processing").await == 0
    })
    .await;
    env.stop(running).await;
    let seen = handler.seen();
    assert_eq!(handler.counts(), [(1, 0), (1, 1)]);
    assert_eq!(
        seen[1].priority.as_deref(),
        Some("1"),
        "back onto its level"
    );
}

/// A simple list pops the message before its handler runs: a snooze cannot put it back, and
/// is ignored (logged and counted) as a retry is.
async fn a_snooze_on_a_simple_list_is_ignored(env: &Env) {
    let handler = Snoozer::new(|_, _| Err(HandlerOutcome::snooze(NAP)));
    let list = RedisList::new("{sl}");
    run(env, list, env.broker(), "{sl}", &handler, async || {
        if handler.seen().len() != 1 {
            return false;
        }
        // Long enough for a snooze to come back, had it been put back.
        env.advance(NAP * 3).await;
        true
    })
    .await;
    assert_eq!(handler.counts(), [(1, 0)], "not delivered again");
    assert_eq!(env.llen("{sl}").await, 0);
    assert_eq!(env.zcard("{sl}.delayed").await, 0, "nothing scheduled");
}
