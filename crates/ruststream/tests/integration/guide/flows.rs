//! The guide's "Flows": a report built after its parts, each part on a queue of its own, the
//! report reading the parts' results.

use std::time::Duration;

use ruststream::Settlement;
use ruststream::prelude::*;
use ruststream::testing::TestApp;

// ANCHOR: service
#[derive(Debug, PartialEq, Deserialize, Serialize, Outgoing)]
struct Count {
    region: String,
}

#[derive(Debug, PartialEq, Deserialize, Serialize, Outgoing)]
struct Summary {
    week: u32,
}

/// A child: counts one region's orders and sets the count as its result.
#[subscriber(RedisList::new("{counts}").reliable())]
async fn count(job: &Count, ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
    let orders: u64 = if job.region == "eu" { 120 } else { 80 };
    ctx.set_result(&orders)
        .await
        .map_err(|_| HandlerOutcome::retry())
}

/// The parent: runs once, after every count is done, and adds up their results.
#[subscriber(RedisList::new("{summaries}").reliable())]
async fn summarise(summary: &Summary, ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
    let children = ctx.children().await.map_err(|_| HandlerOutcome::retry())?;
    let mut total = 0;
    for child in &children {
        if child.outcome == ChildOutcome::Acked {
            total += child.result::<u64>().ok().flatten().unwrap_or(0);
        }
    }
    ctx.set_result(&total)
        .await
        .map_err(|_| HandlerOutcome::retry())?;
    tracing::info!(week = summary.week, total, "summary");
    Ok(())
}

fn app() -> impl App {
    RustStream::new(AppInfo::new("sales", "0.1.0")).with_broker(RedisBroker::from_env(), |b| {
        b.include(count);
        b.include(summarise);
    })
}
// ANCHOR_END: service

// ANCHOR: test
#[tokio::test(start_paused = true)]
async fn the_summary_runs_after_its_counts_with_their_results() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let publisher = tb.broker::<RedisBroker>().broker().publisher();
    // ANCHOR: publish
    let id = publisher
        .flow(&Summary { week: 48 })
        .to("{summaries}")
        .id("week-48")
        .on_child_failure(ChildFailure::FailParent)
        .child(
            &Count {
                region: "eu".into(),
            },
            "{counts}",
        )
        .child(
            &Count {
                region: "us".into(),
            },
            "{counts}",
        )
        .publish()
        .await?;
    // ANCHOR_END: publish
    tb.advance(Duration::from_secs(1)).await?;
    let b = tb.broker::<RedisBroker>();
    b.subscriber("{counts}")
        .assert_called(2)
        .settled(Settlement::Ack);
    b.subscriber("{summaries}")
        .assert_called_once()
        .with(&Summary { week: 48 })
        .settled(Settlement::Ack);
    let total = publisher
        .job_state(&id)
        .await?
        .expect("the summary's result");
    assert_eq!(total.result::<u64>()?, Some(200));
    tb.shutdown().await
}
// ANCHOR_END: test
