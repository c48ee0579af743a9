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
mod durable;
mod fair;
mod priorities;
mod rate_limit;
mod raw;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use fred::prelude::*;
use ruststream::redis::frame::Frame;
use ruststream::redis::list;
use ruststream::stream;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use crate::cluster::Nodes;
use crate::common::{Config, Msg, Scenario, Target, Tuning, now_ns, per_s, procfs};

/// Errors of the benchmark itself.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The consumer group of the stream scenario.
pub const GROUP: &str = "bench";

/// The queue every scenario uses, under its own key prefix.
pub const KEY: &str = "q";

/// Rate of the delayed scenario's lateness run, messages per second.
const DELAYED_RATE: u64 = 5_000;
/// Most messages in the delayed scenario's lateness run.
const DELAYED_STEADY_N: u64 = 10_000;
/// How far ahead each message of the lateness run is due.
const DELAYED_AHEAD: Duration = Duration::from_millis(100);

#[derive(Parser, Debug)]
#[command(
    name = "ruststream-bench",
    about = "Throughput and latency of RustStream on Redis, next to a raw fred baseline"
)]
struct Cli {
    /// all, publish (both forms), publish-batch, publish-single, simple, reliable, recovery,
    /// batch, stream, delayed, pubsub, latency, rate-limit, rate-limit-key, priorities, cap, deadline,
    /// durable, fair.
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

/// One `RESULT` line.
struct Line {
    scenario: Scenario,
    config: Config,
    n: u64,
    publish_per_s: Option<f64>,
    consume_per_s: Option<f64>,
    baseline_per_s: Option<f64>,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    rss_mb: Option<f64>,
    lost: Option<u64>,
    dup: Option<u64>,
    extras: Vec<(String, String)>,
    /// Lines printed after the `RESULT` line (a cluster's `NODE` lines).
    after: Vec<String>,
}

impl Line {
    fn new(scenario: Scenario, config: Config, n: u64, set: String) -> Self {
        Self {
            scenario,
            config,
            n,
            publish_per_s: None,
            consume_per_s: None,
            baseline_per_s: None,
            p50_ms: None,
            p99_ms: None,
            rss_mb: None,
            lost: None,
            dup: None,
            extras: vec![("set".to_owned(), set)],
            after: Vec::new(),
        }
    }

    fn extra(&mut self, k: &str, v: impl ToString) {
        self.extras.push((k.to_owned(), v.to_string()));
    }

    fn render(&self) -> String {
        let f = |v: Option<f64>, prec: usize| {
            v.map_or_else(|| "-".to_owned(), |v| format!("{v:.prec$}"))
        };
        let u = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        let measured = if self.scenario.is_publish() {
            self.publish_per_s
        } else {
            self.consume_per_s
        };
        let ratio = match (measured, self.baseline_per_s) {
            (Some(m), Some(b)) if b > 0.0 => Some(m / b),
            _ => None,
        };
        let mut s = format!(
            "RESULT scenario={} config={} n={} publish_per_s={} consume_per_s={} baseline_per_s={} ratio={} p50_ms={} p99_ms={} rss_mb={} lost={} dup={}",
            self.scenario,
            self.config.name(),
            self.n,
            f(self.publish_per_s, 0),
            f(self.consume_per_s, 0),
            f(self.baseline_per_s, 0),
            f(ratio, 2),
            f(self.p50_ms, 2),
            f(self.p99_ms, 2),
            f(self.rss_mb, 1),
            u(self.lost),
            u(self.dup),
        );
        for (k, v) in &self.extras {
            let _ = write!(s, " {k}={v}");
        }
        for l in &self.after {
            let _ = write!(s, "\n{l}");
        }
        s
    }
}

/// The `STATS` line of a child, as key/value pairs.
struct Stats(HashMap<String, String>);

impl Stats {
    fn f(&self, k: &str) -> Option<f64> {
        self.0.get(k).and_then(|v| v.parse().ok())
    }
    fn u(&self, k: &str) -> Option<u64> {
        self.0.get(k).and_then(|v| v.parse().ok())
    }
    fn ms(&self, k: &str) -> Option<f64> {
        self.f(k).map(|us| us / 1000.0)
    }
    fn mb(&self, k: &str) -> Option<f64> {
        self.f(k).map(|kb| kb / 1024.0)
    }
}

/// What a child is to run.
struct Spec<'a> {
    role: Role,
    scenario: Scenario,
    config: Config,
    n: u64,
    prefix: &'a str,
    /// The delayed burst's due time.
    due_ns: Option<u64>,
    /// Latency from the stamp in each body.
    stamped: bool,
}

/// A running child and its stdout.
struct Running {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Running {
    async fn spawn(ctx: &Ctx<'_>, spec: Spec<'_>) -> Result<Self, BoxError> {
        let Spec {
            role,
            scenario,
            config,
            n,
            prefix,
            due_ns,
            stamped,
        } = spec;
        let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
        cmd.args([
            "--role",
            match role {
                Role::Consumer => "consumer",
                Role::Publisher => "publisher",
            },
            "--scenario",
            scenario.name(),
            "--config",
            config.name(),
            "--n",
            &n.to_string(),
            "--redis",
            &ctx.cli.redis,
            "--prefix",
            prefix,
        ]);
        if !ctx.cli.cluster.is_empty() {
            cmd.args(["--cluster", &ctx.cli.cluster.join(",")]);
        }
        if let Some(p) = ctx.cli.partitions {
            cmd.args(["--partitions", &p.to_string()]);
        }
        if let Some(pid) = ctx.redis_pid {
            cmd.args(["--redis-pid", &pid.to_string()]);
        }
        if let Some(due) = due_ns {
            cmd.args(["--due-ns", &due.to_string()]);
        }
        if stamped {
            cmd.arg("--stamped");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("the child has no stdout")?;
        let mut running = Self {
            child,
            lines: BufReader::new(stdout).lines(),
        };
        running.expect("READY").await?;
        Ok(running)
    }

    async fn expect(&mut self, head: &str) -> Result<String, BoxError> {
        while let Some(line) = self.lines.next_line().await? {
            if let Some(rest) = line.strip_prefix(head) {
                return Ok(rest.trim().to_owned());
            }
            eprintln!("child: {line}");
        }
        let status = self.child.wait().await?;
        Err(format!("the child ended ({status}) before printing {head}").into())
    }

    async fn stats(mut self) -> Result<Stats, BoxError> {
        let rest = self.expect("STATS").await?;
        let status = self.child.wait().await?;
        if !status.success() {
            return Err(format!("the child failed: {status}").into());
        }
        Ok(Stats(
            rest.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        ))
    }
}

/// Takes a consuming child's figures into the line.
fn take_consumer(line: &mut Line, n: u64, st: &Stats) {
    line.consume_per_s = st.f("rate");
    let distinct = st.u("distinct").unwrap_or(0);
    line.lost = Some(n.saturating_sub(distinct));
    line.dup = st.u("dups");
    line.rss_mb = st.mb("hwm_kb");
    line.extra(
        "base_rss_mb",
        format!("{:.1}", st.mb("base_kb").unwrap_or(0.0)),
    );
    cpu_fields(line, st);
    line.extra("shutdown_ms", st.u("shutdown_ms").unwrap_or(0));
    if st.u("strays").unwrap_or(0) > 0 {
        line.extra("strays", st.u("strays").unwrap_or(0));
    }
}

/// CPU of the child and of Redis during the measured phase, % of one core: run, and waiting for
/// a CPU (time other processes took).
/// With the child's rate, also the CPU each message cost the client and Redis, in µs (CPU time
/// over messages, whatever else the machine was doing).
fn cpu_fields(line: &mut Line, st: &Stats) {
    for k in ["client_cpu", "client_wait", "redis_cpu", "redis_wait"] {
        line.extra(k, format!("{}%", st.0.get(k).map_or("-", String::as_str)));
    }
    if let Some(rate) = st.f("rate").filter(|r| *r > 0.0) {
        for (k, name) in [
            ("client_cpu", "client_us_per_msg"),
            ("redis_cpu", "redis_us_per_msg"),
        ] {
            if let Some(pct) = st.f(k) {
                line.extra(name, format!("{:.2}", pct / 100.0 / rate * 1e6));
            }
        }
    }
}

fn ms(us: u32) -> f64 {
    f64::from(us) / 1000.0
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
        Scenario::Pubsub => pubsub(ctx, c, &tuning, prefix, &raw_key, line).await?,
        Scenario::PublishBatch | Scenario::PublishSingle => {
            let before = command_calls(&ctx.raw).await?;
            let st = Running::spawn(
                ctx,
                Spec {
                    role: Role::Publisher,
                    scenario: s,
                    config: c,
                    n,
                    prefix,
                    due_ns: None,
                    stamped: false,
                },
            )
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
        | Scenario::Recovery
        | Scenario::Batch
        | Scenario::Stream
        | Scenario::RateLimit
        | Scenario::RateLimitKey => {
            queue(ctx, s, c, prefix, line).await?;
        }
        Scenario::Delayed => delayed(ctx, c, &tuning, prefix, &raw_key, line).await?,
        Scenario::Latency => latency(ctx, c, prefix, &raw_key, line).await?,
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
    let spec = Spec {
        role: Role::Consumer,
        scenario: s,
        config: c,
        n,
        prefix,
        due_ns: None,
        stamped: false,
    };
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

/// The delayed scenario: a burst of `n` entries all due at one instant (throughput, and the
/// burst's lateness), then a steady run of entries each due 100 ms after its publish (lateness).
async fn delayed(
    ctx: &Ctx<'_>,
    c: Config,
    tuning: &Tuning,
    prefix: &str,
    raw_key: &str,
    line: &mut Line,
) -> Result<(), BoxError> {
    let n = ctx.cli.n;
    let s = Scenario::Delayed;
    let broker = child::broker(&ctx.target, prefix, tuning);
    broker.connect().await?;
    // Due once the fill is surely over: 1 s plus 15 µs a message.
    let due = SystemTime::now() + Duration::from_secs(1) + Duration::from_micros(15 * n);
    let due_ns = u64::try_from(due.duration_since(UNIX_EPOCH)?.as_nanos())?;
    let (fill, _) = child::publish_batches(&broker.publisher(), KEY, n, tuning, Some(due)).await?;
    line.publish_per_s = Some(per_s(n, fill));
    if SystemTime::now() > due {
        line.extra("warning", "fill-ended-after-due");
    }
    let before = command_calls(&ctx.raw).await?;
    let st = Running::spawn(
        ctx,
        Spec {
            role: Role::Consumer,
            scenario: s,
            config: c,
            n,
            prefix,
            due_ns: Some(due_ns),
            stamped: false,
        },
    )
    .await?
    .stats()
    .await?;
    let after = command_calls(&ctx.raw).await?;
    take_consumer(line, n, &st);
    line.extra("calls_per_msg", calls_per_msg(&before, &after, n));
    line.extra(
        "burst_p50_ms",
        format!("{:.1}", st.ms("p50_us").unwrap_or(0.0)),
    );
    line.extra(
        "burst_p99_ms",
        format!("{:.1}", st.ms("p99_us").unwrap_or(0.0)),
    );

    // Lateness on a steady stream of delayed publishes.
    let steady_n = n.min(DELAYED_STEADY_N);
    let running = Running::spawn(
        ctx,
        Spec {
            role: Role::Consumer,
            scenario: s,
            config: c,
            n: steady_n,
            prefix,
            due_ns: None,
            stamped: true,
        },
    )
    .await?;
    let publisher = broker.publisher();
    raw::paced(DELAYED_RATE, steady_n, |i| {
        let publisher = publisher.clone();
        async move {
            let at = SystemTime::now() + DELAYED_AHEAD;
            let at_ns = u64::try_from(at.duration_since(UNIX_EPOCH)?.as_nanos())?;
            let m = Msg::new(i, at_ns);
            publisher.message(&m).to(KEY).at(at).publish().await?;
            Ok(())
        }
    })
    .await?;
    let st2 = running.stats().await?;
    ruststream_core::Broker::close(&broker).await;
    line.p50_ms = st2.ms("p50_us");
    line.p99_ms = st2.ms("p99_us");
    line.extra("steady_n", steady_n);
    line.extra(
        "steady_lost",
        steady_n.saturating_sub(st2.u("distinct").unwrap_or(0)),
    );
    line.extra("steady_dup", st2.u("dups").unwrap_or(0));
    line.rss_mb = match (line.rss_mb, st2.mb("hwm_kb")) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    line.extra("left", leftovers(&ctx.raw, prefix).await?);
    if !ctx.cli.no_baseline {
        let due_ms = now_ns() / 1_000_000 + 1000 + 15 * n / 1000;
        let out = raw::delayed(&ctx.raw, raw_key, n, tuning.batch(), due_ms).await?;
        line.baseline_per_s = Some(out.per_s);
        line.extra("baseline_seen", out.seen);
    }
    Ok(())
}

/// The pubsub scenario: a consumer child subscribes to channel `q` (`RedisChannel::new`), then
/// this process publishes N messages to it in batches; lost = ids the handler never saw (Pub/Sub
/// is at most once: a message Redis drops when it disconnects a subscriber past its output
/// buffer limit is gone; such disconnects are counted as `disconnects`).
async fn pubsub(
    ctx: &Ctx<'_>,
    c: Config,
    tuning: &Tuning,
    prefix: &str,
    raw_key: &str,
    line: &mut Line,
) -> Result<(), BoxError> {
    let n = ctx.cli.n;
    let s = Scenario::Pubsub;
    let channel = format!("{prefix}{KEY}");
    let running = Running::spawn(
        ctx,
        Spec {
            role: Role::Consumer,
            scenario: s,
            config: c,
            n,
            prefix,
            due_ns: None,
            stamped: false,
        },
    )
    .await?;
    // The child prints READY once its app started, i.e. once SUBSCRIBE was confirmed; check.
    let t = std::time::Instant::now();
    while numsub(&ctx.raw, &channel).await? < 1 {
        if t.elapsed() > Duration::from_secs(10) {
            return Err("the consumer did not subscribe within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let broker =
        child::broker(&ctx.target, prefix, tuning).route(KEY, ruststream::pubsub::Publish::new());
    broker.connect().await?;
    let before = command_calls(&ctx.raw).await?;
    let (fill, _) = child::publish_batches(&broker.publisher(), KEY, n, tuning, None).await?;
    line.publish_per_s = Some(per_s(n, fill));
    let st = running.stats().await?;
    let after = command_calls(&ctx.raw).await?;
    ruststream_core::Broker::close(&broker).await;
    take_consumer(line, n, &st);
    line.extra("lagged", st.u("lagged").unwrap_or(0));
    line.extra("disconnects", st.u("disconnects").unwrap_or(0));
    line.extra("calls_per_msg", calls_per_msg(&before, &after, n));
    line.extra("left", leftovers(&ctx.raw, prefix).await?);
    if !ctx.cli.no_baseline {
        // The ceiling: a buffer no burst of this run overflows, whatever the app's.
        let buffer = tuning.buffer.unwrap_or(0).max(raw::PUBSUB_BUFFER);
        let out = raw::pubsub(
            &ctx.cli.redis,
            &ctx.raw,
            raw_key,
            n,
            buffer,
            child::PUBSUB_QUIET,
        )
        .await?;
        line.baseline_per_s = Some(out.per_s);
        line.extra("baseline_seen", out.seen);
        line.extra("baseline_lagged", out.lagged);
    }
    Ok(())
}

/// `PUBSUB NUMSUB channel`: its subscribers.
async fn numsub(raw: &Client, channel: &str) -> Result<i64, BoxError> {
    let reply: Vec<Value> = raw
        .custom(raw::cmd("PUBSUB"), vec!["NUMSUB", channel])
        .await?;
    Ok(reply.get(1).and_then(Value::as_i64).unwrap_or(0))
}

/// The latency scenario: a steady rate of single publishes to a reliable list, end-to-end latency
/// from each message's creation (stamped in its body) to its handler.
async fn latency(
    ctx: &Ctx<'_>,
    c: Config,
    prefix: &str,
    raw_key: &str,
    line: &mut Line,
) -> Result<(), BoxError> {
    let n = ctx.cli.n;
    let rate = ctx.cli.rate;
    let s = Scenario::Latency;
    let broker = child::broker(&ctx.target, prefix, &Tuning::of(s, c));
    broker.connect().await?;
    let before = command_calls(&ctx.raw).await?;
    let running = Running::spawn(
        ctx,
        Spec {
            role: Role::Consumer,
            scenario: s,
            config: c,
            n,
            prefix,
            due_ns: None,
            stamped: true,
        },
    )
    .await?;
    let publisher = broker.publisher();
    let t0 = std::time::Instant::now();
    let sent = raw::paced(rate, n, |i| {
        let publisher = publisher.clone();
        async move {
            let m = Msg::new(i, now_ns());
            publisher.message(&m).to(KEY).publish().await?;
            Ok(())
        }
    })
    .await?;
    line.publish_per_s = Some(per_s(sent, t0.elapsed()));
    let st = running.stats().await?;
    let after = command_calls(&ctx.raw).await?;
    ruststream_core::Broker::close(&broker).await;
    take_consumer(line, n, &st);
    line.extra("calls_per_msg", calls_per_msg(&before, &after, n));
    line.p50_ms = st.ms("p50_us");
    line.p99_ms = st.ms("p99_us");
    line.extra("p999_ms", format!("{:.2}", st.ms("p999_us").unwrap_or(0.0)));
    line.extra("max_ms", format!("{:.2}", st.ms("max_us").unwrap_or(0.0)));
    line.extra("rate", rate);
    line.extra("left", leftovers(&ctx.raw, prefix).await?);
    if !ctx.cli.no_baseline {
        let out = raw::latency(&ctx.cli.redis, &ctx.raw, raw_key, n, rate).await?;
        line.baseline_per_s = Some(out.per_s);
        if let Some((p50, p99, p999)) = out.lat_us {
            line.extra("baseline_p50_ms", format!("{:.2}", ms(p50)));
            line.extra("baseline_p99_ms", format!("{:.2}", ms(p99)));
            line.extra("baseline_p999_ms", format!("{:.2}", ms(p999)));
        }
    }
    Ok(())
}

/// `(calls, usec)` per command from `INFO commandstats` (commands run inside scripts included).
async fn command_calls(raw: &Client) -> Result<HashMap<String, (u64, u64)>, BoxError> {
    let info: String = raw.info(Some(fred::types::InfoKind::CommandStats)).await?;
    Ok(info
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |f: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
            };
            Some((name.to_owned(), (field("calls")?, field("usec")?)))
        })
        .collect())
}

/// The commands Redis ran per message between two `command_calls` readings, most first, with
/// the server time of one call: `evalsha:0.0078x95us,lmove:1.0000x1us,...` (on a shared server,
/// other clients' commands count too).
fn calls_per_msg(
    before: &HashMap<String, (u64, u64)>,
    after: &HashMap<String, (u64, u64)>,
    n: u64,
) -> String {
    let mut v: Vec<(&String, u64, u64)> = after
        .iter()
        .map(|(k, (calls, usec))| {
            let (c0, u0) = before.get(k).copied().unwrap_or((0, 0));
            (k, calls.saturating_sub(c0), usec.saturating_sub(u0))
        })
        .filter(|(k, d, _)| *d > 0 && !matches!(k.as_str(), "info" | "scan" | "type"))
        .collect();
    v.sort_by_key(|x| std::cmp::Reverse(x.1));
    #[allow(clippy::cast_precision_loss)]
    let per = |d: u64, by: u64| d as f64 / by.max(1) as f64;
    v.iter()
        .take(8)
        .map(|(k, d, us)| format!("{k}:{:.4}x{:.1}us", per(*d, n), per(*us, *d)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads a published list back, counts ids missing and repeated, and deletes it.
async fn read_back(raw: &Client, key: &str, n: u64) -> Result<(u64, u64), BoxError> {
    let mut seen = vec![0u32; usize::try_from(n)?];
    let mut dup = 0;
    let mut start = 0i64;
    loop {
        let page: Vec<Value> = raw.lrange(key, start, start + 9_999).await?;
        if page.is_empty() {
            break;
        }
        start += i64::try_from(page.len())?;
        for v in page {
            let Some(b) = raw::bytes_of(v) else { continue };
            let frame = Frame::decode(b);
            let m: Msg = serde_json::from_slice(&frame.payload)?;
            match usize::try_from(m.id).ok().and_then(|i| seen.get_mut(i)) {
                Some(slot) => {
                    *slot += 1;
                    if *slot > 1 {
                        dup += 1;
                    }
                }
                None => dup += 1,
            }
        }
    }
    let _: i64 = raw.del(key).await?;
    Ok((seen.iter().filter(|&&c| c == 0).count() as u64, dup))
}

/// Keys under `prefix`, raw baseline keys excluded.
async fn keys(raw: &Client, prefix: &str) -> Result<Vec<String>, BoxError> {
    let mut out = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let reply: Value = raw
            .custom(
                raw::cmd("SCAN"),
                vec![
                    cursor.clone(),
                    "MATCH".into(),
                    format!("{prefix}*"),
                    "COUNT".into(),
                    "1000".into(),
                ],
            )
            .await?;
        let Value::Array(mut parts) = reply else {
            return Err("SCAN replied with no array".into());
        };
        let batch = parts.pop().map(Value::into_array).unwrap_or_default();
        out.extend(batch.into_iter().filter_map(|v| v.into_string()));
        cursor = parts
            .pop()
            .and_then(Value::into_string)
            .unwrap_or_else(|| "0".to_owned());
        if cursor == "0" {
            break;
        }
    }
    out.retain(|k| !k.starts_with(&format!("{prefix}raw:")));
    Ok(out)
}

/// What a run left under `prefix`: entries of lists, sets and hashes, and pending stream entries
/// (a stream keeps acknowledged entries; their count is reported as `stream_len`).
async fn leftovers(raw: &Client, prefix: &str) -> Result<String, BoxError> {
    let mut left = 0u64;
    let mut what = Vec::new();
    let mut stream_len = None;
    for key in keys(raw, prefix).await? {
        let kind: String = raw.custom(raw::cmd("TYPE"), vec![key.as_str()]).await?;
        let count: u64 = match kind.as_str() {
            "list" => raw.llen(&key).await?,
            "zset" => raw.zcard(&key).await?,
            "hash" => raw.hlen(&key).await?,
            "set" => raw.scard(&key).await?,
            "stream" => {
                stream_len = Some(raw.xlen::<u64, _>(&key).await?);
                let pending: Value = raw
                    .custom(raw::cmd("XPENDING"), vec![key.as_str(), GROUP])
                    .await?;
                match pending {
                    Value::Array(mut v) if !v.is_empty() => v.swap_remove(0).as_u64().unwrap_or(0),
                    _ => 0,
                }
            }
            _ => 1,
        };
        if count > 0 {
            left += count;
            what.push(format!("{}:{count}", key.trim_start_matches(prefix)));
        }
    }
    let mut s = left.to_string();
    if !what.is_empty() {
        let _ = write!(s, "({})", what.join(","));
    }
    if let Some(len) = stream_len {
        let _ = write!(s, " stream_len={len}");
    }
    Ok(s)
}

/// Deletes every key under `prefix` (baseline keys included), on every primary of a cluster;
/// one key per `UNLINK`, since a cluster refuses one across slots.
async fn cleanup(ctx: &Ctx<'_>, prefix: &str) -> Result<(), BoxError> {
    let clients: Vec<&Client> = match &ctx.nodes {
        Some(nodes) => nodes.primaries().map(|n| &n.client).collect(),
        None => vec![&ctx.raw],
    };
    for raw in clients {
        let mut all = keys(raw, prefix).await?;
        all.extend(keys(raw, &format!("{prefix}raw:")).await?);
        for key in all {
            let _: i64 = raw.custom(raw::cmd("UNLINK"), vec![key]).await?;
        }
    }
    Ok(())
}
