//! The guide's "Job ids": an export cancelled by its id while it runs.

use std::time::Duration;

use ruststream::prelude::*;
use ruststream::testing::TestApp;
use ruststream::{CancelOutcome, Settlement};

// ANCHOR: service
#[derive(Debug, PartialEq, Deserialize, Serialize, Outgoing)]
struct Export {
    rows: u64,
}

/// A long export that stops early when its job is cancelled.
#[subscriber(RedisList::new("{exports}").reliable())]
async fn export(job: &Export, ctx: &mut Context<'_>) -> HandlerOutcome {
    tokio::select! {
        () = ctx.cancelled() => tracing::info!("export stopped"),
        () = tokio::time::sleep(Duration::from_millis(job.rows)) => tracing::info!("exported"),
    }
    HandlerOutcome::ack()
}

fn app() -> impl App {
    RustStream::new(AppInfo::new("exports", "0.1.0")).with_broker(RedisBroker::from_env(), |b| {
        b.include(export);
    })
}
// ANCHOR_END: service

#[tokio::test(start_paused = true)]
async fn a_running_export_is_cancelled_by_its_id() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let publisher = tb.broker::<RedisBroker>().broker().publisher();
    // ANCHOR: publish
    // The id is what a later cancel names: set it on the publish.
    publisher
        .message(&Export { rows: 3_600_000 })
        .to("{exports}")
        .id("export-42")
        .publish()
        .await?;
    // ANCHOR_END: publish
    tb.advance(Duration::from_secs(1)).await?;
    // ANCHOR: cancel
    let outcome = publisher.cancel("{exports}", "export-42").await?;
    // ANCHOR_END: cancel
    assert_eq!(outcome, CancelOutcome::Signalled);
    tb.advance(Duration::from_secs(1)).await?;
    tb.broker::<RedisBroker>()
        .subscriber("{exports}")
        .assert_called_once()
        .settled(Settlement::Cancelled);
    // A second cancel, as a client resends one whose reply was lost, answers what the first
    // did and runs nothing again.
    let again = publisher.cancel("{exports}", "export-42").await?;
    assert_eq!(again, outcome);
    tb.advance(Duration::from_secs(1)).await?;
    tb.broker::<RedisBroker>()
        .subscriber("{exports}")
        .assert_called_once();
    tb.shutdown().await
}
