//! The framework side of a scenario, run in a child process of the same binary so that its peak
//! RSS (`VmHWM`) is the consumer's (or the publisher's) alone.
//!
//! The child prints `READY` once its app has started, then one `STATS k=v ...` line at the end.

use std::future::Future;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures::{StreamExt, TryStreamExt};
use ruststream::{
    App, AppInfo, BatchContext, BatchOutcome, Context, Handle, HandleBatch, HandlerOutcome,
    Publisher, RedisBroker, RedisChannel, RedisList, RedisStream, RustStream, Subscriber,
    subscriber,
};

use crate::common::{
    Config, CpuWindow, Msg, Scenario, Target, Tuning, env_usize, now_ns, per_s, procfs,
    usage_fields,
};
use crate::tracker::{LatencyFrom, Tracker, quantile};
use crate::{BoxError, GROUP, KEY};

/// How long the pubsub consumer waits for another message before it ends the run.
pub const PUBSUB_QUIET: Duration = Duration::from_secs(2);

/// Reads the pubsub subscription's `ruststream_pubsub_lagged_total` and
/// `ruststream_pubsub_disconnects_total` counters back: a metrics recorder that keeps those two
/// and discards the rest.
mod lag {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    struct LagOnly(Arc<AtomicU64>, Arc<AtomicU64>);

    impl Recorder for LagOnly {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            match key.name() {
                "ruststream_pubsub_lagged_total" => Counter::from_arc(self.0.clone()),
                "ruststream_pubsub_disconnects_total" => Counter::from_arc(self.1.clone()),
                _ => Counter::noop(),
            }
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    /// Installs the recorder (once per process); the counters it fills: lagged, disconnects.
    pub fn install() -> Option<(Arc<AtomicU64>, Arc<AtomicU64>)> {
        let (lagged, disconnects) = (Arc::default(), Arc::default());
        metrics::set_global_recorder(LagOnly(Arc::clone(&lagged), Arc::clone(&disconnects)))
            .ok()
            .map(|()| (lagged, disconnects))
    }
}

/// What the parent tells a child.
#[derive(Debug, Clone)]
pub struct Args {
    pub scenario: Scenario,
    pub config: Config,
    pub n: u64,
    pub target: Target,
    pub prefix: String,
    pub redis_pid: Option<u32>,
    /// Every message is due at this wall-clock time (ns): the delayed burst.
    pub due_ns: Option<u64>,
    /// Latency is measured from the stamp in each body.
    pub stamped: bool,
}

/// The handler: records the id, nothing else.
struct Record(Arc<Tracker>);

impl Handle<Msg> for Record {
    fn handle(
        &self,
        msg: &Msg,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> + Send {
        self.0.record(msg);
        std::future::ready(Ok(()))
    }
}

/// The `steps` scenario's handler: three durable steps (each records a number), then records the
/// id.
struct RecordSteps(Arc<Tracker>);

impl Handle<Msg> for RecordSteps {
    async fn handle(
        &self,
        msg: &Msg,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        for (i, name) in ["charge", "reserve", "email"].into_iter().enumerate() {
            ctx.step(name, || async move { Ok::<_, std::convert::Infallible>(i) })
                .await?;
        }
        self.0.record(msg);
        Ok(())
    }
}

/// The batch handler: records every id of the batch, nothing else.
struct RecordBatch(Arc<Tracker>);

impl HandleBatch<Msg> for RecordBatch {
    fn handle_batch(
        &self,
        msgs: &[Msg],
        _ctx: &mut BatchContext<'_>,
    ) -> impl Future<Output = BatchOutcome> + Send {
        for msg in msgs {
            self.0.record(msg);
        }
        std::future::ready(BatchOutcome::ack())
    }
}

/// Messages a batch of the batch scenario.
pub const BATCH: usize = 100;

/// How long the batch scenario's partial batch waits: short, as only the last one is partial.
const BATCH_WAIT: Duration = Duration::from_millis(5);

/// The `cap` scenario's `max_in_flight`: far above the `2 × concurrency` one consumer holds.
const CAP: u32 = 100_000;

/// The `deadline` scenario's timeout: far longer than any handler call of the benchmark.
const DEADLINE: Duration = Duration::from_secs(60);

/// The broker on the target, as a scenario's configuration sets it. `RSB_NO_HISTORY=1` turns
/// the subscriptions' history off (`keep_history(false)`), to measure what it costs.
pub fn broker(target: &Target, prefix: &str, tuning: &Tuning) -> RedisBroker {
    let broker = if target.cluster.is_empty() {
        RedisBroker::standalone(&target.redis)
    } else {
        RedisBroker::cluster(target.cluster.clone())
    }
    .prefix(prefix)
    .keep_history(env_usize("RSB_NO_HISTORY") != Some(1));
    match tuning.pool_size {
        Some(n) => broker.pool_size(n),
        None => broker,
    }
}

/// The subscription of a consuming scenario.
fn subscription(
    scenario: Scenario,
    tuning: &Tuning,
    target: &Target,
    handler: Record,
) -> Subscriber<RedisBroker> {
    let key = target.key();
    let list = |l: RedisList| {
        let l = match target.partitions {
            Some(n) => l.partitions(n),
            None => l,
        };
        match tuning.concurrency {
            Some(c) => l.concurrency(c),
            None => l,
        }
    };
    match scenario {
        Scenario::Simple => subscriber(list(RedisList::new(key)), handler).build::<Msg>(),
        Scenario::Recovery => subscriber(
            list(
                RedisList::new(KEY)
                    .reliable()
                    .recovery_zset(format!("{KEY}.claims"))
                    .min_idle(Duration::from_secs(60)),
            ),
            handler,
        )
        .build::<Msg>(),
        Scenario::Pubsub => {
            let mut c = RedisChannel::new(KEY);
            if let Some(n) = tuning.concurrency {
                c = c.concurrency(n);
            }
            if let Some(b) = tuning.buffer {
                c = c.buffer(b);
            }
            subscriber(c, handler).build::<Msg>()
        }
        Scenario::Stream => {
            let s = RedisStream::new(key).group(GROUP);
            let s = match target.partitions {
                Some(n) => s.partitions(n),
                None => s,
            };
            let s = match tuning.concurrency {
                Some(c) => s.concurrency(c),
                None => s,
            };
            let s = match crate::common::env_usize("RSB_STREAM_READERS") {
                Some(n) => s.readers(n),
                None => s,
            };
            subscriber(s, handler).build::<Msg>()
        }
        Scenario::RateLimit | Scenario::RateLimitKey => {
            subscriber(list(crate::rate_limit::source(scenario, key)), handler).build::<Msg>()
        }
        Scenario::Batch => {
            let source = list(RedisList::new(key).reliable().no_recovery());
            subscriber(source, RecordBatch(handler.0))
                .batch(BATCH)
                .max_wait(BATCH_WAIT)
                .build::<Msg>()
        }
        Scenario::Priorities => {
            subscriber(list(crate::priorities::source(key)), handler).build::<Msg>()
        }
        // Far above what one consumer holds: the gate's count on every claim, never a wait.
        Scenario::Cap => subscriber(
            list(
                RedisList::new(key)
                    .reliable()
                    .no_recovery()
                    .max_in_flight(CAP),
            ),
            handler,
        )
        .build::<Msg>(),
        // A timer per handler call that never fires.
        Scenario::Deadline => subscriber(
            list(
                RedisList::new(key)
                    .reliable()
                    .no_recovery()
                    .timeout(DEADLINE),
            ),
            handler,
        )
        .build::<Msg>(),
        Scenario::Steps => subscriber(
            list(RedisList::new(key).reliable().no_recovery()),
            RecordSteps(handler.0),
        )
        .build::<Msg>(),
        // A reliable list without crash recovery (recovery is the `recovery` scenario).
        _ => subscriber(list(RedisList::new(key).reliable().no_recovery()), handler).build::<Msg>(),
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn hwm_kb() -> u64 {
    procfs::status_kb("self", "VmHWM").unwrap_or(0)
}

/// `p50_us=.. p99_us=.. p999_us=.. max_us=..` of sorted µs values.
fn quantiles(sorted: &[u32]) -> String {
    let q = |x| quantile(sorted, x).map_or_else(|| "-".to_owned(), |v| v.to_string());
    format!(
        "p50_us={} p99_us={} p999_us={} max_us={}",
        q(0.5),
        q(0.99),
        q(0.999),
        q(1.0)
    )
}

/// Runs the consumer side: starts an app with one subscription, waits until `n` distinct ids were
/// handled, shuts down.
pub async fn consume(a: &Args) -> Result<(), BoxError> {
    let base_kb = hwm_kb();
    let from = match (a.due_ns, a.stamped) {
        (Some(due), _) => LatencyFrom::Fixed(due),
        (None, true) => LatencyFrom::Stamp,
        (None, false) => LatencyFrom::None,
    };
    let pubsub = a.scenario == Scenario::Pubsub;
    let lagged = if pubsub { lag::install() } else { None };
    let tracker = Tracker::new(a.n, from);
    let tracker = Arc::new(if pubsub { tracker.with_span() } else { tracker });
    let tuning = Tuning::of(a.scenario, a.config);
    let subs: Vec<_> = (0..tuning.readers)
        .map(|_| subscription(a.scenario, &tuning, &a.target, Record(tracker.clone())))
        .collect();
    let app = RustStream::new(AppInfo::new("ruststream-bench", env!("CARGO_PKG_VERSION")))
        .shutdown_timeout(Duration::from_secs(10))
        .with_broker(broker(&a.target, &a.prefix, &tuning), |b| {
            for sub in subs {
                b.include(sub);
            }
        });
    let running = app.start().await?;
    let started = Instant::now();
    say("READY");
    // The delayed burst: the clock starts when the entries fall due.
    let t0 = match a.due_ns {
        Some(due) => {
            let t = started + Duration::from_nanos(due.saturating_sub(now_ns()));
            tokio::time::sleep_until(t.into()).await;
            t
        }
        None => started,
    };
    let cpu = CpuWindow::start(a.redis_pid);
    let limit = Duration::from_secs(60 + a.n / 1000);
    let elapsed = if pubsub {
        // At most once: ids lost stay lost, so the run ends when messages stop coming. The rate
        // is over the time from the first message handled to the last.
        tracker
            .wait_quiet(Duration::from_secs(10), PUBSUB_QUIET, limit)
            .await;
        tracker.span()
    } else {
        let done = tracker.wait(limit).await;
        done.map(|d| d.saturating_duration_since(t0))
    };
    let (client_cpu, redis_cpu) = cpu.stop();
    let rated = if pubsub { tracker.distinct() } else { a.n };
    let t_stop = Instant::now();
    running.shutdown().await?;
    let shutdown_ms = t_stop.elapsed().as_millis();
    let lat = tracker.latencies();
    let lagged = lagged.map_or_else(String::new, |(l, d)| {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        format!(" lagged={} disconnects={}", get(&l), get(&d))
    });
    say(&format!(
        "STATS distinct={} dups={} strays={} elapsed_s={} rate={} {} {} hwm_kb={} base_kb={base_kb} shutdown_ms={shutdown_ms} {}{lagged}",
        tracker.distinct(),
        tracker.dups(),
        tracker.strays(),
        elapsed.map_or_else(|| "-".to_owned(), |e| format!("{:.4}", e.as_secs_f64())),
        elapsed.map_or_else(|| "-".to_owned(), |e| format!("{:.0}", per_s(rated, e))),
        usage_fields("client", Some(client_cpu)),
        usage_fields("redis", redis_cpu),
        hwm_kb(),
        quantiles(&lat),
    ));
    Ok(())
}

/// Publishes `0..n` to `key` in chunks of `tuning.chunk` (`messages(&chunk)`), `tuning.in_flight`
/// calls at once; returns the elapsed time and each call's latency in µs.
pub async fn publish_batches(
    publisher: &Publisher,
    key: &str,
    n: u64,
    tuning: &Tuning,
    due: Option<SystemTime>,
) -> Result<(Duration, Vec<u32>), BoxError> {
    let chunk = tuning.chunk as u64;
    let t0 = Instant::now();
    let lat: Vec<u32> = futures::stream::iter((0..n).step_by(tuning.chunk))
        .map(|first| async move {
            let msgs: Vec<Msg> = (first..(first + chunk).min(n))
                .map(|i| Msg::new(i, 0))
                .collect();
            let t = Instant::now();
            let p = publisher.messages(&msgs).to(key);
            let p = match due {
                Some(at) => p.at(at),
                None => p,
            };
            p.publish().await?;
            Ok::<u32, BoxError>(micros(t.elapsed()))
        })
        .buffer_unordered(tuning.in_flight)
        .try_collect()
        .await?;
    Ok((t0.elapsed(), lat))
}

/// 64 tasks, each publishing one message per call (`message(&m)`), until `n` are published.
async fn publish_singles(publisher: &Publisher, n: u64) -> Result<(Duration, Vec<u32>), BoxError> {
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (publisher, next) = (publisher.clone(), next.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let m = Msg::new(i, 0);
                    let t = Instant::now();
                    publisher.message(&m).to(KEY).publish().await?;
                    lat.push(micros(t.elapsed()));
                }
                Ok::<Vec<u32>, BoxError>(lat)
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    Ok((t0.elapsed(), lat))
}

/// Runs the publisher side of the publish scenarios.
pub async fn publish(a: &Args) -> Result<(), BoxError> {
    let base_kb = hwm_kb();
    let tuning = Tuning::of(a.scenario, a.config);
    let broker = broker(&a.target, &a.prefix, &tuning);
    broker.connect().await?;
    let publisher = broker.publisher();
    say("READY");
    let cpu = CpuWindow::start(a.redis_pid);
    let (elapsed, mut lat) = if a.scenario == Scenario::PublishSingle {
        publish_singles(&publisher, a.n).await?
    } else {
        publish_batches(&publisher, KEY, a.n, &tuning, None).await?
    };
    let (client_cpu, redis_cpu) = cpu.stop();
    ruststream_core::Broker::close(&broker).await;
    lat.sort_unstable();
    say(&format!(
        "STATS distinct={} dups=0 strays=0 elapsed_s={:.4} rate={:.0} {} {} hwm_kb={} base_kb={base_kb} shutdown_ms=0 {}",
        a.n,
        elapsed.as_secs_f64(),
        per_s(a.n, elapsed),
        usage_fields("client", Some(client_cpu)),
        usage_fields("redis", redis_cpu),
        hwm_kb(),
        quantiles(&lat),
    ));
    Ok(())
}
