//! Cancellation by id (issue 22, point 2): `publisher.cancel(destination, id)` on a reliable
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

use crate::harness;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::Value;
use harness::{Env, WAIT, on};
use ruststream::prelude::*;
use ruststream::{CancelOutcome, ErrorKind, PublishBuilder, RunningApp};
use tokio::sync::Notify;
use tokio::time::Instant;

on!(
    [memory, standalone, cluster]
    a_queued_message_is_marked_and_never_handled,
    a_delayed_message_is_removed,
    a_running_handler_sees_the_cancel_and_settles_cancelled,
    a_handler_ignoring_the_cancel_is_dropped_after_the_grace,
    a_cancel_before_the_settle_wins_and_fails_the_awaiter,
    a_settle_before_the_cancel_wins_and_the_cancel_says_already_done,
    an_unknown_id_is_not_found,
    a_cancel_covers_every_priority_level,
    a_dropped_handler_frees_the_cap,
    a_cancel_reaches_each_partition,
    a_queued_stream_message_is_marked_and_never_handled,
    a_delayed_stream_message_is_removed,
    a_running_stream_handler_sees_the_cancel_and_settles_cancelled,
    a_stream_handler_ignoring_the_cancel_is_dropped_after_the_grace,
    a_stream_cancel_before_the_settle_wins,
    a_stream_settle_before_the_cancel_wins,
    the_operator_cancels_on_a_stream_subscription,
    a_dropped_stream_handler_frees_the_cap,
    a_stream_cancel_reaches_each_partition,
    a_cancelled_stream_entry_of_a_dead_consumer_is_not_run_again,
    a_batch_handler_is_told_of_its_cancelled_item,
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

async fn a_cancel_covers_every_priority_level(env: &Env) {
    let broker =
        env.broker_with(|b| b.route("{cp}", ruststream::list::Publish::new().priorities(3)));
    broker.connect().await.expect("connect");
    let publisher = broker.publisher();
    for (id, level) in [("low", 0), ("high", 2), ("mid", 1)] {
        job(&publisher, &Job::new("ack"), "{cp}", id)
            .priority(level)
            .publish()
            .await
            .expect("publish");
    }
    assert_eq!(
        publisher.cancel("{cp}", "high").await.expect("cancel"),
        CancelOutcome::Marked
    );
    let worker = Worker::default();
    let app = run(env, list("{cp}").priorities(3).concurrency(1), &worker).await;
    env.eventually("the others handled", async || worker.calls().len() == 2)
        .await;
    env.advance(Duration::from_millis(300)).await;
    env.stop(app).await;
    assert_eq!(
        worker.calls(),
        ["mid", "low"],
        "the cancelled top level never ran"
    );
}

/// A cap of 1: the first message's handler ignores its cancel and holds the cap until it is
/// dropped after the grace; then the second runs.
async fn a_dropped_handler_frees_the_cap(env: &Env) {
    dropped_frees_the_cap(env, Queue::List("{cc}")).await;
}

async fn a_dropped_stream_handler_frees_the_cap(env: &Env) {
    dropped_frees_the_cap(env, Queue::Stream("{sc}")).await;
}

async fn dropped_frees_the_cap(env: &Env, q: Queue) {
    let worker = Worker::default();
    let app = q.source().max_in_flight(1).run(env, &worker).await;
    q.publish(env, "first", "ignore", None).await;
    env.eventually("first running", async || worker.called("first") == 1)
        .await;
    q.publish(env, "second", "ack", None).await;
    env.advance(Duration::from_millis(300)).await;
    assert_eq!(worker.calls(), ["first"], "the cap holds the second back");
    assert_eq!(q.cancel_twice(env, "first").await, CancelOutcome::Signalled);
    env.eventually("second handled", async || worker.called("second") == 1)
        .await;
    q.settled(env).await;
    env.stop(app).await;
    assert!(worker.dropped_at().is_some(), "the first was dropped");
}

async fn a_cancel_reaches_each_partition(env: &Env) {
    cancel_reaches_each_partition(env, Queue::List("cpart")).await;
}

async fn a_stream_cancel_reaches_each_partition(env: &Env) {
    cancel_reaches_each_partition(env, Queue::Stream("spart")).await;
}

/// Three running messages over two partitions: the cancel finds each (it tries every
/// partition), and each partition's reader hears the signal.
async fn cancel_reaches_each_partition(env: &Env, q: Queue) {
    let worker = Worker::default();
    let app = q.source().partitions(2).run(env, &worker).await;
    let key = q.key();
    let broker = match q {
        Queue::List(_) => env.broker(),
        Queue::Stream(_) => {
            env.broker_with(|b| b.route(key, ruststream::stream::Publish::new().partitions(2)))
        }
    };
    broker.connect().await.expect("connect");
    let publisher = broker.publisher();
    for id in ["p0", "p1", "p2"] {
        let j = Job::new("watch");
        job(&publisher, &j, key, id)
            .publish()
            .await
            .expect("publish");
    }
    env.eventually("all running", async || worker.calls().len() == 3)
        .await;
    for id in ["p0", "p1", "p2"] {
        let first = publisher.cancel(key, id).await.expect("cancel");
        let again = publisher.cancel(key, id).await.expect("cancel again");
        assert_eq!(
            (first, again),
            (CancelOutcome::Signalled, CancelOutcome::Signalled)
        );
    }
    for part in ["{%:0}", "{%:1}"] {
        let part = part.replace('%', key);
        match q {
            Queue::List(_) => settled(env, &part).await,
            Queue::Stream(_) => stream_settled(env, &part).await,
        }
    }
    env.stop(app).await;
    assert_eq!(worker.saw_cancel.load(Ordering::SeqCst), 3, "each told");
    assert_eq!(worker.calls().len(), 3, "none delivered again");
}

/// A broker that publishes `key` as a stream.
fn stream_broker(env: &Env, key: &str) -> RedisBroker {
    env.broker_with(|b| b.route(key, ruststream::stream::Publish::new()))
}

/// Publishes job `id` in `mode` to the stream `key`; `delay` later, if given.
async fn publish_stream(env: &Env, key: &str, id: &str, mode: &str, delay: Option<Duration>) {
    let broker = stream_broker(env, key);
    broker.connect().await.expect("connect");
    let publisher = broker.publisher();
    let job = Job::new(mode);
    let mut p = self::job(&publisher, &job, key, id);
    if let Some(d) = delay {
        p = p.delay(d);
    }
    p.publish().await.expect("publish");
}

/// Cancels `id` of the stream `key` twice (the second as a resend): both answer the same.
async fn cancel_stream_twice(env: &Env, key: &str, id: &str) -> CancelOutcome {
    let publisher = stream_broker(env, key).publisher();
    let first = publisher.cancel(key, id).await.expect("cancel");
    let again = publisher.cancel(key, id).await.expect("cancel again");
    assert_eq!(first, again, "a resent cancel answers what the first did");
    first
}

fn stream(key: &str) -> RedisStream {
    RedisStream::new(key)
        .group("g")
        .block(Duration::from_millis(100))
        .cancel_grace(Duration::from_millis(500))
}

/// Starts an app reading the stream `source` into `worker`.
async fn run_stream(env: &Env, source: RedisStream, worker: &Worker) -> RunningApp {
    let w = worker.clone();
    env.start_with(move |m| {
        m.include(subscriber(source, w).build());
    })
    .await
}

/// Waits until nothing of group `g` of `key` is pending.
async fn stream_settled(env: &Env, key: &str) {
    env.eventually("settled", async || env.pending(key, "g").await == 0)
        .await;
}

/// The cancel runs while the handler is held; the handler then asks for a retry: the cancel
/// ran first, so the entry is only acked (nothing re-added, nothing delayed).
async fn a_stream_cancel_before_the_settle_wins(env: &Env) {
    let worker = Worker::default();
    let held = stream("{sw}").cancel_grace(Duration::from_secs(30));
    let app = run_stream(env, held, &worker).await;
    publish_stream(env, "{sw}", "w", "hold", None).await;
    env.eventually("w running", async || worker.called("w") == 1)
        .await;
    assert_eq!(
        cancel_stream_twice(env, "{sw}", "w").await,
        CancelOutcome::Signalled
    );
    worker.go.notify_one();
    stream_settled(env, "{sw}").await;
    env.advance(Duration::from_millis(300)).await;
    env.stop(app).await;
    assert_eq!(worker.calls(), ["w"], "its retry was not carried out");
    let len = env
        .cmd("XLEN", vec![Value::from(env.key("{sw}"))])
        .await
        .expect("XLEN");
    assert_eq!(len.as_i64(), Some(1), "nothing re-added to the stream");
    assert_eq!(env.zcard("{sw}.delayed").await, 0);
}

/// The handler settles first: the cancel finds nothing running nor unread, and records
/// nothing.
async fn a_stream_settle_before_the_cancel_wins(env: &Env) {
    let worker = Worker::default();
    let app = run_stream(env, stream("{sa}"), &worker).await;
    publish_stream(env, "{sa}", "done", "ack", None).await;
    env.eventually("done handled", async || worker.called("done") == 1)
        .await;
    stream_settled(env, "{sa}").await;
    assert_eq!(
        cancel_stream_twice(env, "{sa}", "done").await,
        CancelOutcome::NotFound
    );
    env.stop(app).await;
    assert!(!env.exists("{sa}.cancels").await, "nothing recorded");
}

/// The operator's cancel (`cancel SUB --id`, the dashboard's form) on a stream subscription:
/// a delayed message is removed, an unread one marked (and never handled), an unknown id not
/// found; each answer the same when resent.
async fn the_operator_cancels_on_a_stream_subscription(env: &Env) {
    publish_stream(env, "{so}", "later", "ack", Some(Duration::from_secs(3600))).await;
    publish_stream(env, "{so}", "a", "ack", None).await;
    publish_stream(env, "{so}", "b", "ack", None).await;
    let operator = env
        .broker()
        .operator(&[ruststream::RedisSource::from(stream("{so}"))]);
    operator.connect().await.expect("operator");
    for (id, expect) in [
        ("later", CancelOutcome::Removed),
        ("a", CancelOutcome::Marked),
        ("nobody", CancelOutcome::Marked),
    ] {
        for _ in 0..2 {
            let got = operator.cancel_message("{so}", id).await.expect("cancel");
            assert_eq!(got, expect, "cancel {id}");
        }
    }
    let worker = Worker::default();
    let app = run_stream(env, stream("{so}"), &worker).await;
    env.eventually("b handled", async || worker.called("b") == 1)
        .await;
    stream_settled(env, "{so}").await;
    assert_eq!(
        operator
            .cancel_message("{so}", "other")
            .await
            .expect("cancel"),
        CancelOutcome::NotFound,
        "all read and settled: nothing to find"
    );
    env.stop(app).await;
    assert_eq!(worker.calls(), ["b"], "the marked message never ran");
    assert_eq!(env.zcard("{so}.delayed").await, 0);
}

/// A consumer signalled, then dead before its settle (its handler ignored the cancel and its app
/// stopped before the grace, leaving the entry pending): another consumer's sweep claims the
/// entry, acks it, and does not run it again.
async fn a_cancelled_stream_entry_of_a_dead_consumer_is_not_run_again(env: &Env) {
    let key = "{sd}";
    let source = |name: &str| {
        stream(key)
            .consumer(name)
            .min_idle(Duration::from_millis(300))
            .cancel_grace(Duration::from_secs(60))
    };
    let dying = Worker::default();
    let (s, d) = (source("a"), dying.clone());
    let app = env
        .app(move |m| {
            m.include(subscriber(s, d).build());
        })
        .shutdown_timeout(Duration::from_millis(100));
    let app = env.start(app).await;
    publish_stream(env, key, "x", "ignore", None).await;
    env.eventually("x running", async || dying.called("x") == 1)
        .await;
    assert_eq!(
        cancel_stream_twice(env, key, "x").await,
        CancelOutcome::Signalled
    );
    env.stop(app).await;
    assert_eq!(
        env.pending(key, "g").await,
        1,
        "left pending by its dead consumer"
    );
    let worker = Worker::default();
    let app = run_stream(env, source("b"), &worker).await;
    env.advance(Duration::from_millis(400)).await;
    stream_settled(env, key).await;
    env.stop(app).await;
    assert_eq!(
        worker.calls(),
        Vec::<String>::new(),
        "the cancelled entry ran again"
    );
}

/// A batch handler that waits (bounded) for each `watch` item's cancel, counting those told.
#[derive(Clone, Default)]
struct BatchWorker {
    batches: Arc<Mutex<Vec<Vec<String>>>>,
    told: Arc<AtomicUsize>,
}

impl ruststream::HandleBatch<Job> for BatchWorker {
    async fn handle_batch(
        &self,
        jobs: &[Job],
        ctx: &mut ruststream::BatchContext<'_>,
    ) -> ruststream::BatchOutcome {
        let ids = ctx.infos().map(|i| i.message_id.clone()).collect();
        self.batches.lock().expect("lock").push(ids);
        for (i, job) in jobs.iter().enumerate() {
            if job.mode == "watch"
                && tokio::time::timeout(WAIT, ctx.cancelled(i)).await.is_ok()
                && ctx.is_cancelled(i)
            {
                self.told.fetch_add(1, Ordering::SeqCst);
            }
        }
        ruststream::BatchOutcome::ack()
    }
}

/// A batch of two, one item cancelled while the batch runs: the handler is told of that item
/// (`BatchContext::cancelled(i)`), the batch call is not dropped, the other item is acked, and
/// the cancelled one settles cancelled (its awaiter fails with `Error::Cancelled`) although the
/// batch acked it.
async fn a_batch_handler_is_told_of_its_cancelled_item(env: &Env) {
    let key = "{cb}";
    publish(env, key, "plain", "ack").await;
    let producer = env.broker();
    let waiting = {
        let producer = producer.clone();
        tokio::spawn(async move { awaited(&producer, key, "watched", "watch").await })
    };
    env.eventually("both queued", async || env.llen(key).await == 2)
        .await;
    let worker = BatchWorker::default();
    let w = worker.clone();
    let app = env
        .start_with(move |m| {
            m.include(
                subscriber(list(key), w)
                    .batch(2)
                    .max_wait(Duration::from_secs(1))
                    .build(),
            );
        })
        .await;
    env.eventually("the batch runs", async || {
        !worker.batches.lock().expect("lock").is_empty()
    })
    .await;
    assert_eq!(
        cancel_twice(env, key, "watched").await,
        CancelOutcome::Signalled
    );
    let awaited = harness::bounded("the awaiter", WAIT, waiting)
        .await
        .expect("the awaiter's task");
    assert_eq!(
        awaited
            .expect_err("a cancelled job fails its awaiter")
            .kind(),
        ErrorKind::Cancelled
    );
    settled(env, key).await;
    env.stop(app).await;
    assert_eq!(worker.told.load(Ordering::SeqCst), 1, "told of its item");
    let batches = worker.batches.lock().expect("lock").clone();
    assert_eq!(batches.len(), 1, "one batch, not run again: {batches:?}");
    assert_eq!(batches[0].len(), 2, "both items in it: {batches:?}");
    assert_eq!(env.llen(key).await, 0, "nothing left queued");
    assert_eq!(
        env.llen(&format!("{key}.dead")).await,
        0,
        "a cancel is no dead letter"
    );
}
