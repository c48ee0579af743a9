//! The `fair` scenario: fair groups (`RedisList::groups`) against a plain queue under one
//! tenant's backlog. One tenant's `n` messages are queued first (no reader running), then a
//! reader starts (concurrency 64) and 100 other tenants publish one message each, 1 ms apart,
//! while the backlog drains. Each small message's wait is the time from its publish to its
//! handler's start (both clocks of this process); the scenario prints its p50 and p99, and how
//! long the whole queue took to drain, once on a grouped queue and once on a plain reliable
//! queue (`RESULT scenario=fair queue=groups|plain ..`). The handler does nothing else.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::redis::list;
use serde::{Deserialize, Serialize};

use crate::BoxError;

/// Small tenants, one message each.
const SMALL: u32 = 100;
/// The big tenant's id.
const BIG: u32 = 0;
/// Publishes of one backlog call.
const CHUNK: u64 = 1000;
/// The reader's concurrency.
const CONCURRENCY: usize = 64;

/// The scenario's message: its tenant and, for a small one, its publish time.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FairJob {
    tenant: u32,
    sent_us: u64,
}

ruststream::outgoing!(FairJob);

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Records each small message's wait and counts every message.
#[derive(Clone, Default)]
struct Waits {
    handled: Arc<AtomicU64>,
    small: Arc<std::sync::Mutex<Vec<u64>>>,
}

impl Handle<FairJob> for Waits {
    fn handle(
        &self,
        job: &FairJob,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> + Send {
        if job.tenant != BIG {
            let wait = now_us().saturating_sub(job.sent_us);
            if let Ok(mut s) = self.small.lock() {
                s.push(wait);
            }
        }
        self.handled.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Ok(()))
    }
}

/// Runs the scenario with a backlog of `n`, grouped then plain, on `redis`.
pub async fn run(redis: &str, n: u64) -> Result<(), BoxError> {
    for grouped in [true, false] {
        one(redis, n, grouped).await?;
    }
    Ok(())
}

async fn one(redis: &str, n: u64, grouped: bool) -> Result<(), BoxError> {
    let prefix = format!("bench-fair-{}-{}:", std::process::id(), u8::from(grouped));
    let key = "{fair}";
    let route = if grouped {
        list::Publish::new().groups()
    } else {
        list::Publish::new()
    };
    let producer = RedisBroker::standalone(redis)
        .prefix(&prefix)
        .route(key, route);
    producer.connect().await?;
    let publisher = producer.publisher();
    for first in (0..n).step_by(usize::try_from(CHUNK)?) {
        let jobs: Vec<FairJob> = (first..(first + CHUNK).min(n))
            .map(|_| FairJob {
                tenant: BIG,
                sent_us: 0,
            })
            .collect();
        publisher
            .messages(&jobs)
            .to(key)
            .group(BIG.to_string())
            .publish()
            .await?;
    }
    let mut source = RedisList::new(key)
        .reliable()
        .no_recovery()
        .concurrency(CONCURRENCY);
    if grouped {
        source = source.groups();
    }
    let waits = Waits::default();
    let handler = waits.clone();
    let app = RustStream::new(AppInfo::new("bench-fair", "0.0.0")).with_broker(
        RedisBroker::standalone(redis).prefix(&prefix),
        move |b| {
            b.include(subscriber(source, handler).build());
        },
    );
    let started = Instant::now();
    let running = App::start(app).await?;
    for tenant in 1..=SMALL {
        let job = FairJob {
            tenant,
            sent_us: now_us(),
        };
        publisher
            .message(&job)
            .to(key)
            .group(tenant.to_string())
            .publish()
            .await?;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let total = n + u64::from(SMALL);
    let limit = Instant::now() + Duration::from_secs(600);
    while waits.handled.load(Ordering::Relaxed) < total && Instant::now() < limit {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drained = started.elapsed();
    running.shutdown().await?;
    let mut small = waits.small.lock().map_err(|_| "poisoned")?.clone();
    small.sort_unstable();
    if small.is_empty() {
        return Err("no small tenant's message was handled".into());
    }
    let q = |f: f64| {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((small.len() as f64 * f) as usize).min(small.len() - 1);
        #[allow(clippy::cast_precision_loss)]
        let ms = small[i] as f64 / 1000.0;
        ms
    };
    println!(
        "RESULT scenario=fair queue={} backlog={n} small={} handled={} small_wait_p50_ms={:.1} small_wait_p99_ms={:.1} small_wait_max_ms={:.1} drain_s={:.2}",
        if grouped { "groups" } else { "plain" },
        small.len(),
        waits.handled.load(Ordering::Relaxed),
        q(0.5),
        q(0.99),
        q(1.0),
        drained.as_secs_f64()
    );
    // Drained lists are gone; what a cut-short run left is deleted.
    let raw = Builder::from_config(Config::from_url(redis)?).build()?;
    raw.init().await?;
    let left = [key, "{fair}.processing", "{fair}.groups", "{fair}.groups:0"];
    let _: i64 = raw
        .del(
            left.iter()
                .map(|k| format!("{prefix}{k}"))
                .collect::<Vec<_>>(),
        )
        .await?;
    let _ = raw.quit().await;
    Ok(())
}
