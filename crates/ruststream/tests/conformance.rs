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

mod harness;

#[path = "conformance/keys.rs"]
mod keys;
#[path = "conformance/lists.rs"]
mod lists;
#[path = "conformance/pubsub.rs"]
mod pubsub;
#[path = "conformance/streams.rs"]
mod streams;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::Env;
use ruststream::prelude::*;
use tokio::time::Instant;

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

/// One delivery as the handler saw it.
#[derive(Debug, Clone)]
struct Seen {
    n: u32,
    attempt: u32,
    id: String,
    at: Instant,
}

/// Records every delivery, then settles it as `plan` says for its attempt.
#[derive(Clone)]
struct Rec {
    seen: Arc<Mutex<Vec<Seen>>>,
    plan: fn(u32) -> Act,
}

impl Rec {
    fn new(plan: fn(u32) -> Act) -> Self {
        Self {
            seen: Arc::default(),
            plan,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    fn attempts(&self) -> Vec<u32> {
        self.seen().iter().map(|s| s.attempt).collect()
    }

    fn count(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }
}

impl Handle<Job> for Rec {
    async fn handle(&self, job: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.seen.lock().expect("lock").push(Seen {
            n: job.n,
            attempt: ctx.attempt(),
            id: ctx.message_id().to_owned(),
            at: Instant::now(),
        });
        match (self.plan)(ctx.attempt()) {
            Act::Ack => Ok(()),
            Act::Settle(o) => Err(o),
            Act::Hang => std::future::pending().await,
        }
    }
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
