//! Redis set up to lose keys: at connect the broker warns of a `maxmemory-policy`
//! other than `noeviction` and, when a route asks for durability, of a server without
//! persistence; a server that refuses `CONFIG` gets a warning that it could not be checked, and
//! nothing fails. Logs are captured (`harness::logs`); tests tell their lines apart by the
//! server's address.

use crate::harness;

use std::time::Duration;

use fred::prelude::*;
use harness::stand::{Stand, node_client};
use harness::{cluster_urls, logs, unique};
use ruststream::list;
use ruststream::prelude::*;

fn lines_about(addr: &str) -> Vec<String> {
    logs::text()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(addr))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn an_evicting_server_without_persistence_is_warned_of() {
    logs::captured();
    let stand = Stand::start(
        "stand_server --maxmemory-policy allkeys-lru; export RUSTSTREAM_SETUP_PORT=$STAND_PORT",
    );
    let port = stand.var("RUSTSTREAM_SETUP_PORT");
    let url = format!("redis://127.0.0.1:{port}");
    let broker = RedisBroker::standalone(&url)
        .prefix(format!("{}:", unique("setup")))
        .route(
            "orders",
            list::Publish::new().durable(1, Duration::from_millis(50)),
        );
    broker.connect().await.expect("connect");
    let warned = lines_about(&port).join("\n");
    assert!(
        warned.contains("maxmemory-policy is `allkeys-lru`"),
        "{warned}"
    );
    assert!(
        warned.contains("CONFIG SET maxmemory-policy noeviction"),
        "{warned}"
    );
    assert!(warned.contains("no persistence"), "{warned}");
    assert!(warned.contains("CONFIG SET appendonly yes"), "{warned}");

    // A user without CONFIG (as on managed Redis): said, not failed.
    let admin = node_client(&format!("127.0.0.1:{port}")).await;
    let () = admin
        .custom(
            fred::cmd!("ACL"),
            vec![
                "SETUSER", "app", "reset", "on", ">pw", "~*", "&*", "+@all", "-config",
            ],
        )
        .await
        .expect("ACL SETUSER");
    let limited = RedisBroker::standalone(format!("redis://app:pw@127.0.0.1:{port}"))
        .prefix(format!("{}:", unique("setup")));
    limited
        .connect()
        .await
        .expect("a refused CONFIG does not fail the connect");
    let warned = lines_about(&port).join("\n");
    assert!(
        warned.contains("could not check redis maxmemory-policy"),
        "{warned}"
    );
    drop(stand);
}

#[tokio::test]
async fn on_a_cluster_a_durable_app_is_warned_of_no_persistence_only() {
    logs::captured();
    let Some(urls) = cluster_urls() else { return };
    let first = urls[0].trim_start_matches("redis://").to_owned();
    let plain = RedisBroker::cluster(urls.clone()).prefix(format!("{}:", unique("setup")));
    plain.connect().await.expect("connect");
    let durable = RedisBroker::cluster(urls)
        .prefix(format!("{}:", unique("setup")))
        .route(
            "{orders}",
            list::Publish::new().durable(1, Duration::from_secs(1)),
        );
    durable.connect().await.expect("connect");
    let warned = lines_about(&first).join("\n");
    // The stand's nodes run `noeviction` (Redis's default) without AOF or save points.
    assert!(!warned.contains("maxmemory-policy is"), "{warned}");
    assert_eq!(
        warned.matches("no persistence").count(),
        1,
        "only the durable app is told: {warned}"
    );
}

/// The CLI's `check` connects like a start: it says the same.
#[test]
fn the_check_command_warns_of_an_evicting_server() {
    logs::captured();
    let stand = Stand::start(
        "stand_server --maxmemory-policy volatile-lru; export RUSTSTREAM_SETUP_PORT=$STAND_PORT",
    );
    let port = stand.var("RUSTSTREAM_SETUP_PORT");
    let url = format!("redis://127.0.0.1:{port}");
    let code = ruststream::run_main_from(["svc", "check"], || {
        RustStream::new(AppInfo::new("svc", "0")).with_broker(RedisBroker::standalone(&url), |b| {
            b.include(
                ruststream::subscriber(RedisList::new("jobs"), harness::Seen::<Probe>::acking())
                    .build(),
            );
        })
    });
    assert_eq!(
        format!("{code:?}"),
        format!("{:?}", std::process::ExitCode::SUCCESS)
    );
    let warned = lines_about(&port).join("\n");
    assert!(
        warned.contains("maxmemory-policy is `volatile-lru`"),
        "{warned}"
    );
    drop(stand);
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Probe {
    n: u32,
}

outgoing!(Probe);
