//! Conformance: the same scenarios, with the same assertions, on the in-memory Redis model of
//! `ruststream::testing` (on a paused, virtual clock) and on a real Redis, so the model cannot
//! drift from Redis.
//!
//! A scenario is `async fn name(env: &Env)` (see `harness`): it builds apps on `env.broker()`,
//! publishes, lets time pass with `env.advance(d)` / `env.eventually(..)` (virtual on the model,
//! real on Redis), and inspects keys with raw commands on `env.client` (a fred client on the
//! model or the server). Scenarios live in one file per feature under `conformance/`.
//! **Adding one**: write the `async fn` in its feature's file and add its name to that file's
//! `on!` line: `[memory, standalone]` for everything, plus `memory_cluster` and `cluster` where
//! the cluster matters. Each becomes `<feature>::<name>::memory`, `...::standalone`, ...

use crate::harness;

#[path = "conformance/keys.rs"]
mod keys;
#[path = "conformance/lists.rs"]
mod lists;
#[path = "conformance/pubsub.rs"]
mod pubsub;
#[path = "conformance/streams.rs"]
mod streams;

use std::time::Duration;

use harness::Env;
use ruststream::prelude::*;
use ruststream::{RunningApp, Source};

// ---------------------------------------------------------------------------------------------
// A handler that records deliveries and settles them as a plan says.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

fn job_json(n: u32) -> String {
    format!("{{\"n\":{n}}}")
}

/// What the handler does on a given attempt.
#[derive(Debug, Clone, Copy)]
enum Act {
    Ack,
    Settle(HandlerOutcome),
    Hang,
}

/// The harness's recorder of every delivery ([`harness::Seen`]), settling as a plan says for
/// each attempt.
type Rec = harness::Seen<Job>;

impl Rec {
    fn planned(plan: fn(u32) -> Act) -> Self {
        Self::deciding(move |_, attempt, _| match plan(attempt) {
            Act::Ack => harness::ack(),
            Act::Settle(o) => harness::settle(o),
            Act::Hang => harness::hang(),
        })
    }

    fn attempts(&self) -> Vec<u32> {
        self.seen().iter().map(|s| s.attempt).collect()
    }
}

/// An app on `env` handling `source` with a recorder that follows `plan`: the recorder, and the
/// app, started.
async fn start_planned(
    env: &Env,
    source: impl Source<Broker = RedisBroker>,
    plan: fn(u32) -> Act,
) -> (Rec, RunningApp) {
    let rec = Rec::planned(plan);
    let r = rec.clone();
    let app = env
        .start_with(|b| {
            b.include(subscriber(source, r).build());
        })
        .await;
    (rec, app)
}

/// Acks every attempt.
fn always_ack(_: u32) -> Act {
    Act::Ack
}

/// Retries the first attempt at once, acks the second.
fn retry_once(attempt: u32) -> Act {
    if attempt == 1 {
        Act::Settle(HandlerOutcome::retry())
    } else {
        Act::Ack
    }
}

/// Retries the first attempt after 300 ms, acks the second.
fn retry_after_300ms(attempt: u32) -> Act {
    if attempt == 1 {
        Act::Settle(HandlerOutcome::retry_after(Duration::from_millis(300)))
    } else {
        Act::Ack
    }
}

/// Drops every attempt (a dead letter).
fn drop_it(_: u32) -> Act {
    Act::Settle(HandlerOutcome::drop())
}

/// Retries every attempt.
fn always_retry(_: u32) -> Act {
    Act::Settle(HandlerOutcome::retry())
}

/// Never finishes the first attempt (a crashed worker), acks the next.
fn hang_first(attempt: u32) -> Act {
    if attempt == 1 { Act::Hang } else { Act::Ack }
}

/// Publishes `jobs` to `key` with the test's broker.
async fn publish(env: &Env, key: &str, jobs: &[Job]) {
    env.broker()
        .publisher()
        .messages(jobs)
        .to(key)
        .publish()
        .await
        .expect("publish");
}

/// Waits until `rec` has seen at least `n` deliveries.
async fn wait_seen(env: &Env, rec: &Rec, n: usize) {
    env.eventually(&format!("{n} deliveries"), async || rec.count() >= n)
        .await;
}
