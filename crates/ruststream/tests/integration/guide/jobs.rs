//! The guide's report service: periodic reports, urgent ones first, results the publisher awaits,
//! a unique monthly report, and e-mails within a quota (the pages "Periodic jobs",
//! "Job ids" and "Queue control").

use std::time::Duration;

use ruststream::prelude::*;
use ruststream::testing::TestApp;

// ANCHOR: periodic
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Outgoing)]
struct Report {
    kind: String,
}

/// Every five minutes, Paris time: one message per tick, however many instances run.
#[ruststream::periodic("0 */5 * * * *", tz = "Europe/Paris", to = "{reports}")]
fn every_five_minutes() -> Report {
    Report {
        kind: "summary".into(),
    }
}
// ANCHOR_END: periodic

// ANCHOR: handler
/// Builds a report, the urgent ones (level 1) first; reports progress and sets a result the
/// publisher can await.
#[subscriber(
    RedisList::new("{reports}")
        .reliable()
        .priorities(2)
)]
async fn build(report: &Report, ctx: &mut Context<'_>) -> ruststream::Result<()> {
    ctx.progress(&"started").await?;
    ctx.set_result(&format!("{} report ready", report.kind))
        .await
}

/// Sends e-mails: at most 10 a minute across every instance (the provider's quota).
#[subscriber(RedisList::new("{emails}").rate_limit(10, Duration::from_secs(60)))]
async fn send_email(report: &Report) -> HandlerOutcome {
    tracing::info!(report.kind, "e-mailed");
    HandlerOutcome::ack()
}

fn app() -> impl App {
    RustStream::new(AppInfo::new("reports", "0.1.0")).with_broker(RedisBroker::from_env(), |b| {
        b.include(build);
        b.include(send_email);
        b.periodic(every_five_minutes);
    })
}
// ANCHOR_END: handler

// ANCHOR: ticks
#[tokio::test(start_paused = true)]
async fn one_report_every_five_minutes() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    tb.advance(Duration::from_secs(10 * 60)).await?;
    tb.broker::<RedisBroker>()
        .published::<Report>("{reports}")
        .assert_called(2);
    tb.shutdown().await
}
// ANCHOR_END: ticks

// ANCHOR: result
#[tokio::test(start_paused = true)]
async fn the_publisher_awaits_the_result() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let publisher = tb.broker::<RedisBroker>().broker().publisher();
    let sales = Report {
        kind: "sales".into(),
    };
    // An urgent report (level 1), whose result the publisher waits for, up to a minute.
    let awaited = tokio::spawn(async move {
        publisher
            .message(&sales)
            .to("{reports}")
            .priority(1)
            .publish()
            .await_result::<String>(Duration::from_secs(60))
            .await
    });
    tb.advance(Duration::from_secs(1)).await?;
    let result = awaited.await.expect("the task")?;
    assert_eq!(result, "sales report ready");
    tb.shutdown().await
}
// ANCHOR_END: result

// ANCHOR: unique
#[tokio::test(start_paused = true)]
async fn a_unique_job_is_enqueued_once() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let b = tb.broker::<RedisBroker>();
    let monthly = Report {
        kind: "monthly".into(),
    };
    let publish = || {
        b.message(&monthly)
            .to("{emails}")
            .id("monthly-2026-12")
            .unique_for(Duration::from_secs(3600))
            .publish()
    };
    let first = publish().await?;
    let again = publish().await?;
    assert!(first.is_enqueued());
    assert!(!again.is_enqueued());
    tb.shutdown().await
}
// ANCHOR_END: unique

// ANCHOR: rate
#[tokio::test(start_paused = true)]
async fn ten_emails_a_minute() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let b = tb.broker::<RedisBroker>();
    let report = Report {
        kind: "daily".into(),
    };
    for _ in 0..12 {
        b.message(&report).to("{emails}").publish().await?;
    }
    // A burst of 10, then one every 6 s.
    tb.advance(Duration::from_secs(1)).await?;
    b.subscriber("{emails}").assert_called(10);
    tb.advance(Duration::from_secs(6)).await?;
    b.subscriber("{emails}").assert_called(11);
    tb.advance(Duration::from_secs(6)).await?;
    b.subscriber("{emails}").assert_called(12);
    tb.shutdown().await
}
// ANCHOR_END: rate
