//! The guide's "Testing with TestApp": hours of retries in milliseconds, a crash and a restart,
//! what a handler published.

use std::future::{Future, ready};
use std::time::Duration;

use ruststream::Settlement;
use ruststream::prelude::*;
use ruststream::testing::TestApp;

// ANCHOR: service
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Outgoing)]
struct Resize {
    image: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Outgoing)]
struct Resized {
    image: String,
}

/// Fails the first two tries (a flaky image store), then replies.
struct FlakyResize;

impl Handle<Resize, Resized> for FlakyResize {
    fn handle(
        &self,
        job: &Resize,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<Resized, HandlerOutcome>> {
        ready(if ctx.attempt() <= 2 {
            Err(HandlerOutcome::retry())
        } else {
            Ok(Resized {
                image: format!("small-{}", job.image),
            })
        })
    }
}

fn app() -> impl App {
    RustStream::new(AppInfo::new("resizer", "0.1.0")).with_broker(RedisBroker::from_env(), |b| {
        let source = RedisList::new("{resize}")
            .reliable()
            .retry(Backoff::exponential(Duration::from_secs(60)).jitter(0.0));
        b.include(
            subscriber(source, FlakyResize)
                .reply()
                .to("{resized}")
                .build(),
        );
    })
}
// ANCHOR_END: service

// ANCHOR: test
#[tokio::test(start_paused = true)]
async fn retries_wait_then_the_reply_goes_out() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let b = tb.broker::<RedisBroker>();
    let job = Resize {
        image: "a.png".into(),
    };
    b.message(&job).to("{resize}").publish().await?;
    b.subscriber("{resize}")
        .assert_called_once()
        .settled(HandlerOutcome::retry());

    // The retries wait 60 s, then 120 s: three minutes pass in microseconds.
    tb.advance(Duration::from_secs(60)).await?;
    b.subscriber("{resize}").assert_called(2);
    tb.advance(Duration::from_secs(120)).await?;
    let calls = b.subscriber("{resize}");
    calls.assert_called(3);
    assert_eq!(calls.last().map(|c| c.attempt), Some(3));
    assert_eq!(
        calls.last().and_then(|c| c.settlement.clone()),
        Some(Settlement::Ack)
    );
    b.published::<Resized>("{resized}")
        .assert_called_once()
        .with(&Resized {
            image: "small-a.png".into(),
        });
    tb.shutdown().await
}
// ANCHOR_END: test
