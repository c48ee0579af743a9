//! The README's demo: publishes a few thumbnail jobs to a reliable list on `REDIS_URL`, handles
//! them, prints each one, and stops by itself.
//!
//! `scripts/demo` runs it (`cargo run --profile demo -p ruststream-demo`), against a throwaway
//! Redis when `REDIS_URL` is not set.

use std::future::{Future, ready};
use std::process::ExitCode;
use std::time::Duration;

use ruststream::prelude::*;
use tokio::sync::mpsc;

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
struct ThumbnailJob {
    image: String,
}

outgoing!(ThumbnailJob);

/// Renders a thumbnail (here: reports it).
struct Render(mpsc::UnboundedSender<String>);

impl Handle<ThumbnailJob> for Render {
    fn handle(
        &self,
        job: &ThumbnailJob,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        println!(
            "rendered {} (message {}, attempt {})",
            job.image,
            ctx.message_id(),
            ctx.attempt()
        );
        let _ = self.0.send(job.image.clone());
        ready(Ok(()))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match demo().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    const JOBS: usize = 5;
    let key = format!("{{demo}}.thumbnails.{}", std::process::id());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let broker = RedisBroker::from_env();
    let app = RustStream::new(AppInfo::new("demo", "0.1.0")).with_broker(broker.clone(), |b| {
        b.include(subscriber(RedisList::new(key.clone()).reliable(), Render(tx)).build());
    });
    let running = app.start().await?;

    let jobs: Vec<ThumbnailJob> = (1..=JOBS)
        .map(|i| ThumbnailJob {
            image: format!("photo-{i}.png"),
        })
        .collect();
    broker
        .publisher()
        .messages(&jobs)
        .to(key.as_str())
        .publish()
        .await?;
    println!("published {JOBS} jobs to {key}");

    let handled = tokio::time::timeout(Duration::from_secs(10), async {
        let mut n = 0;
        while n < JOBS && rx.recv().await.is_some() {
            n += 1;
        }
        n
    })
    .await;
    running.shutdown().await?;
    match handled {
        Ok(n) if n == JOBS => {
            println!("all {JOBS} jobs handled and acknowledged");
            Ok(())
        }
        _ => Err("not every job was handled within 10 s".into()),
    }
}
