//! Nothing stays stuck when a worker dies, a reply is lost or a recovery set expires, and a live
//! worker keeps what it holds: stream consumers killed with SIGKILL (child processes: this test
//! binary run again as `reliability::recovery::stream_worker_process`), claim and settle replies
//! thrown away by the proxy, an expired recovery set, handlers slower than `min_idle`, and a raw
//! value that starts like a frame.

mod lost_replies;
mod raw_values;
mod slow;

use std::future::Future;

use std::time::Duration;

use fred::prelude::*;
use ruststream::prelude::*;

use super::common::*;
use crate::harness::process::{WorkerProcess, test_name};
use crate::harness::{Env, on, stop, wait_until};

on!(
    [standalone]
    a_killed_consumers_stream_entries_are_claimed_by_another_after_min_idle,
    a_restarted_consumer_first_takes_back_its_own_pending_entries,
    a_stream_entry_that_kills_every_consumer_ends_in_the_dead_letters,
);

const Q: &str = "{jobs}";
const S: &str = "{s}";

fn k(suffix: &str) -> String {
    format!("{Q}{suffix}")
}

// ---------------------------------------------------------------------------------------------
// Stream consumers killed mid-handler.

/// The worker: a stream consumer of group `g` on [`S`] named `RELIABILITY_CONSUMER`, whose
/// handler records `<n>:<attempt>:<consumer>` on `<prefix>{s}.started` and never finishes.
#[test]
#[ignore = "the worker process of the stream recovery tests, which run it; does nothing on its own"]
fn stream_worker_process() {
    let Ok(url) = std::env::var("RELIABILITY_WORKER") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let prefix = var("RELIABILITY_PREFIX");
    let consumer = var("RELIABILITY_CONSUMER");
    let min_idle = Duration::from_millis(var("RELIABILITY_MIN_IDLE_MS").parse().unwrap());
    let max_attempts: u32 = var("RELIABILITY_MAX_ATTEMPTS").parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let raw = Builder::from_config(Config::from_url(&url).unwrap())
            .build()
            .unwrap();
        raw.init().await.unwrap();
        let handler = Starter {
            client: raw,
            key: format!("{prefix}{S}.started"),
            consumer: consumer.clone(),
        };
        let source = RedisStream::new(S)
            .group("g")
            .consumer(consumer)
            .min_idle(min_idle)
            .max_attempts(max_attempts)
            .block(Duration::from_millis(200));
        let _running = RustStream::new(AppInfo::new("stream-worker", "0"))
            .with_broker(RedisBroker::standalone(url).prefix(&prefix), |b| {
                b.include(subscriber(source, handler).build());
            })
            .start()
            .await
            .expect("the worker starts");
        // Until the test kills it.
        std::future::pending::<()>().await;
    });
}

struct Starter {
    client: Client,
    key: String,
    consumer: String,
}

impl Handle<Job> for Starter {
    fn handle(
        &self,
        job: &Job,
        _: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        let record = format!("{}:{}:{}", job.n, ctx.attempt(), self.consumer);
        async move {
            let _: Result<i64, _> = self.client.rpush(&self.key, record).await;
            std::future::pending().await
        }
    }
}

/// A stream worker process of `recovery::stream_worker_process`.
fn stream_worker(env: &Env, consumer: &str, min_idle_ms: u64, max_attempts: u32) -> WorkerProcess {
    WorkerProcess::spawn(
        &test_name(module_path!(), "stream_worker_process"),
        &[
            (
                "RELIABILITY_WORKER",
                env.url().expect("standalone").to_owned(),
            ),
            ("RELIABILITY_PREFIX", env.prefix.clone()),
            ("RELIABILITY_CONSUMER", consumer.to_owned()),
            ("RELIABILITY_MIN_IDLE_MS", min_idle_ms.to_string()),
            ("RELIABILITY_MAX_ATTEMPTS", max_attempts.to_string()),
        ],
        None,
    )
}

/// What the worker processes recorded as started, in order.
async fn started(env: &Env) -> Vec<String> {
    env.client
        .lrange(env.key(&format!("{S}.started")), 0, -1)
        .await
        .unwrap()
}

/// Waits until the worker processes have started `records` (child processes take a while).
async fn until_started(env: &Env, records: &[&str]) {
    wait_until(
        "the worker process started its handlers",
        Duration::from_secs(30),
        || async {
            let s = started(env).await;
            records.iter().all(|r| s.iter().any(|x| x == r))
        },
    )
    .await;
}

async fn publish_stream(env: &Env, jobs: &[Job]) {
    let broker = env.broker_with(|b| b.route(S, stream::Publish::new()));
    broker.connect().await.unwrap();
    broker
        .publisher()
        .messages(jobs)
        .to(S)
        .publish()
        .await
        .unwrap();
}

/// A consumer of group `g` in this process.
fn consumer(name: &str, min_idle: Duration) -> RedisStream {
    RedisStream::new(S)
        .group("g")
        .consumer(name)
        .min_idle(min_idle)
        .block(Duration::from_millis(200))
}

// The fault: a stream consumer killed mid-handler leaves its entries pending on its name for ever,
// and no other consumer handles them, unless a sweep reclaims them.
async fn a_killed_consumers_stream_entries_are_claimed_by_another_after_min_idle(env: &Env) {
    publish_stream(env, &jobs(3)).await;
    let mut victim = stream_worker(env, "victim", 1000, 10);
    until_started(env, &["0:1:victim", "1:1:victim", "2:1:victim"]).await;
    victim.kill();
    // On the victim's two readers (`victim`, `victim-2`: two by default at concurrency 128).
    let pending = pending_entries(env, S, "g").await;
    assert!(
        pending.len() == 3
            && pending
                .iter()
                .all(|(c, n)| (c == "victim" || c == "victim-2") && *n == 1),
        "left pending: {pending:?}"
    );
    let rec = Rec::acking();
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(subscriber(consumer("rescuer", Duration::from_secs(1)), r).build());
    })
    .await;
    eventually("claimed and handled by the other consumer", async || {
        rec.count() == 3 && pending_count(env, S, "g").await == 0
    })
    .await;
    assert_eq!(
        rec.sorted(),
        seen(&[(0, 2), (1, 2), (2, 2)]),
        "a claimed entry counts the delivery it had"
    );
    assert_eq!(env.llen(&format!("{S}.dead")).await, 0);
    stop(app).await;
}

// The fault: a consumer restarted under its old name (`.consumer(name)`) that reads only new
// entries leaves those it held when it was killed pending for ever.
async fn a_restarted_consumer_first_takes_back_its_own_pending_entries(env: &Env) {
    publish_stream(env, &jobs(2)).await;
    let mut first = stream_worker(env, "w1", 60_000, 10);
    until_started(env, &["0:1:w1", "1:1:w1"]).await;
    first.kill();
    let rec = Rec::acking();
    let r = rec.clone();
    // min_idle of a minute: no sweep can take them within this test; only the restart does.
    let app = worker(env, |b| {
        b.include(subscriber(consumer("w1", Duration::from_secs(60)), r).build());
    })
    .await;
    eventually("taken back at once and handled", async || {
        rec.count() == 2 && pending_count(env, S, "g").await == 0
    })
    .await;
    assert_eq!(rec.sorted(), seen(&[(0, 2), (1, 2)]));
    stop(app).await;
}

// The fault: an entry whose handler kills its consumer every time stays pending for ever, never
// reaching max_attempts nor the dead letters, unless the sweep counts its deliveries.
async fn a_stream_entry_that_kills_every_consumer_ends_in_the_dead_letters(env: &Env) {
    publish_stream(env, &[Job { n: 0 }]).await;
    let mut a = stream_worker(env, "a", 500, 2);
    until_started(env, &["0:1:a"]).await;
    a.kill();
    let mut b = stream_worker(env, "b", 500, 2);
    until_started(env, &["0:2:b"]).await;
    b.kill();
    let rec = Rec::acking();
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(subscriber(consumer("c", Duration::from_millis(500)).max_attempts(2), r).build());
    })
    .await;
    eventually("dead-lettered with max-attempts", async || {
        env.llen(&format!("{S}.dead")).await == 1 && pending_count(env, S, "g").await == 0
    })
    .await;
    assert_eq!(reasons(env, &format!("{S}.dead")).await, ["max-attempts"]);
    assert_eq!(rec.count(), 0, "not run a third time");
    assert_eq!(started(env).await, ["0:1:a", "0:2:b"]);
    stop(app).await;
}
