//! A child process of the benchmark (this binary, with `--role`): started, waited on until it
//! prints `READY`, and read for its `STATS` line.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use crate::common::{Config, Scenario};
use crate::line::Stats;
use crate::{BoxError, Ctx, Role};

/// What a child is to run.
pub(crate) struct Spec<'a> {
    pub(crate) role: Role,
    pub(crate) scenario: Scenario,
    pub(crate) config: Config,
    pub(crate) n: u64,
    pub(crate) prefix: &'a str,
    /// The delayed burst's due time.
    pub(crate) due_ns: Option<u64>,
    /// Latency from the stamp in each body.
    pub(crate) stamped: bool,
}

impl<'a> Spec<'a> {
    /// A child consuming (or publishing, as `role` says) `n` messages of `scenario`, with no
    /// due time and no stamps.
    pub(crate) fn new(
        role: Role,
        scenario: Scenario,
        config: Config,
        n: u64,
        prefix: &'a str,
    ) -> Self {
        Self {
            role,
            scenario,
            config,
            n,
            prefix,
            due_ns: None,
            stamped: false,
        }
    }
}

/// A running child and its stdout.
pub(crate) struct Running {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Running {
    pub(crate) async fn spawn(ctx: &Ctx<'_>, spec: Spec<'_>) -> Result<Self, BoxError> {
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

    pub(crate) async fn expect(&mut self, head: &str) -> Result<String, BoxError> {
        while let Some(line) = self.lines.next_line().await? {
            if let Some(rest) = line.strip_prefix(head) {
                return Ok(rest.trim().to_owned());
            }
            eprintln!("child: {line}");
        }
        let status = self.child.wait().await?;
        Err(format!("the child ended ({status}) before printing {head}").into())
    }

    pub(crate) async fn stats(mut self) -> Result<Stats, BoxError> {
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
