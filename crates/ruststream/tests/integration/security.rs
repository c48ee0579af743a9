//! TLS and ACL users on a real Redis: a `rediss://` server whose certificate a private
//! CA signed (the stand's TLS server, `RUSTSTREAM_TLS_URL` / `RUSTSTREAM_TLS_CA`), an ACL user
//! limited to the app's keys and channels, and a wrong password that stops the app at startup
//! without the password showing in the error or the logs.

use crate::harness;

use std::time::Duration;

use fred::prelude::*;
use harness::{Env, bounded, on, stand, stop, unique, wait_until};
use ruststream::prelude::*;

// On the shared standalone server (ACL users are per server); the TLS server is the stand's own.
on!(
    [standalone]
    an_acl_user_limited_to_the_apps_keys_runs_a_reliable_list,
    the_guides_acl_user_reads_every_queue_without_a_refused_command,
    a_wrong_password_stops_the_app_at_startup_without_showing_it,
);

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Job {
    n: u32,
}
outgoing!(Job);

/// The harness's recorder: `Record::default()` acknowledges, `Record::hanging()` never finishes.
type Record = harness::Seen<Job>;

fn thumbnails(min_idle: Duration) -> RedisList {
    RedisList::new("{thumbnails}")
        .reliable()
        .min_idle(min_idle)
        .recovery_zset("{thumbnails}.claims")
        .block(Duration::from_millis(200))
}

fn app(broker: RedisBroker, source: RedisList, h: Record) -> RustStream {
    RustStream::new(AppInfo::new("secure", "0"))
        .shutdown_timeout(Duration::from_millis(100))
        .with_broker(broker, |b| {
            b.include(subscriber(source, h).build());
        })
}

/// A hung worker claims one job and stops; a second one, with a short `min_idle`, recovers it
/// and handles the rest (one of them published with a delay, so the delayed set's wake-up
/// channel is used too). Returns how many the second handled.
async fn reliable_list_with_recovery(broker: impl Fn() -> RedisBroker) -> usize {
    let hung = Record::hanging();
    let running = bounded(
        "start",
        Duration::from_secs(10),
        app(broker(), thumbnails(Duration::from_secs(60)), hung.clone()).start(),
    )
    .await
    .expect("the app starts");
    let publisher = broker();
    publisher.connect().await.expect("the publisher connects");
    let publisher = publisher.publisher();
    publisher
        .message(&Job { n: 0 })
        .to("{thumbnails}")
        .publish()
        .await
        .unwrap();
    wait_until("claimed", Duration::from_secs(5), || async {
        hung.count() == 1
    })
    .await;
    stop(running).await;

    let ok = Record::default();
    let running = bounded(
        "start",
        Duration::from_secs(10),
        app(broker(), thumbnails(Duration::from_millis(300)), ok.clone()).start(),
    )
    .await
    .expect("the app starts");
    let jobs: Vec<Job> = (1..20).map(|n| Job { n }).collect();
    publisher
        .messages(&jobs)
        .to("{thumbnails}")
        .publish()
        .await
        .unwrap();
    publisher
        .message(&Job { n: 20 })
        .to("{thumbnails}")
        .delay(Duration::from_millis(100))
        .publish()
        .await
        .unwrap();
    wait_until("21 handled", Duration::from_secs(10), || async {
        ok.count() == 21
    })
    .await;
    stop(running).await;
    let mut seen: Vec<u32> = ok.seen().iter().map(|d| d.n).collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..=20).collect::<Vec<_>>(),
        "the recovered job and the rest"
    );
    seen.len()
}

#[tokio::test]
async fn a_tls_server_with_a_private_ca() {
    let Some((url, ca)) = harness::tls_stand() else {
        return;
    };
    let prefix = format!("{}:", unique("tls"));
    let handled = reliable_list_with_recovery(|| {
        RedisBroker::standalone(url.clone())
            .tls_ca_file(&ca)
            .prefix(&prefix)
    })
    .await;
    println!("tls: handled={handled}");

    // The system's roots do not know the stand's CA: a clear startup error.
    let e = bounded(
        "start",
        Duration::from_secs(15),
        app(
            RedisBroker::standalone(url.clone()).prefix(&prefix),
            thumbnails(Duration::from_secs(60)),
            Record::default(),
        )
        .start(),
    )
    .await
    .expect_err("an unknown CA must stop the app")
    .to_string();
    assert!(e.contains(&url) && e.contains("TLS"), "{e}");
    // A CA file that is not there.
    let e = bounded(
        "start",
        Duration::from_secs(15),
        app(
            RedisBroker::standalone(url.clone()).tls_ca_file("/nonexistent/ca.pem"),
            thumbnails(Duration::from_secs(60)),
            Record::default(),
        )
        .start(),
    )
    .await
    .expect_err("a missing CA file must stop the app");
    let config = harness::config_error(&e);
    assert_eq!(config.option, "tls_ca_file", "{e}");
    assert_eq!(
        config.subject.as_deref(),
        Some("/nonexistent/ca.pem"),
        "{e}"
    );
}

async fn an_acl_user_limited_to_the_apps_keys_runs_a_reliable_list(env: &Env) {
    let logs = harness::logs::captured();
    let admin = &env.client;
    let url = env.url().expect("the standalone server");
    let user = unique("app");
    let password = format!("pw-{}", unique("secret"));
    let prefix = &env.prefix;
    stand::acl_user(admin, &user, &password, prefix).await;

    let handled = reliable_list_with_recovery(|| {
        RedisBroker::standalone(url)
            .username(&user)
            .password(&password)
            .prefix(prefix)
    })
    .await;

    // The user really is limited: a key outside the prefix is refused.
    let mut config = Config::from_url(url).unwrap();
    config.username = Some(user.clone());
    config.password = Some(password.clone());
    let limited = stand::connect(config).await;
    let refused: Result<Value, _> = limited
        .set("outside-the-prefix", 1, None, None, false)
        .await;
    let refused = refused.expect_err("a key outside the prefix is refused");
    assert_eq!(
        ruststream::redis::error::kind_of(&refused),
        ruststream::ErrorKind::Auth,
        "{refused:?}"
    );
    let _ = limited.quit().await;
    let _: Value = admin
        .custom(fred::cmd!("ACL"), vec!["DELUSER", user.as_str()])
        .await
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&logs.lock().unwrap()).contains(&password),
        "the password was logged"
    );
    println!("acl: handled={handled} outside-key=NOPERM");
}

/// The arguments of the guide's `ACL SETUSER` line for a service user, with `user`, `password`
/// and `prefix` put in, and the rule `without` left out.
fn guide_acl_rules(user: &str, password: &str, prefix: &str, without: Option<&str>) -> Vec<String> {
    let page = include_str!("../../../../docs/guide/src/security.md");
    let line = page
        .lines()
        .find(|l| l.starts_with("ACL SETUSER myapp "))
        .expect("the guide's ACL line");
    line.split_whitespace()
        .skip(1)
        .map(|word| match word {
            "myapp" => user.to_owned(),
            ">CHANGE-ME" => format!(">{password}"),
            "~myapp:*" => format!("~{prefix}*"),
            "&myapp:*" => format!("&{prefix}*"),
            word => word.to_owned(),
        })
        .filter(|word| Some(word.as_str()) != without)
        .collect()
}

/// The commands `ACL LOG` holds as refused to `user`.
async fn refused_to(admin: &Client, user: &str) -> Vec<String> {
    let entries: Vec<Value> = admin
        .custom(fred::cmd!("ACL"), vec!["LOG", "128"])
        .await
        .expect("ACL LOG");
    entries
        .into_iter()
        .filter_map(|entry| {
            let fields: Vec<String> = entry
                .into_array()
                .into_iter()
                .filter_map(|v| v.as_string())
                .collect();
            let field = |name: &str| {
                let at = fields.iter().position(|f| f == name)?;
                fields.get(at + 1).cloned()
            };
            (field("username").as_deref() == Some(user))
                .then(|| field("object").unwrap_or_default())
        })
        .collect()
}

/// The service user of the guide's security page runs a simple list, a reliable list and a
/// consumer group with no command refused; without `+@transaction` the native readers use
/// their scripts, warn once each, and still handle everything.
async fn the_guides_acl_user_reads_every_queue_without_a_refused_command(env: &Env) {
    harness::logs::capture();
    let admin = &env.client;
    let url = env.url().expect("the standalone server");
    for without in [None, Some("+@transaction")] {
        let user = unique("guide");
        let password = format!("pw-{}", unique("secret"));
        let prefix = format!("{}{user}:", env.prefix);
        let _: Value = admin
            .custom(
                fred::cmd!("ACL"),
                guide_acl_rules(&user, &password, &prefix, without),
            )
            .await
            .expect("ACL SETUSER from the guide's line");
        let broker = RedisBroker::standalone(url)
            .username(&user)
            .password(&password)
            .prefix(&prefix)
            .route("{g}.stream", ruststream::stream::Publish::new());
        let seen = Record::default();
        let (s1, s2, s3) = (seen.clone(), seen.clone(), seen.clone());
        let app = RustStream::new(AppInfo::new("guide-acl", "0"))
            .shutdown_timeout(Duration::from_millis(100))
            .with_broker(broker.clone(), move |b| {
                b.include(subscriber(RedisList::new("{g}.simple"), s1).build());
                b.include(subscriber(RedisList::new("{g}.reliable").reliable(), s2).build());
                // One reader, so one warning.
                let group = RedisStream::new("{g}.stream").group("g").readers(1);
                b.include(subscriber(group, s3).build());
            });
        let running = bounded("start", Duration::from_secs(10), app.start())
            .await
            .expect("the app starts");
        broker.connect().await.expect("the publisher connects");
        let publisher = broker.publisher();
        let jobs: Vec<Job> = (0..50).map(|n| Job { n }).collect();
        for key in ["{g}.simple", "{g}.reliable", "{g}.stream"] {
            publisher
                .messages(&jobs)
                .to(key)
                .publish()
                .await
                .expect("publish");
        }
        wait_until("150 handled", Duration::from_secs(20), || async {
            seen.count() == 150
        })
        .await;
        stop(running).await;
        let refused = refused_to(admin, &user).await;
        let warned = harness::logs::lines_with(&[&prefix, "grant the user +@transaction"]);
        match without {
            None => {
                assert!(
                    refused.is_empty(),
                    "refused to the guide's user: {refused:?}"
                );
                assert!(warned.is_empty(), "{warned:?}");
            }
            Some(_) => {
                assert!(
                    refused.iter().any(|c| c == "watch" || c == "multi"),
                    "the transaction was refused: {refused:?}"
                );
                // One warning a native reader: the simple list's and the group's.
                assert_eq!(warned.len(), 2, "{warned:?}");
            }
        }
        println!("guide's ACL line without {without:?}: refused {refused:?}");
        let _: Value = admin
            .custom(fred::cmd!("ACL"), vec!["DELUSER", user.as_str()])
            .await
            .unwrap();
    }
}

async fn a_wrong_password_stops_the_app_at_startup_without_showing_it(env: &Env) {
    let logs = harness::logs::captured();
    let admin = &env.client;
    let url = env.url().expect("the standalone server");
    let user = unique("app");
    let prefix = &env.prefix;
    stand::acl_user(admin, &user, "the-right-one", prefix).await;
    let wrong = format!("wrong-{}", unique("secret"));
    // Once through the builder, once in the URL.
    let with_url = url.replacen("://", &format!("://{user}:{wrong}@"), 1);
    for broker in [
        RedisBroker::standalone(url)
            .username(&user)
            .password(&wrong),
        RedisBroker::standalone(with_url),
    ] {
        let started = std::time::Instant::now();
        let e = bounded(
            "a failing start",
            Duration::from_secs(15),
            app(
                broker.prefix(prefix),
                thumbnails(Duration::from_secs(60)),
                Record::default(),
            )
            .start(),
        )
        .await
        .expect_err("a wrong password must stop the app")
        .to_string();
        assert!(
            e.contains("check the user name and password"),
            "a clear error: {e}"
        );
        assert!(!e.contains(&wrong), "the password is in the error: {e}");
        println!("wrong password: {e} (after {:?})", started.elapsed());
    }
    let logged = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    // The capture works (fred's own `log` records included): it saw the refusal.
    assert!(logged.contains("WRONGPASS"), "nothing was captured");
    assert!(!logged.contains(&wrong), "the password was logged");
    let _: Value = admin
        .custom(fred::cmd!("ACL"), vec!["DELUSER", user.as_str()])
        .await
        .unwrap();
}
