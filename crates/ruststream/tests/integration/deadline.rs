//! Deadlines: `.timeout(d)` on a source bounds each handler call. A call
//! still running at its deadline is stopped (its future dropped) and its message retried after
//! the backoff, then dead-lettered with reason `timeout` once its attempts are spent;
//! `ctx.deadline()` says when; a batch handler's call is bounded the same way; a hung handler
//! frees its permit, its claim and a capped queue's slot at its deadline; the deadline with
//! priorities and the cap; an hour-long deadline on TestApp's virtual clock; a zero timeout is
//! refused with the fix.

use crate::harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Env, WAIT, on, wait_until};
use ruststream::prelude::*;
use ruststream::testing::TestApp;
use ruststream::{
    BatchContext, BatchOutcome, HandleBatch, RunningApp, Settlement, Source, list, subscriber,
};
use tokio::time::Instant;

on!(
    [memory, standalone, cluster] multi_thread:
    a_timed_out_handler_is_retried_with_backoff_then_dead_lettered_timeout,
    a_timed_out_stream_handler_is_retried_then_dead_lettered_timeout,
    ctx_deadline_is_the_timeout_after_the_call_started,
    a_batch_past_its_deadline_retries_every_item,
    a_hung_handler_frees_its_permit,
    a_timeout_frees_a_capped_slot_and_keeps_the_level,
);

on!([memory] timeouts_are_counted, a_zero_timeout_is_refused_with_the_fix);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

/// One call as the handler saw it.
#[derive(Debug, Clone)]
struct Call {
    n: u32,
    attempt: u32,
    /// When the call started (tokio's clock).
    at: Instant,
    /// `ctx.deadline()`.
    deadline: Option<Instant>,
    /// The `rs.priority` header.
    priority: Option<String>,
}

/// Records every call, then hangs (never finishes) when `hang(n, attempt)` says, else acks.
#[derive(Clone)]
struct Hanging {
    calls: Arc<Mutex<Vec<Call>>>,
    hang: fn(u32, u32) -> bool,
}

impl Hanging {
    fn new(hang: fn(u32, u32) -> bool) -> Self {
        Self {
            calls: Arc::default(),
            hang,
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("lock").clone()
    }

    fn of(&self, n: u32) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.n == n).collect()
    }
}

impl Handle<Job> for Hanging {
    async fn handle(&self, m: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.calls.lock().expect("lock").push(Call {
            n: m.n,
            attempt: ctx.attempt(),
            at: Instant::now(),
            deadline: ctx.deadline(),
            priority: ctx.header("rs.priority").map(str::to_owned),
        });
        if (self.hang)(m.n, ctx.attempt()) {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// An app of the test's reading `source` into `handler`.
async fn serve(
    env: &Env,
    source: impl Source<Broker = RedisBroker>,
    handler: &Hanging,
) -> RunningApp {
    let h = handler.clone();
    env.start_with(move |b| {
        b.include(subscriber(source, h).build());
    })
    .await
}

async fn publish(broker: &RedisBroker, to: &str, n: u32) {
    broker.connect().await.expect("connect");
    broker
        .publisher()
        .message(&Job { n })
        .to(to)
        .publish()
        .await
        .expect("publish");
}

/// The dead letters of `key` (a list), decoded.
async fn dead_reasons(env: &Env, key: &str) -> Vec<(u32, String)> {
    env.frames(key)
        .await
        .into_iter()
        .map(|f| {
            let reason = f.headers.get("reason").cloned().unwrap_or_default();
            (f.attempt, reason)
        })
        .collect()
}

const TIMEOUT: Duration = Duration::from_millis(100);
const BACKOFF: Duration = Duration::from_millis(200);

/// Every attempt hangs: each is stopped at 100 ms and retried after the 200 ms backoff, three
/// attempts in all, then the message is dead-lettered `timeout` on its third attempt.
async fn a_timed_out_handler_is_retried_with_backoff_then_dead_lettered_timeout(env: &Env) {
    let handler = Hanging::new(|_, _| true);
    let list = RedisList::new("{dl}")
        .reliable()
        .timeout(TIMEOUT)
        .max_attempts(3)
        .retry(Backoff::fixed(BACKOFF));
    let running = serve(env, list, &handler).await;
    publish(&env.broker(), "{dl}", 1).await;
    wait_until("dead-lettered", WAIT, async || {
        env.llen("{dl}.dead").await == 1
    })
    .await;
    env.stop(running).await;
    let calls = handler.calls();
    let attempts: Vec<u32> = calls.iter().map(|c| c.attempt).collect();
    assert_eq!(attempts, [1, 2, 3], "three attempts, then dead");
    for pair in calls.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap >= TIMEOUT + BACKOFF,
            "the next attempt came {gap:?} after the last, before its timeout and backoff"
        );
    }
    assert_eq!(
        dead_reasons(env, "{dl}.dead").await,
        [(3, "timeout".to_owned())]
    );
    assert_eq!(env.llen("{dl}.processing").await, 0, "nothing left claimed");
}

/// The same on a stream group: its settle re-adds the entry on a retry.
async fn a_timed_out_stream_handler_is_retried_then_dead_lettered_timeout(env: &Env) {
    let handler = Hanging::new(|_, attempt| attempt < 3);
    let stream = RedisStream::new("{ds}")
        .group("g")
        .timeout(TIMEOUT)
        .max_attempts(2)
        .retry(Backoff::immediate());
    let running = serve(env, stream, &handler).await;
    let producer = env.broker_with(|b| b.route("{ds}", ruststream::stream::Publish::new()));
    publish(&producer, "{ds}", 1).await;
    wait_until("dead-lettered", WAIT, async || {
        env.llen("{ds}.dead").await == 1
    })
    .await;
    env.stop(running).await;
    let attempts: Vec<u32> = handler.calls().iter().map(|c| c.attempt).collect();
    assert_eq!(attempts, [1, 2]);
    assert_eq!(
        dead_reasons(env, "{ds}.dead").await,
        [(2, "timeout".to_owned())]
    );
    assert_eq!(env.pending("{ds}", "g").await, 0, "nothing left pending");
}

/// `ctx.deadline()` is the timeout after the call started; without a timeout, none.
async fn ctx_deadline_is_the_timeout_after_the_call_started(env: &Env) {
    let timed = Hanging::new(|_, _| false);
    let plain = Hanging::new(|_, _| false);
    let timeout = Duration::from_secs(30);
    let (t, p) = (timed.clone(), plain.clone());
    let running = env
        .start_with(move |b| {
            b.include(subscriber(RedisList::new("{dt}").reliable().timeout(timeout), t).build());
            b.include(subscriber(RedisList::new("{dp}").reliable(), p).build());
        })
        .await;
    let broker = env.broker();
    publish(&broker, "{dt}", 1).await;
    publish(&broker, "{dp}", 2).await;
    wait_until("both handled", WAIT, async || {
        timed.calls().len() == 1 && plain.calls().len() == 1
    })
    .await;
    env.stop(running).await;
    let call = &timed.calls()[0];
    let deadline = call.deadline.expect("a deadline");
    let left = deadline - call.at;
    assert!(
        left <= timeout && left > timeout - Duration::from_millis(500),
        "{left:?} left of a {timeout:?} timeout at the call's start"
    );
    assert_eq!(plain.calls()[0].deadline, None, "no timeout, no deadline");
}

/// A batch handler that hangs on the first attempt: the whole batch is stopped at the deadline
/// and each of its items retried; on the second attempt they are acknowledged.
#[derive(Clone, Default)]
struct HangingBatch {
    calls: Arc<Mutex<Vec<BatchCall>>>,
}

/// One batch call: the items' numbers and attempts, and its deadline.
type BatchCall = (Vec<(u32, u32)>, Option<Instant>);

impl HandleBatch<Job> for HangingBatch {
    async fn handle_batch(&self, items: &[Job], ctx: &mut BatchContext<'_>) -> BatchOutcome {
        let seen: Vec<(u32, u32)> = items
            .iter()
            .zip(ctx.infos())
            .map(|(j, i)| (j.n, i.attempt))
            .collect();
        let first = seen.iter().any(|(_, a)| *a == 1);
        self.calls
            .lock()
            .expect("lock")
            .push((seen, ctx.deadline()));
        if first {
            std::future::pending::<()>().await;
        }
        BatchOutcome::ack()
    }
}

async fn a_batch_past_its_deadline_retries_every_item(env: &Env) {
    let handler = HangingBatch::default();
    let list = RedisList::new("{db}")
        .reliable()
        .concurrency(4)
        .timeout(TIMEOUT)
        .retry(Backoff::immediate());
    // Published before the app starts, so the first claim takes all three.
    let broker = env.broker();
    for n in 0..3 {
        publish(&broker, "{db}", n).await;
    }
    let h = handler.clone();
    let running = env
        .start_with(move |b| {
            b.include(
                subscriber(list, h)
                    .batch(3)
                    .max_wait(Duration::from_millis(50))
                    .build::<Job>(),
            );
        })
        .await;
    let acked = async || {
        let calls = handler.calls.lock().expect("lock").clone();
        let mut second: Vec<u32> = calls
            .iter()
            .flat_map(|(items, _)| items.iter().filter(|(_, a)| *a == 2).map(|(n, _)| *n))
            .collect();
        second.sort_unstable();
        second == [0, 1, 2]
    };
    wait_until("every item retried", WAIT, acked).await;
    wait_until("settled", WAIT, async || {
        env.llen("{db}.processing").await == 0
    })
    .await;
    env.stop(running).await;
    let calls = handler.calls.lock().expect("lock").clone();
    assert!(
        calls.iter().all(|(_, d)| d.is_some()),
        "every batch call has a deadline"
    );
    let firsts: usize = calls
        .iter()
        .map(|(items, _)| items.iter().filter(|(_, a)| *a == 1).count())
        .sum();
    assert_eq!(firsts, 3, "each item hung once: {calls:?}");
    assert_eq!(env.llen("{db}.dead").await, 0, "nothing dead");
}

/// Concurrency 1: job 1 hangs for good; its deadline frees the one permit, so job 2 (published
/// after it) is handled, and job 1 lands in the dead letters with reason `timeout`.
async fn a_hung_handler_frees_its_permit(env: &Env) {
    let handler = Hanging::new(|n, _| n == 1);
    let list = RedisList::new("{dh}")
        .reliable()
        .concurrency(1)
        .timeout(TIMEOUT)
        .max_attempts(1);
    let running = serve(env, list, &handler).await;
    let broker = env.broker();
    publish(&broker, "{dh}", 1).await;
    wait_until("job 1 started", WAIT, async || handler.of(1).len() == 1).await;
    publish(&broker, "{dh}", 2).await;
    wait_until("job 2 handled", WAIT, async || handler.of(2).len() == 1).await;
    wait_until("job 1 dead", WAIT, async || {
        env.llen("{dh}.dead").await == 1
    })
    .await;
    env.stop(running).await;
    assert_eq!(
        dead_reasons(env, "{dh}.dead").await,
        [(1, "timeout".to_owned())]
    );
    assert!(
        handler.of(2)[0].at - handler.of(1)[0].at >= TIMEOUT,
        "job 2 ran while job 1 held the only permit"
    );
    assert_eq!(env.llen("{dh}.processing").await, 0, "nothing left claimed");
}

/// A queue of two levels capped at one in flight: job 1 (level 1) hangs on its first attempt.
/// Its timeout frees the cap's one slot, so job 2 (level 0) runs, and job 1 comes back onto its
/// own level (its `rs.priority` header) and is acknowledged on attempt 2.
async fn a_timeout_frees_a_capped_slot_and_keeps_the_level(env: &Env) {
    let handler = Hanging::new(|n, attempt| n == 1 && attempt == 1);
    let list = RedisList::new("{dc}")
        .reliable()
        .priorities(2)
        .concurrency(2)
        .max_in_flight(1)
        .timeout(TIMEOUT)
        .retry(Backoff::fixed(BACKOFF));
    let running = serve(env, list, &handler).await;
    let producer = env.broker_with(|b| b.route("{dc}", list::Publish::new().priorities(2)));
    producer.connect().await.expect("connect");
    producer
        .publisher()
        .message(&Job { n: 1 })
        .to("{dc}")
        .priority(1)
        .publish()
        .await
        .expect("publish");
    wait_until("job 1 started", WAIT, async || handler.of(1).len() == 1).await;
    publish(&producer, "{dc}", 2).await;
    wait_until("both done", WAIT, async || {
        handler.of(1).len() == 2 && handler.of(2).len() == 1
    })
    .await;
    wait_until("settled", WAIT, async || {
        env.llen("{dc}.processing").await == 0
    })
    .await;
    env.stop(running).await;
    let (one, two) = (handler.of(1), handler.of(2));
    assert!(
        two[0].at - one[0].at >= TIMEOUT,
        "job 2 ran while the hung job held the cap's only slot"
    );
    assert_eq!(one[1].attempt, 2);
    assert_eq!(one[1].priority.as_deref(), Some("1"), "back onto its level");
    assert_eq!(env.llen("{dc}.dead").await, 0, "nothing dead");
}

/// `ruststream_timeouts_total` counts each stopped call, `ruststream_dead_lettered_total` the
/// `timeout` dead letter (the model only: the recorder is process-wide, the key its own).
async fn timeouts_are_counted(env: &Env) {
    let prometheus = harness::metrics::prometheus();
    let handler = Hanging::new(|_, _| true);
    let list = RedisList::new("{counted_timeouts}")
        .reliable()
        .timeout(TIMEOUT)
        .max_attempts(2)
        .retry(Backoff::immediate());
    let running = env
        .start_with(move |b| {
            b.include(subscriber(list, handler).build());
        })
        .await;
    publish(&env.broker(), "{counted_timeouts}", 1).await;
    let sub = "subscription=\"{counted_timeouts}\"";
    wait_until("counted", WAIT, async || {
        let text = prometheus.render();
        harness::metrics::sample(&text, "ruststream_timeouts_total", &[sub]) == Some(2.0)
            && harness::metrics::sample(
                &text,
                "ruststream_dead_lettered_total",
                &[sub, "reason=\"timeout\""],
            ) == Some(1.0)
    })
    .await;
    env.stop(running).await;
}

async fn a_zero_timeout_is_refused_with_the_fix(env: &Env) {
    let e = env
        .refusal(env.app(|b| {
            let list = RedisList::new("{dz}").reliable().timeout(Duration::ZERO);
            b.include(subscriber(list, Hanging::new(|_, _| false)).build());
        }))
        .await;
    assert_eq!(
        (e.option.as_ref(), e.subject.as_deref()),
        ("timeout", Some("{dz}"))
    );
    assert!(e.problem.contains("longer than zero"), "{e}");
    assert!(e.fix.contains(".timeout(Duration::from_secs"), "{e}");
}

/// An hour-long deadline on TestApp: the handler hangs, the clock moves an hour in model time
/// (microseconds of wall time), and the message is dead-lettered `timeout`.
#[tokio::test(start_paused = true)]
async fn an_hour_long_deadline_passes_on_the_virtual_clock() -> ruststream::Result<()> {
    let hour = Duration::from_secs(3600);
    let handler = Hanging::new(|_, _| true);
    let list = RedisList::new("{hour}")
        .reliable()
        .timeout(hour)
        .max_attempts(1);
    let h = handler.clone();
    let app = RustStream::new(AppInfo::new("deadline", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379").prefix("d:"),
        move |b| {
            b.include(subscriber(list, h).build());
        },
    );
    let tb = TestApp::start(app).await?;
    let wall = std::time::Instant::now();
    tb.broker::<RedisBroker>()
        .message(&Job { n: 1 })
        .to("{hour}")
        .publish()
        .await?;
    tb.advance(Duration::from_secs(59 * 60)).await?;
    let running = tb.broker::<RedisBroker>().subscriber("{hour}");
    let last = running.assert_called_once().last();
    assert_eq!(
        last.and_then(|c| c.settlement.clone()),
        None,
        "still running at 59 minutes"
    );
    tb.advance(Duration::from_secs(2 * 60)).await?;
    tb.broker::<RedisBroker>()
        .subscriber("{hour}")
        .assert_called_once()
        .settled(Settlement::Dead {
            reason: "timeout".into(),
        });
    assert!(
        wall.elapsed() < Duration::from_secs(5),
        "an hour of model time took {:?} of wall time",
        wall.elapsed()
    );
    let deadline = handler.calls()[0].deadline.expect("a deadline");
    assert_eq!(deadline - handler.calls()[0].at, hour);
    tb.shutdown().await
}
