//! The guide's "Deadlines and snooze": a render that may hang, bounded by `timeout`, and a
//! report that waits for its data by snoozing.

use std::time::Duration;

use ruststream::Settlement;
use ruststream::prelude::*;
use ruststream::testing::TestApp;

// ANCHOR: service
#[derive(Debug, PartialEq, Deserialize, Serialize, Outgoing)]
struct Render {
    page: String,
}

#[derive(Debug, PartialEq, Deserialize, Serialize, Outgoing)]
struct Report {
    day: String,
    ready: bool,
}

/// At most 30 s a call: past it the call is stopped, the page is retried after the backoff, and
/// after 3 attempts it goes to `{renders}.dead` with reason `timeout`.
#[subscriber(
    RedisList::new("{renders}").reliable().max_attempts(3),
    timeout = Duration::from_secs(30)
)]
async fn render(job: &Render, ctx: &mut Context<'_>) -> HandlerOutcome {
    let left = ctx.deadline().map(|d| d - tokio::time::Instant::now());
    tracing::info!(page = %job.page, ?left, "rendering");
    if job.page == "huge" {
        // Stands for a call that never returns: the timeout stops it.
        std::future::pending::<()>().await;
    }
    HandlerOutcome::ack()
}

/// The day's data is not there yet: come back in 10 minutes, without spending an attempt; after
/// 6 snoozes (an hour) the report goes to the dead letters with reason `snoozed-too-often`.
#[subscriber(RedisList::new("{reports}").reliable().max_snoozes(6))]
async fn report(job: &Report, ctx: &mut Context<'_>) -> HandlerOutcome {
    if !job.ready {
        tracing::info!(day = %job.day, snoozes = ctx.snoozes(), "data not ready");
        return HandlerOutcome::snooze(Duration::from_secs(600));
    }
    HandlerOutcome::ack()
}

fn app() -> impl App {
    RustStream::new(AppInfo::new("reports", "0.1.0")).with_broker(RedisBroker::from_env(), |b| {
        b.include(render);
        b.include(report);
    })
}
// ANCHOR_END: service

// ANCHOR: test
#[tokio::test(start_paused = true)]
async fn a_hung_render_times_out_and_a_report_snoozes() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let b = tb.broker::<RedisBroker>();
    b.message(&Render {
        page: "huge".into(),
    })
    .to("{renders}")
    .publish()
    .await?;
    b.message(&Report {
        day: "2026-12-01".into(),
        ready: false,
    })
    .to("{reports}")
    .publish()
    .await?;
    // Three attempts of 30 s with the default backoff between them; six snoozes of 10 minutes.
    tb.advance(Duration::from_secs(2 * 3600)).await?;
    let renders = tb.broker::<RedisBroker>().subscriber("{renders}");
    renders.assert_called(3).settled(Settlement::Dead {
        reason: "timeout".into(),
    });
    let reports = tb.broker::<RedisBroker>().subscriber("{reports}");
    let attempts: Vec<u32> = reports.calls().iter().map(|c| c.attempt).collect();
    assert_eq!(attempts, [1; 7], "a snooze spends no attempt");
    reports.settled(Settlement::Dead {
        reason: "snoozed-too-often".into(),
    });
    tb.shutdown().await
}
// ANCHOR_END: test
