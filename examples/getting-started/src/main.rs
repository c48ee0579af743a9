//! The guide's first service ("Getting started"): a reliable work queue of thumbnail jobs, and
//! its test on TestApp. `scripts/fresh-project` builds it as a new project would: `cargo new`,
//! the README's dependency lines, this file as `src/main.rs`, then `cargo test`.

// ANCHOR: service
use std::time::Duration;

use ruststream::prelude::*;

#[derive(Debug, PartialEq, Deserialize, Serialize, Outgoing)]
struct ThumbnailJob {
    image: String,
}

/// How long a crashed worker's jobs wait before another worker takes them.
const MIN_IDLE: Duration = Duration::from_secs(60);

#[subscriber(RedisList::new("{thumbnails}").reliable().min_idle(MIN_IDLE))]
async fn render(job: &ThumbnailJob) -> HandlerOutcome {
    tracing::info!(job.image, "thumbnail rendered");
    HandlerOutcome::ack()
}

#[ruststream::app]
fn app() -> impl App {
    RustStream::new(AppInfo::new("images", "0.1.0"))
        .with_broker(RedisBroker::from_env(), |b| {
            b.include(render);
        })
}
// ANCHOR_END: service

// ANCHOR: test
#[cfg(test)]
mod tests {
    use super::*;
    use ruststream::testing::TestApp;

    #[tokio::test(start_paused = true)]
    async fn a_rendered_job_does_not_come_back() -> ruststream::Result<()> {
        let tb = TestApp::start(app()).await?;
        let job = ThumbnailJob {
            image: "a.png".into(),
        };
        tb.broker::<RedisBroker>()
            .message(&job)
            .to("{thumbnails}")
            .publish()
            .await?;
        // Past `min_idle`: had the job stayed claimed, recovery would hand it out again.
        tb.advance(MIN_IDLE * 2).await?;
        tb.broker::<RedisBroker>()
            .subscriber("{thumbnails}")
            .assert_called_once()
            .with(&job)
            .settled(HandlerOutcome::ack());
        tb.shutdown().await
    }
}
// ANCHOR_END: test
