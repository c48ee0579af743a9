//! Flows on every kind of queue: children on priority levels, partitions,
//! delayed and retried; parents and children on streams and as a batch handler's items (a
//! nested flow's parent among them). On the model, the standalone server and the cluster; the
//! workers and the log are `flows.rs`'.

use crate::harness;

use std::time::Duration;

use harness::{Env, on};
use ruststream::OutMessage;
use ruststream::prelude::*;

use super::flows::{Log, Part, PartWorker, REPORTS, Report, ReportWorker, acked, reliable, report};

on!(
    [memory, standalone, cluster] multi_thread:
    children_compose_with_levels_partitions_delays_and_retries,
    streams_and_batch_items_are_children_and_parents,
);

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
            self.log.report("batch", &id, children);
        }
        BatchOutcome::ack()
    }
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
