//! Flows: a parent published with children (`publisher.flow(&parent)`) runs
//! once, after its last child is settled, and reads the children's ids, outcomes and results
//! (`ctx.children()`). The children live on other queues than the parent (on the cluster: in
//! other slots). Run on the model (`memory`, virtual time), the standalone server and the
//! cluster; the lost reply of the last child's report is in `reliability`, a worker SIGKILLed
//! mid-flow in `processes/flows.rs`.

use crate::harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use harness::{Env, WAIT, on};
use ruststream::flow::FlowChild;
use ruststream::prelude::*;
use ruststream::testing::TestApp;
use ruststream::{OutMessage, RunningApp};

on!(
    [memory, standalone, cluster] multi_thread:
    a_parent_runs_once_after_its_children_with_their_results,
    a_dead_child_fails_the_parent_naming_it,
    a_dead_child_is_left_out_when_the_flow_continues,
    a_nested_flow_completes_its_parent_when_its_own_parent_is_acked,
    a_resent_publish_and_a_child_run_twice_do_nothing_twice,
);

// The proxy that loses replies works on a standalone server only.
on!([standalone] multi_thread: a_lost_reply_of_the_last_childs_report_enqueues_the_parent_once);

/// A child's work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Part {
    pub n: u32,
}

outgoing!(Part);

/// A parent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Report {
    pub name: String,
}

outgoing!(Report);

/// The parents' queue.
pub const REPORTS: &str = "{reports}";
/// A nested flow's parents' queue.
const MID: &str = "{mid}";
/// The children's queues: other slots than the parents'.
const PARTS: &str = "{parts}";
const EXTRA: &str = "{extra}";

/// The children each parent read, by parent id.
type ChildrenRead = Arc<Mutex<Vec<(String, Vec<FlowChild>)>>>;

/// What the handlers did, in order: `part:<id>`, `report:<source>:<id>`.
#[derive(Clone, Default)]
pub struct Log {
    events: Arc<Mutex<Vec<String>>>,
    children: ChildrenRead,
}

impl Log {
    pub fn events(&self) -> Vec<String> {
        self.events.lock().expect("lock").clone()
    }

    pub fn push(&self, e: String) {
        self.events.lock().expect("lock").push(e);
    }

    /// Logs the parent `id`'s reading of its `children`, then `report:<source>:<id>`.
    pub fn report(&self, source: &str, id: &str, children: Vec<FlowChild>) {
        let read = (id.to_owned(), children);
        self.children.lock().expect("lock").push(read);
        self.push(format!("report:{source}:{id}"));
    }

    /// How many times an event was logged.
    pub fn count(&self, e: &str) -> usize {
        self.events().iter().filter(|x| *x == e).count()
    }

    /// The children each parent read, by parent id.
    pub fn children(&self, parent: &str) -> Vec<Vec<FlowChild>> {
        let all = self.children.lock().expect("lock");
        all.iter()
            .filter(|(p, _)| p == parent)
            .map(|(_, c)| c.clone())
            .collect()
    }
}

/// Sets `n * 10` as a child's result; drops a part whose `n` is `drop`, retries once a part
/// whose `n` is `retry`.
#[derive(Clone)]
pub struct PartWorker {
    pub log: Log,
    pub drop: Option<u32>,
    pub retry: Option<u32>,
}

impl Handle<Part> for PartWorker {
    async fn handle(&self, p: &Part, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        if self.drop == Some(p.n) {
            return Err(HandlerOutcome::drop());
        }
        if self.retry == Some(p.n) && ctx.attempt() == 1 {
            return Err(HandlerOutcome::retry());
        }
        ctx.set_result(&(p.n * 10))
            .await
            .map_err(|_| HandlerOutcome::retry())?;
        self.log.push(format!("part:{}", ctx.message_id()));
        Ok(())
    }
}

/// Reads its children and logs them.
#[derive(Clone)]
pub struct ReportWorker {
    pub log: Log,
}

impl Handle<Report> for ReportWorker {
    async fn handle(
        &self,
        _: &Report,
        _: &(),
        ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        let children = ctx.children().await.map_err(|_| HandlerOutcome::retry())?;
        let source = ctx.source().trim_start_matches(|c| c != '{');
        self.log.report(source, ctx.message_id(), children);
        Ok(())
    }
}

pub fn reliable(key: &str) -> RedisList {
    RedisList::new(key)
        .reliable()
        .retry(Backoff::fixed(Duration::from_millis(20)))
}

/// An app reading the parents' and children's queues.
async fn workers(env: &Env, log: &Log, drop: Option<u32>) -> RunningApp {
    workers_on(env, env.broker(), log, drop).await
}

/// [`workers`] on `broker`.
pub async fn workers_on(
    env: &Env,
    broker: RedisBroker,
    log: &Log,
    drop: Option<u32>,
) -> RunningApp {
    let (parts, reports) = (
        PartWorker {
            log: log.clone(),
            drop,
            retry: None,
        },
        ReportWorker { log: log.clone() },
    );
    let app = RustStream::new(AppInfo::new("flows", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(broker, move |b| {
            b.include(subscriber(reliable(PARTS), parts.clone()).build());
            b.include(subscriber(reliable(EXTRA), parts).build());
            b.include(subscriber(reliable(REPORTS), reports.clone()).build());
            b.include(subscriber(reliable(MID), reports).build());
        });
    env.start(app).await
}

pub fn report() -> Report {
    Report {
        name: "weekly".into(),
    }
}

/// A flow to nest: a report to [`MID`] after two parts on two queues.
pub fn inner(publisher: &Publisher) -> ruststream::flow::FlowBuilder<'_> {
    publisher
        .flow(&report())
        .to(MID)
        .child(&Part { n: 4 }, PARTS)
        .child(&Part { n: 5 }, EXTRA)
}

/// The flow `id`: a report after three parts on two queues.
async fn publish_three(publisher: &Publisher, id: &str, policy: ChildFailure) -> String {
    publisher
        .flow(&report())
        .to(REPORTS)
        .id(id)
        .on_child_failure(policy)
        .child(&Part { n: 1 }, PARTS)
        .child(&Part { n: 2 }, EXTRA)
        .child(&Part { n: 3 }, PARTS)
        .publish()
        .await
        .expect("publish the flow")
}

pub fn acked(id: &str, result: u32) -> FlowChild {
    FlowChild::new(
        id.into(),
        ChildOutcome::Acked,
        Some(result.to_string().into()),
    )
}

async fn a_parent_runs_once_after_its_children_with_their_results(env: &Env) {
    let log = Log::default();
    let app = workers(env, &log, None).await;
    let id = publish_three(&env.broker().publisher(), "f1", ChildFailure::FailParent).await;
    assert_eq!(id, "f1");
    env.eventually("the parent ran", async || {
        log.count("report:{reports}:f1") == 1
    })
    .await;
    let events = log.events();
    let parent_at = events.iter().position(|e| e == "report:{reports}:f1");
    assert_eq!(
        parent_at,
        Some(3),
        "the parent ran after its three children: {events:?}"
    );
    assert_eq!(
        log.children("f1"),
        [vec![
            acked("f1.0", 10),
            acked("f1.1", 20),
            acked("f1.2", 30)
        ]]
    );
    let children = &log.children("f1")[0];
    assert_eq!(children[1].result::<u32>().expect("decodes"), Some(20));
    // The finished record lives the result ttl (1 h), no longer than the flow's max age.
    let ttl = env.pttl("{reports}.flow:f1").await;
    assert!(ttl > 0 && ttl <= 3_600_000, "the record's ttl: {ttl}");
    env.advance(Duration::from_millis(200)).await;
    assert_eq!(log.count("report:{reports}:f1"), 1, "the parent ran once");
    // What the operator's `flow show f1 --subscription {reports}` reads.
    let operator = env.broker().operator(&[
        ruststream::RedisSource::from(reliable(PARTS)),
        ruststream::RedisSource::from(reliable(REPORTS)),
    ]);
    operator.connect().await.expect("connect");
    let state = operator.flow(REPORTS, "f1").await.expect("read the flow");
    let state = state.expect("the flow's record");
    assert_eq!(
        (state.id.as_str(), state.state.as_str()),
        ("f1", "enqueued")
    );
    assert_eq!(state.children, log.children("f1")[0]);
    assert_eq!(operator.flow(REPORTS, "nope").await.expect("read"), None);
    // `flow show f1`, without the queue: every list and stream of the app is looked in.
    let (queue, found) = operator
        .find_flow("f1")
        .await
        .expect("look for the flow")
        .expect("found from its id alone");
    assert_eq!((queue.as_str(), &found), (REPORTS, &state));
    assert_eq!(operator.find_flow("nope").await.expect("look"), None);
    env.stop(app).await;
}

async fn a_dead_child_fails_the_parent_naming_it(env: &Env) {
    let log = Log::default();
    let app = workers(env, &log, Some(2)).await;
    publish_three(&env.broker().publisher(), "f2", ChildFailure::FailParent).await;
    env.eventually("the parent is dead-lettered", async || {
        env.llen("{reports}.dead").await == 1
    })
    .await;
    let dead = env.frames("{reports}.dead").await;
    assert_eq!(dead[0].id, "f2");
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("child-failed: f2.1")
    );
    // The other children still run; the parent never does.
    env.eventually("the other children ran", async || {
        log.count("part:f2.0") == 1 && log.count("part:f2.2") == 1
    })
    .await;
    env.advance(Duration::from_millis(200)).await;
    assert_eq!(log.count("report:{reports}:f2"), 0, "the parent never ran");
    assert_eq!(env.llen("{reports}.dead").await, 1, "dead-lettered once");
    // Requeued by the operator, the parent runs, and reads the dead child.
    let operator = env
        .broker()
        .operator(&[ruststream::RedisSource::from(reliable(REPORTS))]);
    operator.connect().await.expect("connect");
    let requeue = operator.requeue(
        REPORTS,
        &ruststream::redis::operate::Select::All { limit: None },
    );
    assert_eq!(requeue.await.expect("requeue"), 1);
    env.eventually("the requeued parent ran", async || {
        log.count("report:{reports}:f2") == 1
    })
    .await;
    let children = &log.children("f2")[0];
    assert!(
        matches!(&children[1].outcome, ChildOutcome::Dead { reason } if reason == "dropped"),
        "{children:?}"
    );
    assert_eq!(env.llen("{reports}.dead").await, 0);
    env.stop(app).await;
}

async fn a_dead_child_is_left_out_when_the_flow_continues(env: &Env) {
    let log = Log::default();
    let app = workers(env, &log, Some(2)).await;
    publish_three(&env.broker().publisher(), "f3", ChildFailure::Continue).await;
    env.eventually("the parent ran", async || {
        log.count("report:{reports}:f3") == 1
    })
    .await;
    let dead = FlowChild::new(
        "f3.1".into(),
        ChildOutcome::Dead {
            reason: "dropped".into(),
        },
        None,
    );
    assert_eq!(
        log.children("f3"),
        [vec![acked("f3.0", 10), dead, acked("f3.2", 30)]]
    );
    assert_eq!(env.llen("{reports}.dead").await, 0);
    env.stop(app).await;
}

async fn a_nested_flow_completes_its_parent_when_its_own_parent_is_acked(env: &Env) {
    let log = Log::default();
    let app = workers(env, &log, None).await;
    let publisher = env.broker().publisher();
    let inner = inner(&publisher);
    publisher
        .flow(&report())
        .to(REPORTS)
        .id("f4")
        .child(&Part { n: 1 }, PARTS)
        .child_flow(inner)
        .publish()
        .await
        .expect("publish");
    env.eventually("the outer parent ran", async || {
        log.count("report:{reports}:f4") == 1
    })
    .await;
    let events = log.events();
    let at = |e: &str| events.iter().position(|x| x == e).expect(e);
    assert!(at("part:f4.1.0") < at("report:{mid}:f4.1"), "{events:?}");
    assert!(at("part:f4.1.1") < at("report:{mid}:f4.1"), "{events:?}");
    assert!(
        at("report:{mid}:f4.1") < at("report:{reports}:f4"),
        "{events:?}"
    );
    assert_eq!(
        log.children("f4.1"),
        [vec![acked("f4.1.0", 40), acked("f4.1.1", 50)]]
    );
    // The inner parent set no result: acked, without one.
    assert_eq!(
        log.children("f4"),
        [vec![
            acked("f4.0", 10),
            FlowChild::new("f4.1".into(), ChildOutcome::Acked, None)
        ]]
    );
    env.stop(app).await;
}

async fn a_resent_publish_and_a_child_run_twice_do_nothing_twice(env: &Env) {
    let publisher = env.broker().publisher();
    // Sent twice before any worker runs (a lost reply, resent): one record, each child once.
    publish_three(&publisher, "f5", ChildFailure::FailParent).await;
    publish_three(&publisher, "f5", ChildFailure::FailParent).await;
    assert_eq!((env.llen(PARTS).await, env.llen(EXTRA).await), (2, 1));
    let copy = env.lrange(PARTS).await[0].clone();
    let copied = format!(
        "part:{}",
        ruststream::redis::frame::Frame::decode(copy.clone()).id
    );
    let log = Log::default();
    let app = workers(env, &log, None).await;
    env.eventually("the parent ran", async || {
        log.count("report:{reports}:f5") == 1
    })
    .await;
    // A child run again (as after a crash between its report and its settle): recorded once,
    // the parent is not enqueued again.
    let _: i64 = env.client.lpush(env.key(PARTS), copy).await.expect("LPUSH");
    env.eventually("the copy ran", async || log.count(&copied) == 2)
        .await;
    env.advance(Duration::from_millis(200)).await;
    assert_eq!(log.count("report:{reports}:f5"), 1, "the parent ran once");
    assert_eq!(env.llen(REPORTS).await, 0);
    env.stop(app).await;
}

async fn a_lost_reply_of_the_last_childs_report_enqueues_the_parent_once(env: &Env) {
    let proxy = harness::proxy::Proxy::start(env.url().expect("standalone")).await;
    let through_proxy = RedisBroker::standalone(proxy.url()).prefix(env.prefix.clone());
    let log = Log::default();
    let (parts, reports) = (
        PartWorker {
            log: log.clone(),
            drop: None,
            retry: None,
        },
        ReportWorker { log: log.clone() },
    );
    let app = RustStream::new(AppInfo::new("flows-cut", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(through_proxy, move |b| {
            b.include(subscriber(reliable(PARTS).concurrency(1), parts).build());
            b.include(subscriber(reliable(REPORTS), reports).build());
        });
    let app = env.start(app).await;
    // The last child's report (`flow/done.lua`: its id, then its outcome `a`) runs, enqueues the
    // parent, and its reply is lost: sent again (by fred, or by the child run again), it
    // changes nothing. The children run one at a time: `cut.1` is the last.
    let needle = b"cut.1\r\n$1\r\na\r\n";
    proxy.cut_after(needle);
    env.broker()
        .publisher()
        .flow(&report())
        .to(REPORTS)
        .id("cut")
        .child(&Part { n: 1 }, PARTS)
        .child(&Part { n: 2 }, PARTS)
        .publish()
        .await
        .expect("publish");
    env.eventually("the parent ran", async || {
        log.count("report:{reports}:cut") == 1
    })
    .await;
    assert_eq!(proxy.cuts(), 1, "the reply was cut");
    // Resent by fred at once, or by the child's next run (its report failed: a snooze of 1 s).
    env.eventually("the report was sent again", async || {
        proxy.sent_count(needle) >= 2
    })
    .await;
    env.eventually("the last child is settled", async || {
        env.llen("{parts}.processing").await == 0 && env.zcard("{parts}.delayed").await == 0
    })
    .await;
    env.advance(Duration::from_millis(300)).await;
    assert_eq!(log.count("report:{reports}:cut"), 1, "the parent ran once");
    assert_eq!(
        log.children("cut"),
        [vec![acked("cut.0", 10), acked("cut.1", 20)]]
    );
    env.stop(app).await;
}

/// On `TestApp`'s virtual clock: a flow with a delayed child waits for it.
#[tokio::test(start_paused = true)]
async fn a_flow_on_test_app_waits_for_its_delayed_child() -> ruststream::Result<()> {
    let log = Log::default();
    let (parts, reports) = (
        PartWorker {
            log: log.clone(),
            drop: None,
            retry: None,
        },
        ReportWorker { log: log.clone() },
    );
    let app = RustStream::new(AppInfo::new("flows", "0.0.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379"),
        |b| {
            b.include(subscriber(reliable(PARTS), parts).build());
            b.include(subscriber(reliable(REPORTS), reports).build());
        },
    );
    let tb = TestApp::start(app).await?;
    let mut later = OutMessage::new(PARTS, r#"{"n":2}"#.into());
    later.due = Some(ruststream::Due::In(Duration::from_secs(60)));
    tb.broker::<RedisBroker>()
        .broker()
        .publisher()
        .flow(&report())
        .to(REPORTS)
        .id("t1")
        .child(&Part { n: 1 }, PARTS)
        .child_message(later)
        .publish()
        .await?;
    tb.settle().await?;
    assert_eq!(
        log.events(),
        ["part:t1.0"],
        "the parent waits for the delayed child"
    );
    tb.advance(Duration::from_secs(61)).await?;
    tb.settle().await?;
    assert_eq!(
        log.events(),
        ["part:t1.0", "part:t1.1", "report:{reports}:t1"]
    );
    assert_eq!(
        log.children("t1"),
        [vec![acked("t1.0", 10), acked("t1.1", 20)]]
    );
    let _ = WAIT;
    tb.shutdown().await
}
