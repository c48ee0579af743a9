//! The demo on the stand. On Redis 7 (`RUSTSTREAM_REDIS_URL`) it handles its 5 jobs. Against
//! the stand's Redis 6.2 (`RUSTSTREAM_REDIS62_URL`) it stops within 5 s with an error that names
//! the server's version and the minimum, rather than waiting for jobs that are never handled.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The stand's variable `name`; `None` (skip) when unset, except under CI.
fn stand_var(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => Some(v),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{name} is not set: CI runs the tests through scripts/test")
        }
        _ => {
            eprintln!("SKIPPED: {name} is not set; run the tests with scripts/test");
            None
        }
    }
}

/// Runs the demo on `url`; fails the test if it still runs after `limit`.
fn run_demo(url: &str, limit: Duration) -> Output {
    let started = Instant::now();
    let mut demo = Command::new(env!("CARGO_BIN_EXE_ruststream-demo"))
        .env("REDIS_URL", url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the demo runs");
    while demo.try_wait().expect("the demo's status").is_none() {
        if started.elapsed() > limit {
            let _ = demo.kill();
            panic!("the demo still ran after {limit:?} on {url}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    demo.wait_with_output().expect("the demo's output")
}

#[test]
fn an_older_server_stops_the_demo_at_once() {
    let Some(url) = stand_var("RUSTSTREAM_REDIS62_URL") else {
        return;
    };
    let out = run_demo(&url, Duration::from_secs(5));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the demo succeeded on Redis 6.2: {stderr}"
    );
    for part in ["demo failed", "Redis 6.2.14", "needs Redis 7.0 or newer"] {
        assert!(stderr.contains(part), "`{part}` missing from: {stderr}");
    }
    assert!(out.stdout.is_empty(), "nothing was published");
}

#[test]
fn the_demo_handles_its_five_jobs() {
    let Some(url) = stand_var("RUSTSTREAM_REDIS_URL") else {
        return;
    };
    let out = run_demo(&url, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.matches("rendered photo-").count(), 5, "{stdout}");
    assert!(
        stdout.contains("all 5 jobs handled and acknowledged"),
        "{stdout}"
    );
}
