//! What an operator sees of a service run through `run_main`: its name and version in
//! `-V`, no colour codes when stderr is not a terminal, `--log-format json`, one startup line a
//! subscription naming its keys and mode without the password, and one error line in words.
//! `job show` prints a dead job's history: published, its two retries with their errors, dead.
//!
//! Each test runs this binary's `#[ignore]`d [`service`] as a process, with stderr in a file;
//! the service takes its command line from `RUSTSTREAM_TEST_ARGS` and its Redis from
//! `REDIS_URL`.

use crate::harness;

use std::process::ExitCode;
use std::time::Duration;

use fred::prelude::*;
use harness::process::{Finished, run_to_end, test_name};
use harness::{redis_url, unique};
use ruststream::prelude::*;

/// How long one run of the service may take.
const LIMIT: Duration = Duration::from_secs(30);

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
struct Job {
    n: u32,
}
outgoing!(Job);

struct Ack;

impl Handle<Job> for Ack {
    async fn handle(&self, _: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        Ok(())
    }
}

/// The service under test: a reliable list and a stream group, on `REDIS_URL` with the prefix
/// `RUSTSTREAM_TEST_PREFIX`.
fn app() -> RustStream {
    let prefix = std::env::var("RUSTSTREAM_TEST_PREFIX").unwrap_or_default();
    RustStream::new(AppInfo::new("cli-demo", "1.2.3")).with_broker(
        RedisBroker::from_env().prefix(prefix),
        |b| {
            b.include(subscriber(RedisList::new("{jobs}").reliable(), Ack).build());
            b.include(subscriber(RedisStream::new("{events}").group("g"), Ack).build());
        },
    )
}

/// The service's process: `run_main_from` with `RUSTSTREAM_TEST_ARGS` (space-separated).
#[test]
#[ignore = "run by the other tests as a process"]
fn service() {
    let args = std::env::var("RUSTSTREAM_TEST_ARGS").unwrap_or_default();
    let args = std::iter::once("cli-demo").chain(args.split_whitespace());
    let code = ruststream::run_main_from(args, app);
    std::process::exit(i32::from(code != ExitCode::SUCCESS));
}

/// Runs [`service`] with `args` on the Redis at `url`.
async fn run(args: &str, url: &str, prefix: &str) -> Finished {
    let env = [
        ("RUSTSTREAM_TEST_ARGS", args.to_owned()),
        ("REDIS_URL", url.to_owned()),
        ("RUSTSTREAM_TEST_PREFIX", prefix.to_owned()),
        ("RUST_LOG", "info".to_owned()),
    ];
    run_to_end(&test_name(module_path!(), "service"), &env, LIMIT).await
}

#[tokio::test]
async fn version_and_help_name_the_app() {
    let version = run("-V", "redis://127.0.0.1:1", "").await;
    assert_eq!(version.code, Some(0), "{}", version.stderr);
    assert!(
        version.stdout.lines().any(|l| l == "cli-demo 1.2.3"),
        "{}",
        version.stdout
    );
    let help = run("--help", "redis://127.0.0.1:1", "").await;
    assert!(help.stdout.contains("cli-demo"), "{}", help.stdout);
    assert!(help.stdout.contains("--log-format"), "{}", help.stdout);
    assert!(!help.stdout.contains("ruststream"), "{}", help.stdout);
}

/// A free loopback port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

#[tokio::test]
async fn a_refused_connection_is_one_error_line_in_words() {
    let url = format!("redis://127.0.0.1:{}", closed_port());
    let out = run("check", &url, "").await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let errors: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("ERROR") || l.contains("error"))
        .collect();
    assert_eq!(errors.len(), 1, "{}", out.stderr);
    assert!(
        errors[0].contains(&format!("cannot connect to {url}: connection refused")),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("Os {"), "{}", out.stderr);
    assert!(
        !out.stderr.contains("\x1b["),
        "colour codes: {:?}",
        out.stderr
    );
}

#[tokio::test]
async fn an_http_url_is_refused_naming_the_schemes() {
    let out = run("check", "http://127.0.0.1:6379", "").await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("unsupported URL scheme `http://`"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("redis://") && out.stderr.contains("rediss://"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn startup_lines_name_keys_and_mode_without_the_password_in_text_and_json() {
    let Some(url) = redis_url() else { return };
    let admin = harness::stand::node_client(&url).await;
    let user = unique("cli");
    let password = format!("pw-{}", unique("secret"));
    let prefix = format!("{}:", unique("cli"));
    harness::stand::acl_user(&admin, &user, &password, &prefix).await;
    let with_password = url.replacen("redis://", &format!("redis://{user}:{password}@"), 1);

    let text = run("check", &with_password, &prefix).await;
    let json = run("--log-format json check", &with_password, &prefix).await;
    let _: Value = admin
        .custom(fred::cmd!("ACL"), vec!["DELUSER", user.as_str()])
        .await
        .expect("ACL DELUSER");
    let _ = admin.quit().await;

    assert_eq!(text.code, Some(0), "{}", text.stderr);
    assert!(
        !text.stderr.contains("\x1b["),
        "colour codes: {:?}",
        text.stderr
    );
    assert!(!text.stderr.contains(&password), "{}", text.stderr);
    let list = text
        .stderr
        .lines()
        .find(|l| l.contains("subscription ready") && l.contains("queue="))
        .unwrap_or_else(|| panic!("a startup line for the list: {}", text.stderr));
    for part in [
        format!("queue={prefix}{{jobs}}"),
        format!("processing={prefix}{{jobs}}.processing"),
        format!("dead={prefix}{{jobs}}.dead"),
        "reliable with recovery".to_owned(),
        "concurrency=128".to_owned(),
        format!("redis://{user}:***@"),
    ] {
        assert!(list.contains(&part), "`{part}` in {list}");
    }
    assert!(
        text.stderr.lines().any(|l| l.contains("subscription ready")
            && l.contains(&format!("stream={prefix}{{events}}"))
            && l.contains("group `g`")),
        "{}",
        text.stderr
    );

    assert_eq!(json.code, Some(0), "{}", json.stderr);
    assert!(!json.stderr.contains(&password), "{}", json.stderr);
    let lines: Vec<serde_json::Value> = json
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let ready: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "subscription ready")
        .collect();
    assert_eq!(ready.len(), 2, "{}", json.stderr);
    assert!(
        ready
            .iter()
            .any(|l| l["fields"]["mode"] == "reliable with recovery (min_idle 30s)"),
        "{}",
        json.stderr
    );
}

/// `cancel SUB --id ID`: a delayed message of the list is removed, and a second run
/// (a retried command) says the same; an id that is nowhere is not found, and the command fails.
#[tokio::test]
async fn cancel_removes_a_delayed_message_and_says_not_found_for_an_unknown_id() {
    let Some(url) = redis_url() else { return };
    let prefix = format!("{}:", unique("cli-cancel"));
    let broker = RedisBroker::standalone(url.clone()).prefix(prefix.clone());
    broker.connect().await.expect("connect");
    broker
        .publisher()
        .message(&Job { n: 1 })
        .to("{jobs}")
        .id("late")
        .delay(Duration::from_secs(3600))
        .publish()
        .await
        .expect("publish");

    for _ in 0..2 {
        let removed = run("cancel {jobs} --id late", &url, &prefix).await;
        assert_eq!(removed.code, Some(0), "{}", removed.stderr);
        assert!(
            removed
                .stdout
                .contains("cancel `late` of `{jobs}`: removed"),
            "{}",
            removed.stdout
        );
    }
    let client = harness::stand::node_client(&url).await;
    let delayed: i64 = client
        .zcard(format!("{prefix}{{jobs}}.delayed"))
        .await
        .expect("ZCARD");
    assert_eq!(delayed, 0, "gone from the delayed set");

    let missing = run("cancel {jobs} --id nobody", &url, &prefix).await;
    assert_eq!(missing.code, Some(1), "{}", missing.stderr);
    assert!(missing.stdout.contains("not found"), "{}", missing.stdout);
    let _: i64 = client
        .del(vec![
            format!("{prefix}{{jobs}}.cancels"),
            format!("{prefix}{{jobs}}.delayed"),
            format!("{prefix}{{jobs}}.delayed.payloads"),
            format!("{prefix}ruststream:job:{{late}}"),
        ])
        .await
        .unwrap_or(0);
    let _ = client.quit().await;
}

/// Fails every delivery with an error naming its attempt, as a `#[subscriber]` function's
/// `Err(e)` does.
struct Declines;

impl Handle<Job> for Declines {
    async fn handle(&self, _: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let failed: Result<(), String> = Err(format!("declined on attempt {}", ctx.attempt()));
        ruststream::IntoHandlerResult::into_handler_result(failed)
    }
}

/// `job show ID`: a message that failed twice, then died, prints its history in order, each
/// event with its time: published (its id is a producer's own UUIDv7), the two retries with the
/// handler's errors and their attempts, then the dead letter.
#[tokio::test]
async fn job_show_prints_a_dead_jobs_history_in_order() {
    let Some(url) = redis_url() else { return };
    let prefix = format!("{}:", unique("cli-story"));
    let broker = RedisBroker::standalone(url.clone()).prefix(prefix.clone());
    let source = RedisList::new("{jobs}")
        .reliable()
        .max_attempts(3)
        .retry(Backoff::fixed(Duration::from_millis(10)));
    let app = RustStream::new(AppInfo::new("cli-demo", "1.2.3")).with_broker(broker.clone(), |b| {
        b.include(subscriber(source, Declines).build());
    });
    let running = harness::start(app).await;
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis();
    let id = format!(
        "{:08x}-{:04x}-7000-8000-00000000002a",
        ms >> 16,
        ms & 0xffff
    );
    broker
        .publisher()
        .message(&Job { n: 1 })
        .to("{jobs}")
        .id(id.clone())
        .publish()
        .await
        .expect("publish");
    let client = harness::stand::node_client(&url).await;
    let dead = format!("{prefix}{{jobs}}.dead");
    harness::wait_until("the job is dead", harness::WAIT, async || {
        client.llen::<i64, _>(&dead).await.unwrap_or(0) == 1
    })
    .await;
    harness::stop(running).await;

    let shown = run(&format!("job show {id}"), &url, &prefix).await;
    assert_eq!(shown.code, Some(0), "{}", shown.stderr);
    let events: Vec<&str> = shown
        .stdout
        .lines()
        .filter(|l| l.contains(" UTC  "))
        .map(|l| l.split(" UTC  ").nth(1).unwrap_or(""))
        .collect();
    assert_eq!(
        events,
        [
            "published",
            "retry (attempt 1): declined on attempt 1",
            "retry (attempt 2): declined on attempt 2",
            "dead (attempt 3): max-attempts",
        ],
        "{}",
        shown.stdout
    );
    let _: i64 = client.del(dead).await.unwrap_or(0);
    let _ = client.quit().await;
}
