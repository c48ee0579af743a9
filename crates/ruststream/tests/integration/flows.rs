//! Flows (issue 23 point 2): a parent published with children (`publisher.flow(&parent)`) runs
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
use ruststream::prelude::*;
use ruststream::testing::TestApp;
use ruststream::{FlowChild, OutMessage, RunningApp};

on!(
    [memory, standalone, cluster] multi_thread:
    a_parent_runs_once_after_its_children_with_their_results,
    a_dead_child_fails_the_parent_naming_it,
    a_dead_child_is_left_out_when_the_flow_continues,
    a_nested_flow_completes_its_parent_when_its_own_parent_is_acked,
    a_resent_publish_and_a_child_run_twice_do_nothing_twice,
    children_compose_with_levels_partitions_delays_and_retries,
    streams_and_batch_items_are_children_and_parents,
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
const REPORTS: &str = "{reports}";
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

    fn push(&self, e: String) {
        self.events.lock().expect("lock").push(e);
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
        let id = ctx.message_id().to_owned();
        self.log
            .children
            .lock()
            .expect("lock")
            .push((id.clone(), children));
        let source = ctx.source().trim_start_matches(|c| c != '{').to_owned();
        self.log.push(format!("report:{source}:{id}"));
        Ok(())
    }
}

/// A batch handler: sets `n * 10` as each part's result; reads each report's children.
#[derive(Clone)]
pub struct BatchWorker {
    pub log: Log,
}

impl HandleBatch<Part> for BatchWorker {
    async fn handle_batch(&self, parts: &[Part], ctx: &mut BatchContext<'_>) -> BatchOutcome {
        for (i, p) in parts.iter().enumerate() {
            if ctx.set_result(i, &(p.n * 10)).await.is_err() {
                return BatchOutcome::all(HandlerOutcome::retry());
            }
            let id = ctx
                .info(i)
                .map(|d| d.message_id.clone())
                .unwrap_or_default();
            self.log.push(format!("part:{id}"));
        }
        BatchOutcome::ack()
    }
}

impl HandleBatch<Report> for BatchWorker {
    async fn handle_batch(&self, _: &[Report], ctx: &mut BatchContext<'_>) -> BatchOutcome {
        for i in 0..ctx.len() {
            let Ok(children) = ctx.children(i).await else {
                return BatchOutcome::all(HandlerOutcome::retry());
            };
            let id = ctx
                .info(i)
                .map(|d| d.message_id.clone())
                .unwrap_or_default();
            self.log
                .children
                .lock()
                .expect("lock")
                .push((id.clone(), children));
            self.log.push(format!("report:batch:{id}"));
        }
        BatchOutcome::ack()
    }
}

fn reliable(key: &str) -> RedisList {
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

fn acked(id: &str, result: u32) -> FlowChild {
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

async fn children_compose_with_levels_partitions_delays_and_retries(env: &Env) {
    let log = Log::default();
    let parts = PartWorker {
        log: log.clone(),
        drop: None,
        retry: Some(3),
    };
    let reports = ReportWorker { log: log.clone() };
    let app = env
        .start_with(|b| {
            b.include(subscriber(reliable("{levels}").priorities(3), parts.clone()).build());
            b.include(subscriber(reliable("spread").partitions(3), parts).build());
            b.include(subscriber(reliable(REPORTS).priorities(2), reports).build());
        })
        .await;
    let publisher = env
        .broker_with(|b| {
            b.route("{levels}", list::Publish::new().priorities(3))
                .route("spread", list::Publish::new().partitions(3))
        })
        .publisher();
    let mut high = OutMessage::new("{levels}", r#"{"n":1}"#.into());
    high.priority = 2;
    let mut later = OutMessage::new("{levels}", r#"{"n":2}"#.into());
    later.due = Some(ruststream::Due::In(Duration::from_millis(300)));
    let keyed = |n: u32| {
        let mut m = OutMessage::new("spread", format!(r#"{{"n":{n}}}"#).into());
        m.partition_key = Some(format!("key-{n}"));
        m
    };
    publisher
        .flow(&report())
        .to(REPORTS)
        .id("f6")
        .child_message(high)
        .child_message(later)
        .child_message(keyed(3))
        .child_message(keyed(4))
        .child_message(keyed(5))
        .publish()
        .await
        .expect("publish");
    env.eventually("the parent ran", async || {
        log.count("report:{reports}:f6") == 1
    })
    .await;
    let children = &log.children("f6")[0];
    let results: Vec<_> = children
        .iter()
        .map(|c| c.result::<u32>().expect("decodes"))
        .collect();
    assert_eq!(results, [Some(10), Some(20), Some(30), Some(40), Some(50)]);
    assert_eq!(
        log.count("part:f6.2"),
        1,
        "the retried child ran to its end once"
    );
    env.stop(app).await;
}

/// A flow's parent on a stream whose children are a stream's entries and a batch handler's
/// items; and a nested flow whose parents are items of a batch handler.
async fn streams_and_batch_items_are_children_and_parents(env: &Env) {
    const SREPORTS: &str = "{sreports}";
    const SPARTS: &str = "{sparts}";
    const BPARTS: &str = "{bparts}";
    const BREPORTS: &str = "{breports}";
    let log = Log::default();
    let parts = PartWorker {
        log: log.clone(),
        drop: None,
        retry: None,
    };
    let batch = BatchWorker { log: log.clone() };
    let reports = ReportWorker { log: log.clone() };
    let app = env
        .start_with(|b| {
            b.include(subscriber(RedisStream::new(SPARTS).group("g"), parts).build());
            b.include(
                subscriber(reliable(BPARTS), batch.clone())
                    .batch(4)
                    .max_wait(Duration::from_millis(20))
                    .build::<Part>(),
            );
            b.include(subscriber(RedisStream::new(SREPORTS).group("g"), reports).build());
            b.include(
                subscriber(reliable(BREPORTS), batch)
                    .batch(4)
                    .max_wait(Duration::from_millis(20))
                    .build::<Report>(),
            );
        })
        .await;
    let publisher = env
        .broker_with(|b| {
            b.route(SREPORTS, stream::Publish::new())
                .route(SPARTS, stream::Publish::new())
        })
        .publisher();
    // The inner flow's parent is a batch item, and a child of the outer flow.
    let inner = publisher
        .flow(&report())
        .to(BREPORTS)
        .child(&Part { n: 4 }, BPARTS)
        .child(&Part { n: 5 }, SPARTS);
    publisher
        .flow(&report())
        .to(SREPORTS)
        .id("f7")
        .child(&Part { n: 1 }, SPARTS)
        .child(&Part { n: 2 }, BPARTS)
        .child(&Part { n: 3 }, BPARTS)
        .child_flow(inner)
        .publish()
        .await
        .expect("publish the flow");
    env.eventually("the stream's parent ran", async || {
        log.count("report:{sreports}:f7") == 1
    })
    .await;
    assert_eq!(
        log.count("report:batch:f7.3"),
        1,
        "the inner parent ran once"
    );
    assert_eq!(
        log.children("f7.3"),
        [vec![acked("f7.3.0", 40), acked("f7.3.1", 50)]]
    );
    let outer = &log.children("f7")[0];
    let ids: Vec<&str> = outer.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["f7.0", "f7.1", "f7.2", "f7.3"]);
    let results: Vec<_> = outer[..3]
        .iter()
        .map(|c| c.result::<u32>().expect("decodes"))
        .collect();
    assert_eq!(results, [Some(10), Some(20), Some(30)]);
    assert_eq!(outer[3].outcome, ChildOutcome::Acked);
    env.advance(Duration::from_millis(200)).await;
    assert_eq!(log.count("report:{sreports}:f7"), 1, "the parent ran once");
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
