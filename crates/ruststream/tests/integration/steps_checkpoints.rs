//! Checkpoints (`ctx.checkpoint`, `ctx.resume_from`): an import of ten pages records the next
//! page after each one, so a retry resumes at its last checkpoint and imports each page once.
//! On a reliable list and a stream group, on the model and on Redis. A stop that cuts the
//! handler off is in `steps_stop`.

use crate::harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Env, on};
use ruststream::Source;
use ruststream::prelude::*;

use super::steps::{Order, start};

on!(
    [memory, standalone, cluster] multi_thread:
    a_retry_resumes_at_the_last_checkpoint,
    a_retry_resumes_at_the_last_checkpoint_on_a_stream,
);

const PAGES: u32 = 10;

/// Imports pages from its last checkpoint to `PAGES`, recording the next page after each; on
/// its first run it fails at page `fail_at`.
#[derive(Clone, Default)]
struct Import {
    imported: Arc<Mutex<Vec<u32>>>,
    starts: Arc<Mutex<Vec<Option<u32>>>>,
    fail_at: Option<u32>,
}

impl Import {
    fn imported(&self) -> Vec<u32> {
        self.imported.lock().expect("lock").clone()
    }

    fn starts(&self) -> Vec<Option<u32>> {
        self.starts.lock().expect("lock").clone()
    }
}

impl Handle<Order> for Import {
    async fn handle(&self, _: &Order, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let from = ctx.resume_from::<u32>().await?;
        let first = {
            let mut starts = self.starts.lock().expect("lock");
            starts.push(from);
            starts.len() == 1
        };
        for page in from.unwrap_or(0)..PAGES {
            if first && self.fail_at == Some(page) {
                return Err(HandlerOutcome::retry());
            }
            self.imported.lock().expect("lock").push(page);
            ctx.checkpoint(&(page + 1)).await?;
        }
        Ok(())
    }
}

/// The import fails at page 4 on its first run: the retry resumes at 4; each page is imported
/// once; the ack removes the record.
async fn resumes(
    env: &Env,
    source: impl Source<Broker = RedisBroker>,
    producer: RedisBroker,
    key: &str,
    claimed: impl AsyncFn() -> i64,
) {
    let import = Import {
        fail_at: Some(4),
        ..Import::default()
    };
    let running = start(env, source, &producer, key, &import).await;
    env.eventually("imported", async || {
        import.imported().len() == PAGES as usize && claimed().await == 0
    })
    .await;
    env.stop(running).await;
    assert_eq!(import.imported(), (0..PAGES).collect::<Vec<_>>());
    assert_eq!(import.starts(), [None, Some(4)]);
    assert!(!env.exists(&format!("{key}.steps:order-1")).await);
}

async fn a_retry_resumes_at_the_last_checkpoint(env: &Env) {
    let list = RedisList::new("{ck}")
        .reliable()
        .retry(Backoff::fixed(Duration::from_millis(50)));
    resumes(env, list, env.broker(), "{ck}", async || {
        env.llen("{ck}.processing").await
    })
    .await;
}

async fn a_retry_resumes_at_the_last_checkpoint_on_a_stream(env: &Env) {
    let stream = RedisStream::new("{cks}")
        .group("g")
        .retry(Backoff::fixed(Duration::from_millis(50)));
    let producer = env.broker_with(|b| b.route("{cks}", ruststream::stream::Publish::new()));
    resumes(env, stream, producer, "{cks}", async || {
        env.pending("{cks}", "g").await
    })
    .await;
}
