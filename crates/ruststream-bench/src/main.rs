//! `ruststream-bench`: throughput and latency of RustStream on Redis, each scenario next to a raw
//! `fred` baseline that sends the same commands pipelined, in the same process run.
//!
//! ```text
//! cargo run --release -p ruststream-bench -- [--scenario NAME|all] [--n N] [--redis URL]
//! cargo run --release -p ruststream-bench -- --scenario durable --redis <primary with a replica>
//! ```
//!
//! Every scenario fills N messages (`{id, body}` JSON, a 100-character body) with RustStream's
//! publisher, consumes them in a child process of this binary (so the child's peak RSS is the
//! consumer's alone) with a handler that records the id, checks every id was handled (exactly
//! once, or at least once with duplicates counted) and that nothing is left in Redis, then runs
//! the raw baseline. It prints one `RESULT` line per scenario and configuration. The pubsub
//! scenario stores nothing, so its child subscribes first and this process publishes while it
//! consumes; Pub/Sub is at most once, and `lost` says how many ids the handler never saw. How to
//! read the lines, and a run's figures: `docs/benchmarks.md`.

mod child;
mod cluster;
mod common;
mod delayed;
mod durable;
mod fair;
mod inspect;
mod latency;
mod line;
mod priorities;
mod pubsub;
mod rate_limit;
mod raw;
mod running;
mod tracker;

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use fred::prelude::*;
use ruststream::redis::list;
use ruststream::stream;

use crate::cluster::Nodes;
use crate::common::{Config, Scenario, Target, Tuning, now_ns, per_s, procfs};
use crate::inspect::{calls_per_msg, cleanup, command_calls, leftovers, read_back};
use crate::line::{Line, cpu_fields, take_consumer};
use crate::running::{Running, Spec};

/// Errors of the benchmark itself.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The consumer group of the stream scenario.
pub const GROUP: &str = "bench";

/// The queue every scenario uses, under its own key prefix.
pub const KEY: &str = "q";

#[derive(Parser, Debug)]
#[command(
    name = "ruststream-bench",
    about = "Throughput and latency of RustStream on Redis, next to a raw fred baseline"
)]
struct Cli {
    /// all, publish (both forms), publish-batch, publish-single, simple, reliable, recovery,
    /// batch, stream, delayed, pubsub, latency, rate-limit, rate-limit-key, priorities, cap, deadline,
    /// steps, durable, fair.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Messages per scenario.
    #[arg(long, default_value_t = 100_000)]
    n: u64,
    /// The Redis server (it is flushed of nothing: every run uses keys under its own prefix).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// Run on the Redis Cluster of these node URLs (comma-separated) instead of `--redis`:
    /// scenarios simple, reliable and stream, no raw baseline, CPU per node (`NODE` lines).
    #[arg(long, value_delimiter = ',')]
    cluster: Vec<String>,
    /// Spread the queue over N partitions (`.partitions(N)`): scenarios simple, reliable, stream.
    #[arg(long)]
    partitions: Option<u16>,
    /// Run one configuration only (default: both).
    #[arg(long, value_enum)]
    config: Option<Config>,
    /// Messages per second of the latency scenario.
    #[arg(long, default_value_t = 10_000)]
    rate: u64,
    /// Skip the raw baselines.
    #[arg(long)]
    no_baseline: bool,
    /// Internal: run the framework side of one scenario in this (child) process.
    #[arg(long, value_enum, hide = true)]
    role: Option<Role>,
    #[arg(long, hide = true, default_value = "")]
    prefix: String,
    #[arg(long, hide = true)]
    redis_pid: Option<u32>,
    #[arg(long, hide = true)]
    due_ns: Option<u64>,
    #[arg(long, hide = true)]
    stamped: bool,
}

impl Cli {
    fn target(&self) -> Target {
        Target {
            redis: self.redis.clone(),
            cluster: self.cluster.clone(),
            partitions: self.partitions,
        }
    }

    /// Refuses options the selected scenarios cannot use.
    fn validate(&self, scenarios: &[Scenario]) -> Result<(), BoxError> {
        let queue =
            |s: &Scenario| matches!(s, Scenario::Simple | Scenario::Reliable | Scenario::Stream);
        if (self.partitions.is_some() || !self.cluster.is_empty()) && !scenarios.iter().all(queue) {
            return Err(
                "--cluster and --partitions apply to the simple, reliable and stream \
                 scenarios only: pass --scenario simple, reliable or stream"
                    .into(),
            );
        }
        if self.partitions == Some(0) {
            return Err("--partitions must be at least 1 (leave it out for one queue)".into());
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Role {
    Consumer,
    Publisher,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Thread names tell the processes apart in a profile (`perf report --comm rsb-consumer`).
    let threads = match cli.role {
        Some(Role::Consumer) => "rsb-consumer",
        Some(Role::Publisher) => "rsb-publisher",
        None => "rsb-parent",
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(threads)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.role {
        // On a worker thread, so every sample of the child carries its thread name.
        Some(role) => match child_args(&cli) {
            Ok(args) => runtime
                .block_on(runtime.spawn(run_child(args, role)))
                .unwrap_or_else(|e| Err(e.into())),
            Err(e) => Err(e),
        },
        None => runtime.block_on(run_parent(&cli)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn child_args(cli: &Cli) -> Result<child::Args, BoxError> {
    Ok(child::Args {
        scenario: cli.scenario.parse()?,
        config: cli.config.ok_or("a child needs --config")?,
        n: cli.n,
        target: cli.target(),
        prefix: cli.prefix.clone(),
        redis_pid: cli.redis_pid,
        due_ns: cli.due_ns,
        stamped: cli.stamped,
    })
}

async fn run_child(args: child::Args, role: Role) -> Result<(), BoxError> {
    match role {
        Role::Consumer => child::consume(&args).await,
        Role::Publisher => child::publish(&args).await,
    }
}

/// What every scenario shares.
struct Ctx<'a> {
    cli: &'a Cli,
    target: Target,
    /// A client on `--redis`, or on the cluster's first node.
    raw: Client,
    /// The cluster's nodes (`--cluster`).
    nodes: Option<Nodes>,
    redis_pid: Option<u32>,
    run: String,
}

async fn run_parent(cli: &Cli) -> Result<(), BoxError> {
    // Publishing alone, on a primary with a replica: not one of the fill-and-drain scenarios.
    if cli.scenario == "durable" {
        return durable::run(&cli.redis, usize::try_from(cli.n)?).await;
    }
    // One tenant's backlog against 100 small tenants, grouped and plain: not a throughput run.
    if cli.scenario == "fair" {
        return fair::run(&cli.redis, cli.n).await;
    }
    let scenarios = Scenario::select(&cli.scenario)
        .ok_or_else(|| format!("unknown scenario `{}`", cli.scenario))?;
    cli.validate(&scenarios)?;
    let configs = match cli.config {
        Some(c) => vec![c],
        None => vec![Config::Default, Config::Tuned],
    };
    let nodes = if cli.cluster.is_empty() {
        None
    } else {
        Some(Nodes::discover(&cli.cluster).await?)
    };
    let server = cli.cluster.first().unwrap_or(&cli.redis);
    let raw = raw::client(server).await?;
    let info: String = raw.info(Some(fred::types::InfoKind::Server)).await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    };
    // Redis's CPU is read from /proc when the server runs on this machine.
    let redis_pid = field("process_id")
        .and_then(|p| p.parse().ok())
        .filter(|p| nodes.is_none() && procfs::is_redis(*p));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# ruststream-bench n={} redis={} partitions={} redis_version={} redis_cpu_readable={} cpus={} loadavg={}",
        cli.n,
        nodes.as_ref().map_or_else(
            || cli.redis.clone(),
            |n| format!("cluster({} primaries)", n.primaries().count())
        ),
        cli.partitions
            .map_or_else(|| "-".to_owned(), |p| p.to_string()),
        field("redis_version").unwrap_or_default(),
        redis_pid.is_some(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(","),
    );
    let ctx = Ctx {
        cli,
        target: cli.target(),
        raw,
        nodes,
        redis_pid,
        run: format!("rsbench:{}-{}:", std::process::id(), now_ns() / 1_000_000),
    };
    let mut failed = false;
    for s in scenarios {
        for &c in &configs {
            let prefix = format!("{}{}.{}:", ctx.run, s, c.name());
            let mut line = Line::new(s, c, cli.n, Tuning::of(s, c).describe(s));
            if let Err(e) = scenario(&ctx, s, c, &prefix, &mut line).await {
                failed = true;
                line.extra("error", format!("{e:?}").replace(' ', "_"));
            }
            if let Err(e) = cleanup(&ctx, &prefix).await {
                eprintln!("warning: cleanup of {prefix}*: {e}");
            }
            println!("{}", line.render());
        }
    }
    if failed {
        Err("some scenarios failed (see `error=` above)".into())
    } else {
        Ok(())
    }
}

async fn scenario(
    ctx: &Ctx<'_>,
    s: Scenario,
    c: Config,
    prefix: &str,
    line: &mut Line,
) -> Result<(), BoxError> {
    let n = ctx.cli.n;
    let tuning = Tuning::of(s, c);
    let raw_prefix = format!("{prefix}raw:");
    let raw_key = format!("{raw_prefix}{KEY}");
    let baseline = !ctx.cli.no_baseline;
    match s {
        Scenario::Pubsub => pubsub::run(ctx, c, &tuning, prefix, &raw_key, line).await?,
        Scenario::PublishBatch | Scenario::PublishSingle => {
            let before = command_calls(&ctx.raw).await?;
            let st = Running::spawn(ctx, Spec::new(Role::Publisher, s, c, n, prefix))
                .await?
                .stats()
                .await?;
            let after = command_calls(&ctx.raw).await?;
            line.extra("calls_per_msg", calls_per_msg(&before, &after, n));
            line.publish_per_s = st.f("rate");
            line.p50_ms = st.ms("p50_us");
            line.p99_ms = st.ms("p99_us");
            line.rss_mb = st.mb("hwm_kb");
            line.extra(
                "base_rss_mb",
                format!("{:.1}", st.mb("base_kb").unwrap_or(0.0)),
            );
            cpu_fields(line, &st);
            let (lost, dup) = read_back(&ctx.raw, &format!("{prefix}{KEY}"), n).await?;
            line.lost = Some(lost);
            line.dup = Some(dup);
            line.extra("left", leftovers(&ctx.raw, prefix).await?);
            if baseline {
                let out = if s == Scenario::PublishBatch {
                    raw::publish_batch(&ctx.raw, &raw_key, n).await?
                } else {
                    raw::publish_single(&ctx.raw, &raw_key, n).await?
                };
                line.baseline_per_s = Some(out.per_s);
            }
        }
        Scenario::Simple
        | Scenario::Reliable
        | Scenario::Priorities
        | Scenario::Cap
        | Scenario::Deadline
        | Scenario::Steps
        | Scenario::Recovery
        | Scenario::Batch
        | Scenario::Stream
        | Scenario::RateLimit
        | Scenario::RateLimitKey => {
            queue(ctx, s, c, prefix, line).await?;
        }
        Scenario::Delayed => delayed::run(ctx, c, &tuning, prefix, &raw_key, line).await?,
        Scenario::Latency => latency::run(ctx, c, prefix, &raw_key, line).await?,
    }
    Ok(())
}

/// The queue scenarios (simple, reliable, recovery, batch, stream, priorities): fill the queue,
/// then one consumer child drains it; on a cluster, each node's CPU in both phases (`NODE`
/// lines).
async fn queue(
    ctx: &Ctx<'_>,
    s: Scenario,
    c: Config,
    prefix: &str,
    line: &mut Line,
) -> Result<(), BoxError> {
    let n = ctx.cli.n;
    let tuning = Tuning::of(s, c);
    let key = ctx.target.key();
    let mut broker = child::broker(&ctx.target, prefix, &tuning);
    // A producer-only process names a stream destination, and a partitioned queue's partitions.
    broker = match (s, ctx.target.partitions) {
        (Scenario::Stream, Some(p)) => broker.route(key, stream::Publish::new().partitions(p)),
        (Scenario::Stream, None) => broker.route(key, stream::Publish::new()),
        (Scenario::Priorities, _) => priorities::route(broker, key),
        (_, Some(p)) => broker.route(key, list::Publish::new().partitions(p)),
        (_, None) => broker,
    };
    if let Some(p) = ctx.target.partitions {
        line.extra("partitions", p);
    }
    broker.connect().await?;
    let s0 = sample(ctx).await?;
    let fill = if s == Scenario::Priorities {
        priorities::fill(&broker.publisher(), key, n, &tuning).await?
    } else {
        child::publish_batches(&broker.publisher(), key, n, &tuning, None)
            .await?
            .0
    };
    ruststream_core::Broker::close(&broker).await;
    line.publish_per_s = Some(per_s(n, fill));
    let s1 = sample(ctx).await?;
    let before = command_calls(&ctx.raw).await?;
    let spec = Spec::new(Role::Consumer, s, c, n, prefix);
    let st = Running::spawn(ctx, spec).await?.stats().await?;
    let after = command_calls(&ctx.raw).await?;
    let s2 = sample(ctx).await?;
    take_consumer(line, n, &st);
    let left = match (&ctx.nodes, &s0, &s1, &s2) {
        (Some(nodes), Some(s0), Some(s1), Some(s2)) => {
            per_node(ctx, nodes, line, [s0, s1, s2], prefix);
            line.extra("calls_per_msg", calls_per_msg(&s1.calls, &s2.calls, n));
            let mut left = Vec::new();
            for node in nodes.primaries() {
                left.push(leftovers(&node.client, prefix).await?);
            }
            left.join("+")
        }
        _ => {
            line.extra("calls_per_msg", calls_per_msg(&before, &after, n));
            leftovers(&ctx.raw, prefix).await?
        }
    };
    line.extra("left", left);
    if !ctx.cli.no_baseline && ctx.nodes.is_none() {
        let raw_key = format!("{prefix}raw:{KEY}");
        let b = tuning.batch();
        let out = match s {
            Scenario::Simple => raw::simple(&ctx.raw, &raw_key, n, b).await?,
            Scenario::Reliable
            | Scenario::Batch
            | Scenario::RateLimit
            | Scenario::RateLimitKey
            | Scenario::Cap
            | Scenario::Deadline
            | Scenario::Steps
            | Scenario::Priorities => raw::reliable(&ctx.raw, &raw_key, n, b, false).await?,
            Scenario::Recovery => raw::reliable(&ctx.raw, &raw_key, n, b, true).await?,
            _ => raw::stream(&ctx.raw, &raw_key, n, b).await?,
        };
        line.baseline_per_s = Some(out.per_s);
        line.extra("baseline_seen", out.seen);
    }
    Ok(())
}

/// Every cluster node's CPU (`None` on one server).
async fn sample(ctx: &Ctx<'_>) -> Result<Option<cluster::Sample>, BoxError> {
    match &ctx.nodes {
        Some(nodes) => Ok(Some(nodes.sample().await?)),
        None => Ok(None),
    }
}

/// A cluster run's figures per node: the `NODE` lines (fill and consume phases) and, on the
/// `RESULT` line, the consume phase's CPU µs per message over all primaries and the busiest one.
fn per_node(
    ctx: &Ctx<'_>,
    nodes: &Nodes,
    line: &mut Line,
    [s0, s1, s2]: [&cluster::Sample; 3],
    prefix: &str,
) {
    let n = ctx.cli.n;
    let keys: Vec<String> = ctx
        .target
        .queue_keys()
        .iter()
        .map(|k| format!("{prefix}{k}"))
        .collect();
    let holders = nodes.holders(&keys);
    let (all, max) = nodes.primary_us_per_msg(n, s1, s2);
    line.extra("primaries_us_per_msg", format!("{all:.2}"));
    line.extra("busiest_primary_us_per_msg", format!("{max:.2}"));
    let head = format!(
        "scenario={} config={} partitions={}",
        line.scenario,
        line.config.name(),
        ctx.target.partitions.unwrap_or(0)
    );
    line.after = nodes.lines(&head, n, &holders, &[("fill", s0, s1), ("consume", s1, s2)]);
}
