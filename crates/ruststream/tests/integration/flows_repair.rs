//! Flows whose publisher stopped halfway: a flow whose record is written but
//! whose children are only partly published (`RedisBroker::publish_flow_halfway`, a publisher
//! that stops after its first children) is finished by a reader of its parent's queue after
//! the grace, from the plan in its record, nested flow included (and a partitioned parent's, by
//! its partition's reader); its parent then runs once.
//! Two readers repairing at once, and a repair of a flow published whole, do nothing twice; a
//! plan that cannot be decoded takes the flow out of the publishing set. Each repair is counted
//! in `ruststream_flow_repairs_total{queue,outcome}`. A publisher SIGKILLed mid-flow is in
//! `processes/flows.rs`.

use crate::harness;

use std::time::Duration;

use harness::{Env, on};
use ruststream::RunningApp;
use ruststream::flow::OutFlow;
use ruststream::prelude::*;

use super::flows::{Log, Part, ReportWorker, inner, report, workers_on};

on!(
    [memory, standalone, cluster] multi_thread:
    a_flow_left_halfway_is_finished_by_a_reader_of_its_parents_queue,
    two_readers_and_a_second_repair_enqueue_the_parent_once,
);

on!([memory, standalone] multi_thread: an_undecodable_plan_takes_the_flow_out_of_the_set);

on!([memory] a_zero_grace_is_refused_at_startup);

on!([memory, standalone, cluster] multi_thread: a_partitioned_parents_flow_is_repaired_by_its_partitions_reader);

const REPORTS: &str = "{reports}";
const PARTS: &str = "{parts}";
const EXTRA: &str = "{extra}";
/// The parents' queue's flows being published.
const PUBLISHING: &str = "{reports}.flows.publishing";
const GRACE: Duration = Duration::from_millis(300);

/// An app reading the parents' and children's queues, on a broker that repairs flows after
/// [`GRACE`] and looks every 50 ms.
async fn repairing_workers(env: &Env, log: &Log) -> RunningApp {
    let broker = env.broker_with(|b| {
        b.flow_repair_grace(GRACE)
            .schedule_interval(Duration::from_millis(50))
    });
    workers_on(env, broker, log, None).await
}

/// Waits until `ruststream_flow_repairs_total` of the parents' queue counts `n` repairs with
/// `outcome` (the recorder is the process's: each environment's prefix makes the queue its own).
async fn repairs_counted(env: &Env, outcome: &str, n: f64) {
    let prometheus = harness::metrics::prometheus();
    let queue = format!("queue=\"{}\"", env.key(REPORTS));
    let outcome = format!("outcome=\"{outcome}\"");
    env.eventually("the repair is counted", async || {
        let text = prometheus.render();
        harness::metrics::sample(&text, "ruststream_flow_repairs_total", &[&queue, &outcome])
            == Some(n)
    })
    .await;
}

/// The flow `id`: three parts on two queues, and a nested flow of two parts whose parent goes to
/// `{mid}` ([`inner`]).
fn nested(env: &Env, id: &str) -> OutFlow {
    nested_by(&env.broker().publisher(), id)
        .build()
        .expect("a flow")
}

fn nested_by<'a>(publisher: &'a Publisher, id: &str) -> ruststream::flow::FlowBuilder<'a> {
    publisher
        .flow(&report())
        .to(REPORTS)
        .id(id)
        .child(&Part { n: 1 }, PARTS)
        .child(&Part { n: 2 }, EXTRA)
        .child_flow(inner(publisher))
        .child(&Part { n: 3 }, PARTS)
}

async fn a_flow_left_halfway_is_finished_by_a_reader_of_its_parents_queue(env: &Env) {
    // Its record, then its first child only: the nested flow is not even started.
    env.broker()
        .publish_flow_halfway(nested(env, "r1"), 1)
        .await
        .expect("publish halfway");
    assert_eq!((env.llen(PARTS).await, env.llen(EXTRA).await), (1, 0));
    assert_eq!(
        env.zcard(PUBLISHING).await,
        1,
        "the flow is being published"
    );
    assert!(env.pttl(PUBLISHING).await > 0, "the set has a ttl");
    harness::metrics::prometheus();
    let log = Log::default();
    let app = repairing_workers(env, &log).await;
    env.eventually("the parent ran", async || {
        log.count("report:{reports}:r1") == 1
    })
    .await;
    repairs_counted(env, "published", 1.0).await;
    for child in ["r1.0", "r1.1", "r1.3", "r1.2.0", "r1.2.1"] {
        assert!(
            log.count(&format!("part:{child}")) >= 1,
            "{child} ran: {:?}",
            log.events()
        );
    }
    assert_eq!(
        log.count("report:{mid}:r1.2"),
        1,
        "the nested parent ran once"
    );
    let children = &log.children("r1")[0];
    let ids: Vec<&str> = children.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["r1.0", "r1.1", "r1.2", "r1.3"]);
    assert!(children.iter().all(|c| c.outcome == ChildOutcome::Acked));
    // Published whole: out of the sets, the plans deleted.
    assert_eq!(env.zcard(PUBLISHING).await, 0);
    assert_eq!(env.zcard("{mid}.flows.publishing").await, 0);
    let plan = env
        .cmd(
            "HEXISTS",
            vec![env.key("{reports}.flow:r1").into(), "plan".into()],
        )
        .await
        .expect("HEXISTS");
    assert_eq!(plan.as_i64(), Some(0), "the plan is deleted");
    env.advance(GRACE * 2).await;
    assert_eq!(log.count("report:{reports}:r1"), 1, "the parent ran once");
    env.stop(app).await;
}

async fn two_readers_and_a_second_repair_enqueue_the_parent_once(env: &Env) {
    env.broker()
        .publish_flow_halfway(nested(env, "r2"), 0)
        .await
        .expect("publish halfway");
    let log = Log::default();
    let (one, two) = (
        repairing_workers(env, &log).await,
        repairing_workers(env, &log).await,
    );
    env.eventually("the parent ran", async || {
        log.count("report:{reports}:r2") == 1
    })
    .await;
    // A repair of the flow published whole (its entry back, as a reader that took it late
    // would find it): its plan is gone, so it only leaves the set.
    let record = env.key("{reports}.flow:r2");
    env.cmd(
        "ZADD",
        vec![env.key(PUBLISHING).into(), 0.into(), record.into()],
    )
    .await
    .expect("ZADD");
    env.eventually("the entry is dropped", async || {
        env.zcard(PUBLISHING).await == 0
    })
    .await;
    // And the same flow published again by its publisher: nothing new.
    nested_by(&env.broker().publisher(), "r2")
        .publish()
        .await
        .expect("publish again");
    env.advance(GRACE * 2).await;
    assert_eq!(log.count("report:{reports}:r2"), 1, "the parent ran once");
    assert_eq!(
        log.count("report:{mid}:r2.2"),
        1,
        "the nested parent ran once"
    );
    for child in ["r2.0", "r2.1", "r2.3", "r2.2.0", "r2.2.1"] {
        let runs = log.count(&format!("part:{child}"));
        assert!((1..=2).contains(&runs), "{child} ran {runs} times");
    }
    env.stop(one).await;
    env.stop(two).await;
}

async fn an_undecodable_plan_takes_the_flow_out_of_the_set(env: &Env) {
    env.broker()
        .publish_flow_halfway(nested(env, "r3"), 1)
        .await
        .expect("publish halfway");
    let record = env.key("{reports}.flow:r3");
    env.cmd(
        "HSET",
        vec![record.into(), "plan".into(), "{not a plan".into()],
    )
    .await
    .expect("HSET");
    harness::metrics::prometheus();
    let log = Log::default();
    let app = repairing_workers(env, &log).await;
    env.eventually("the entry is dropped", async || {
        env.zcard(PUBLISHING).await == 0
    })
    .await;
    repairs_counted(env, "undecodable", 1.0).await;
    env.advance(GRACE * 2).await;
    assert_eq!(log.count("report:{reports}:r3"), 0, "the parent never ran");
    assert_eq!(log.count("part:r3.1"), 0, "nothing was repaired");
    env.stop(app).await;
}

async fn a_zero_grace_is_refused_at_startup(env: &Env) {
    let app = RustStream::new(AppInfo::new("flows-repair", "0.0.0")).with_broker(
        env.broker_with(|b| b.flow_repair_grace(Duration::ZERO)),
        |b| {
            b.include(
                subscriber(
                    RedisList::new(REPORTS).reliable(),
                    ReportWorker {
                        log: Log::default(),
                    },
                )
                .build(),
            );
        },
    );
    let err = env.refusal(app).await;
    assert_eq!(err.option, "RedisBroker::flow_repair_grace", "{err}");
}

async fn a_partitioned_parents_flow_is_repaired_by_its_partitions_reader(env: &Env) {
    let spread = |b: RedisBroker| b.route("spread", list::Publish::new().partitions(3));
    let publisher = env.broker_with(spread).publisher();
    let flow = publisher
        .flow(&report())
        .to("spread")
        .id("r5")
        .child(&Part { n: 1 }, PARTS)
        .child(&Part { n: 2 }, PARTS)
        .build()
        .expect("a flow");
    env.broker_with(spread)
        .publish_flow_halfway(flow, 1)
        .await
        .expect("publish halfway");
    let log = Log::default();
    let (parts, reports) = (
        super::flows::PartWorker {
            log: log.clone(),
            drop: None,
            retry: None,
        },
        ReportWorker { log: log.clone() },
    );
    let broker = env.broker_with(|b| {
        b.flow_repair_grace(GRACE)
            .schedule_interval(Duration::from_millis(50))
    });
    let app = RustStream::new(AppInfo::new("flows-repair", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(broker, move |b| {
            b.include(subscriber(RedisList::new(PARTS).reliable(), parts).build());
            b.include(
                subscriber(RedisList::new("spread").reliable().partitions(3), reports).build(),
            );
        });
    let app = env.start(app).await;
    env.eventually("the parent ran", async || {
        log.events()
            .iter()
            .filter(|e| e.ends_with(":r5") && e.starts_with("report:"))
            .count()
            == 1
    })
    .await;
    assert_eq!((log.count("part:r5.0"), log.count("part:r5.1")), (1, 1));
    env.advance(GRACE * 2).await;
    let parents = log
        .events()
        .iter()
        .filter(|e| e.starts_with("report:"))
        .count();
    assert_eq!(parents, 1, "the parent ran once: {:?}", log.events());
    env.stop(app).await;
}
