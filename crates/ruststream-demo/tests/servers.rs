//! The demo on a server RustStream does not support: against the stand's Redis 6.2
//! (`RUSTSTREAM_REDIS62_URL`), it stops within 5 s with an error that names the server's version
//! and the minimum, rather than waiting for jobs that are never handled.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn an_older_server_stops_the_demo_at_once() {
    let url = match std::env::var("RUSTSTREAM_REDIS62_URL") {
        Ok(url) if !url.is_empty() => url,
        _ if std::env::var_os("CI").is_some() => {
            panic!("RUSTSTREAM_REDIS62_URL is not set: CI runs the tests through scripts/test")
        }
        _ => {
            eprintln!(
                "SKIPPED: RUSTSTREAM_REDIS62_URL is not set; run the tests with scripts/test"
            );
            return;
        }
    };
    let started = Instant::now();
    let mut demo = Command::new(env!("CARGO_BIN_EXE_ruststream-demo"))
        .env("REDIS_URL", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the demo runs");
    let status = loop {
        if let Some(status) = demo.try_wait().expect("the demo's status") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(5) {
            let _ = demo.kill();
            panic!("the demo still ran after 5 s against Redis 6.2");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = demo.wait_with_output().expect("the demo's output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !status.success(),
        "the demo succeeded on Redis 6.2: {stderr}"
    );
    for part in ["demo failed", "Redis 6.2.14", "needs Redis 7.0 or newer"] {
        assert!(stderr.contains(part), "`{part}` missing from: {stderr}");
    }
    assert!(
        String::from_utf8_lossy(&out.stdout).is_empty(),
        "nothing was published"
    );
}
