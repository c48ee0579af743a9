//! Cancellation by id: `publisher.cancel(destination, id)` on a reliable
//! list, wherever the message is. Queued: marked, then dropped at its claim, never handled.
//! Delayed: removed. Running: its handler sees `ctx.cancelled()` and the message settles as
//! cancelled whatever the handler returns; a handler that ignores it is dropped after the grace
//! (on the virtual clock on the model). A cancel and a settle race atomically: the one that runs
//! first wins (both orders, made deterministic by holding the handler until the test lets it
//! go). An awaited job cancelled fails with `Error::Cancelled`. Each cancel is called twice, as
//! a client resends it when its reply was lost: the second answers the same and cancels
//! nothing twice. A cancelled stream entry left pending by a dead consumer is acked by the sweep
//! of another, not run again. A batch handler is told of its cancelled item, which settles
//! cancelled. Also with priority levels, a concurrency cap (a dropped handler frees it) and
//! partitions (the cancel tries each; the readers of every partition hear the signal). The same
//! for a stream read by a group: queued (marked, acked at the read), delayed, running, ignored,
//! and both orders of the race.

mod batch;
mod features;
mod streams;

use crate::harness;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Env, WAIT, on};
use ruststream::prelude::*;
use ruststream::{CancelOutcome, ErrorKind, PublishBuilder, RunningApp};
use tokio::sync::Notify;
use tokio::time::Instant;

use self::streams::{cancel_stream_twice, publish_stream, run_stream, stream, stream_settled};

on!(
    [memory, standalone, cluster]
    a_queued_message_is_marked_and_never_handled,
    a_delayed_message_is_removed,
    a_running_handler_sees_the_cancel_and_settles_cancelled,
    a_handler_ignoring_the_cancel_is_dropped_after_the_grace,
    a_cancel_before_the_settle_wins_and_fails_the_awaiter,
    a_settle_before_the_cancel_wins_and_the_cancel_says_already_done,
    an_unknown_id_is_not_found,
    a_queued_stream_message_is_marked_and_never_handled,
    a_delayed_stream_message_is_removed,
    a_running_stream_handler_sees_the_cancel_and_settles_cancelled,
    a_stream_handler_ignoring_the_cancel_is_dropped_after_the_grace,
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    /// What the handler does: `ack`, `watch` (waits for the cancel, then acks), `ignore` (runs
    /// for ever), `hold` (waits until the test lets it go, then asks for a retry), `result`.
    mode: String,
}

outgoing!(Job);

/// The handler: records each call, and does what the job's mode says.
#[derive(Clone, Default)]
struct Worker {
    calls: Arc<Mutex<Vec<String>>>,
    saw_cancel: Arc<AtomicUsize>,
    dropped: Arc<Mutex<Option<Instant>>>,
    go: Arc<Notify>,
}

/// Records when the future holding it is dropped.
struct DropClock(Arc<Mutex<Option<Instant>>>);

impl Drop for DropClock {
    fn drop(&mut self) {
        *self.0.lock().expect("lock") = Some(Instant::now());
    }
}

impl Worker {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().expect("lock").clone()
    }

    fn called(&self, id: &str) -> usize {
        self.calls().iter().filter(|c| *c == id).count()
    }

    fn dropped_at(&self) -> Option<Instant> {
        *self.dropped.lock().expect("lock")
    }
}

// ANCHOR: handler
impl Handle<Job> for Worker {
    async fn handle(&self, m: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        self.calls
            .lock()
            .expect("lock")
            .push(ctx.message_id().to_owned());
        match m.mode.as_str() {
            "watch" => {
                ctx.cancelled().await;
                self.saw_cancel.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            "ignore" => {
                let _clock = DropClock(self.dropped.clone());
                std::future::pending().await
            }
            "hold" => {
                self.go.notified().await;
                Err(HandlerOutcome::retry())
            }
            "result" => {
                ctx.set_result(&7u32)
                    .await
                    .map_err(|_| HandlerOutcome::retry())?;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}
// ANCHOR_END: handler

/// Starts an app reading `list` into `worker`.
async fn run(env: &Env, list: RedisList, worker: &Worker) -> RunningApp {
    let w = worker.clone();
    env.start_with(move |m| {
        m.include(subscriber(list, w).build());
    })
    .await
}

/// A publish of job `id` in `mode` to `to`.
fn job<'a>(publisher: &'a Publisher, job: &'a Job, to: &str, id: &str) -> PublishBuilder<'a, Job> {
    publisher.message(job).to(to).id(id)
}

impl Job {
    fn new(mode: &str) -> Self {
        Self { mode: mode.into() }
    }
}

async fn publish(env: &Env, to: &str, id: &str, mode: &str) {
    let broker = env.broker();
    broker.connect().await.expect("connect");
    let publisher = broker.publisher();
    job(&publisher, &Job::new(mode), to, id)
        .publish()
        .await
        .expect("publish");
}

/// Cancels `id` of `to` twice (the second as the resend of a call whose reply was lost): both
/// answer the same; returns the answer.
async fn cancel_twice(env: &Env, to: &str, id: &str) -> CancelOutcome {
    // ANCHOR: cancel
    let publisher = env.broker().publisher();
    let first = publisher.cancel(to, id).await.expect("cancel");
    let again = publisher.cancel(to, id).await.expect("cancel again");
    assert_eq!(first, again, "a resent cancel answers what the first did");
    // ANCHOR_END: cancel
    first
}

/// Publishes job `id` to `to` and awaits its result.
async fn awaited(broker: &RedisBroker, to: &str, id: &str, mode: &str) -> ruststream::Result<u32> {
    broker.connect().await?;
    let publisher = broker.publisher();
    job(&publisher, &Job::new(mode), to, id)
        .publish()
        .await_result::<u32>(WAIT)
        .await
}

/// Waits until nothing of `key` is claimed.
async fn settled(env: &Env, key: &str) {
    let processing = format!("{key}.processing");
    env.eventually("settled", async || env.llen(&processing).await == 0)
        .await;
}

fn list(key: &str) -> RedisList {
    RedisList::new(key)
        .reliable()
        .block(Duration::from_millis(100))
        .cancel_grace(Duration::from_millis(500))
}

/// A queue under test: a reliable list, or a stream read by group `g` (published through a
/// stream route).
#[derive(Clone, Copy)]
enum Queue {
    List(&'static str),
    Stream(&'static str),
}

impl Queue {
    fn key(self) -> &'static str {
        match self {
            Self::List(k) | Self::Stream(k) => k,
        }
    }

    async fn publish(self, env: &Env, id: &str, mode: &str, delay: Option<Duration>) {
        match (self, delay) {
            (Self::List(k), None) => publish(env, k, id, mode).await,
            (Self::List(k), Some(d)) => {
                let broker = env.broker();
                broker.connect().await.expect("connect");
                let publisher = broker.publisher();
                job(&publisher, &Job::new(mode), k, id)
                    .delay(d)
                    .publish()
                    .await
                    .expect("publish");
            }
            (Self::Stream(k), _) => publish_stream(env, k, id, mode, delay).await,
        }
    }

    async fn cancel_twice(self, env: &Env, id: &str) -> CancelOutcome {
        match self {
            Self::List(k) => cancel_twice(env, k, id).await,
            Self::Stream(k) => cancel_stream_twice(env, k, id).await,
        }
    }

    async fn run(self, env: &Env, worker: &Worker) -> RunningApp {
        self.source().run(env, worker).await
    }

    /// Its subscription, as the tests read it.
    fn source(self) -> Source {
        match self {
            Self::List(k) => Source::List(list(k)),
            Self::Stream(k) => Source::Stream(stream(k)),
        }
    }

    /// Waits until nothing is claimed (a list) or pending (a stream); then checks nothing is
    /// left queued and no dead letter was written.
    async fn settled(self, env: &Env) {
        match self {
            Self::List(k) => {
                settled(env, k).await;
                assert_eq!(env.llen(k).await, 0, "nothing left queued");
            }
            Self::Stream(k) => stream_settled(env, k).await,
        }
        let dead = format!("{}.dead", self.key());
        assert_eq!(env.llen(&dead).await, 0, "a cancel is no dead letter");
    }
}

/// A list or stream subscription, for the cases that add an option to [`Queue::source`].
enum Source {
    List(RedisList),
    Stream(RedisStream),
}

impl Source {
    fn max_in_flight(self, n: u32) -> Self {
        match self {
            Self::List(l) => Self::List(l.max_in_flight(n)),
            Self::Stream(s) => Self::Stream(s.max_in_flight(n)),
        }
    }

    fn partitions(self, n: u16) -> Self {
        match self {
            Self::List(l) => Self::List(l.partitions(n)),
            Self::Stream(s) => Self::Stream(s.partitions(n)),
        }
    }

    async fn run(self, env: &Env, worker: &Worker) -> RunningApp {
        match self {
            Self::List(l) => run(env, l, worker).await,
            Self::Stream(s) => run_stream(env, s, worker).await,
        }
    }
}

async fn a_queued_message_is_marked_and_never_handled(env: &Env) {
    queued_is_marked_and_never_handled(env, Queue::List("{cq}")).await;
}

async fn a_queued_stream_message_is_marked_and_never_handled(env: &Env) {
    queued_is_marked_and_never_handled(env, Queue::Stream("{sq}")).await;
}

async fn queued_is_marked_and_never_handled(env: &Env, q: Queue) {
    q.publish(env, "a", "ack", None).await;
    q.publish(env, "b", "ack", None).await;
    assert_eq!(q.cancel_twice(env, "a").await, CancelOutcome::Marked);
    let worker = Worker::default();
    let app = q.run(env, &worker).await;
    env.eventually("b handled", async || worker.called("b") == 1)
        .await;
    q.settled(env).await;
    env.stop(app).await;
    assert_eq!(worker.calls(), ["b"], "the cancelled message never ran");
    let record = format!("{}.cancels", q.key());
    assert!(env.pttl(&record).await > 0, "the cancel record has a ttl");
}

async fn a_delayed_message_is_removed(env: &Env) {
    delayed_is_removed(env, Queue::List("{cd}")).await;
}

async fn a_delayed_stream_message_is_removed(env: &Env) {
    delayed_is_removed(env, Queue::Stream("{sd}")).await;
}

async fn delayed_is_removed(env: &Env, q: Queue) {
    let later = Some(Duration::from_secs(3600));
    q.publish(env, "later", "ack", later).await;
    let (set, payloads) = (
        format!("{}.delayed", q.key()),
        format!("{}.delayed.payloads", q.key()),
    );
    assert_eq!(env.zcard(&set).await, 1);
    assert_eq!(q.cancel_twice(env, "later").await, CancelOutcome::Removed);
    assert_eq!(env.zcard(&set).await, 0, "gone from the delayed set");
    assert_eq!(env.hlen(&payloads).await, 0, "and its payload");
}

async fn a_running_handler_sees_the_cancel_and_settles_cancelled(env: &Env) {
    running_sees_the_cancel(env, Queue::List("{cr}")).await;
}

async fn a_running_stream_handler_sees_the_cancel_and_settles_cancelled(env: &Env) {
    running_sees_the_cancel(env, Queue::Stream("{sr}")).await;
}

async fn running_sees_the_cancel(env: &Env, q: Queue) {
    let worker = Worker::default();
    let app = q.run(env, &worker).await;
    q.publish(env, "r", "watch", None).await;
    env.eventually("r running", async || worker.called("r") == 1)
        .await;
    assert_eq!(q.cancel_twice(env, "r").await, CancelOutcome::Signalled);
    q.settled(env).await;
    assert_eq!(worker.saw_cancel.load(Ordering::SeqCst), 1, "told once");
    // Another read's time: a cancelled message is not delivered again.
    env.advance(Duration::from_millis(300)).await;
    env.stop(app).await;
    assert_eq!(worker.calls(), ["r"], "handled once");
}

async fn a_handler_ignoring_the_cancel_is_dropped_after_the_grace(env: &Env) {
    ignoring_is_dropped_after_the_grace(env, Queue::List("{ci}")).await;
}

async fn a_stream_handler_ignoring_the_cancel_is_dropped_after_the_grace(env: &Env) {
    ignoring_is_dropped_after_the_grace(env, Queue::Stream("{si}")).await;
}

async fn ignoring_is_dropped_after_the_grace(env: &Env, q: Queue) {
    let worker = Worker::default();
    let app = q.run(env, &worker).await;
    q.publish(env, "i", "ignore", None).await;
    env.eventually("i running", async || worker.called("i") == 1)
        .await;
    let cancelled = Instant::now();
    assert_eq!(q.cancel_twice(env, "i").await, CancelOutcome::Signalled);
    env.eventually("i dropped", async || worker.dropped_at().is_some())
        .await;
    let after = worker.dropped_at().expect("dropped") - cancelled;
    assert!(
        after >= Duration::from_millis(500) && after < WAIT,
        "dropped {after:?} after the cancel, the grace is 500 ms"
    );
    q.settled(env).await;
    env.stop(app).await;
    assert_eq!(worker.calls(), ["i"], "not delivered again");
}

/// The cancel runs while the handler is held; the handler then asks for a retry: the cancel
/// ran first, so the message settles as cancelled (no retry), and the awaiter fails with
/// `Cancelled`.
async fn a_cancel_before_the_settle_wins_and_fails_the_awaiter(env: &Env) {
    let worker = Worker::default();
    let held = list("{cw}").cancel_grace(Duration::from_secs(30));
    let app = run(env, held, &worker).await;
    let broker = env.broker();
    let awaiting = tokio::spawn(async move { awaited(&broker, "{cw}", "w", "hold").await });
    env.eventually("w running", async || worker.called("w") == 1)
        .await;
    assert_eq!(
        cancel_twice(env, "{cw}", "w").await,
        CancelOutcome::Signalled
    );
    let e = harness::bounded("await_result", WAIT, awaiting)
        .await
        .expect("the awaiting task")
        .expect_err("a cancelled job has no result");
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    worker.go.notify_one();
    settled(env, "{cw}").await;
    env.advance(Duration::from_millis(300)).await;
    env.stop(app).await;
    assert_eq!(worker.calls(), ["w"], "its retry was not carried out");
    assert_eq!(env.llen("{cw}").await, 0);
    assert_eq!(env.zcard("{cw}.delayed").await, 0);
}

/// The handler settles first: the cancel finds nothing running, and the job's record says it
/// is done.
async fn a_settle_before_the_cancel_wins_and_the_cancel_says_already_done(env: &Env) {
    let worker = Worker::default();
    let app = run(env, list("{ca}"), &worker).await;
    let broker = env.broker();
    let result = awaited(&broker, "{ca}", "done", "result")
        .await
        .expect("the result");
    assert_eq!(result, 7);
    settled(env, "{ca}").await;
    assert_eq!(
        cancel_twice(env, "{ca}", "done").await,
        CancelOutcome::AlreadyDone
    );
    let record = broker
        .publisher()
        .job_state("done")
        .await
        .expect("read")
        .expect("a record");
    assert_eq!(record.error, None, "the cancel changed nothing");
    env.stop(app).await;
    assert!(!env.exists("{ca}.cancels").await, "nothing recorded");
}

async fn an_unknown_id_is_not_found(env: &Env) {
    assert_eq!(
        cancel_twice(env, "{cn}", "nobody").await,
        CancelOutcome::NotFound
    );
    assert!(!env.exists("{cn}.cancels").await, "nothing recorded");
}
