//! Worker processes for tests that kill a worker: a child of the test binary that runs one
//! `#[ignore]`d test (the worker's body, which reads its settings from the environment), its
//! stderr in a log file. SIGKILL ([`WorkerProcess::kill`]) is a crash; SIGTERM
//! ([`WorkerProcess::stop`]) a clean shutdown; dropping it kills it if it still runs. The
//! worker's side is [`serve_until_sigterm`]. [`run_to_end`] runs such a test that ends by
//! itself (a command line) and returns its exit status and output. Both take the test's full
//! name ([`test_name`]): a binary holds the tests of many modules.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ruststream::{App, RustStream};

use super::wait_until;

/// The name libtest gives the test `name` of the module `module` (the caller's `module_path!()`):
/// the module's path without the crate's name, then `name` (`ledger::ledger_worker_process`).
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{name}"),
        None => name.to_owned(),
    }
}

/// The worker's side: starts `app`, logs `worker ready` (what [`WorkerProcess::ready`] waits
/// for), runs until SIGTERM, then shuts the app down cleanly.
pub async fn serve_until_sigterm(app: RustStream) {
    let running = app.start().await.expect("the worker starts");
    tracing::info!(pid = std::process::id(), "worker ready");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    term.recv().await;
    running.shutdown().await.expect("the worker shuts down");
    tracing::info!("worker stopped");
}

/// A worker process's runtime, after its log is set up: `info` and above on stderr (the log
/// file [`WorkerProcess::ready`] reads), a multi-threaded runtime of two threads.
pub fn worker_runtime() -> tokio::runtime::Runtime {
    tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// What a process of the test binary did: its exit code and output.
pub struct Finished {
    /// The exit code (`None` when a signal ended it).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error (a file, not a terminal).
    pub stderr: String,
}

/// Runs the test `test` of this binary (`--exact --ignored`) with `env`, stdout and stderr in
/// files (not terminals), until it exits, bounded by `timeout` (then it is killed and the test
/// fails).
pub async fn run_to_end(test: &str, env: &[(&str, String)], timeout: Duration) -> Finished {
    let dir = std::env::temp_dir();
    let name = super::unique("run");
    let (out_path, err_path) = (
        dir.join(format!("{name}.out")),
        dir.join(format!("{name}.err")),
    );
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([test, "--exact", "--ignored", "--nocapture"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("a stdout file"))
        .stderr(File::create(&err_path).expect("a stderr file"))
        .spawn()
        .expect("the process starts");
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("the process's status") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`{test}` did not exit within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let read = |p: &PathBuf| {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        let _ = std::fs::remove_file(p);
        text
    };
    Finished {
        code: status.code(),
        stdout: read(&out_path),
        stderr: read(&err_path),
    }
}

/// A worker process of the test binary.
pub struct WorkerProcess {
    child: Child,
    log: Option<PathBuf>,
}

impl WorkerProcess {
    /// Runs the test `test` of this binary (`--exact --ignored`) with `env`, its stderr in
    /// `log` (discarded without one).
    pub fn spawn(test: &str, env: &[(&str, String)], log: Option<PathBuf>) -> Self {
        let stderr = match &log {
            Some(path) => Stdio::from(File::create(path).expect("the worker's log file")),
            None => Stdio::null(),
        };
        let child = Command::new(std::env::current_exe().expect("the test binary"))
            .args([test, "--exact", "--ignored", "--nocapture"])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("the worker process starts");
        Self { child, log }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the worker wrote to its log so far.
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// Waits (bounded by `timeout`) until the worker logs `worker ready`.
    pub async fn ready(&self, timeout: Duration) {
        wait_until("a worker is ready", timeout, || async {
            self.log().contains("worker ready")
        })
        .await;
    }

    /// SIGKILL: a crash, mid-handler.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the worker");
        self.child.wait().expect("the killed worker is reaped");
    }

    /// SIGTERM, then waits (bounded by `timeout`) for a clean exit.
    pub async fn stop(mut self, timeout: Duration) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(
                    status.success(),
                    "worker exited with {status}: {}",
                    self.log()
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not stop: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
