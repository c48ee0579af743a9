//! The guide's "Fair groups": an import service shared by tenants.

use std::time::Duration;

use ruststream::prelude::*;
use ruststream::testing::TestApp;

// ANCHOR: handler
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Outgoing)]
struct Import {
    row: u32,
}

/// Imports rows, one at a time here; each tenant's rows wait in a group of their own, and the
/// reader takes round robin over the tenants with rows waiting.
#[subscriber(
    RedisList::new("{imports}")
        .reliable()
        .groups()
        .concurrency(1)
)]
async fn import(_row: &Import) -> HandlerOutcome {
    tokio::time::sleep(Duration::from_millis(100)).await;
    HandlerOutcome::ack()
}

fn app() -> impl App {
    RustStream::new(AppInfo::new("imports", "0.1.0")).with_broker(RedisBroker::from_env(), |b| {
        b.include(import);
    })
}
// ANCHOR_END: handler

// ANCHOR: test
#[tokio::test(start_paused = true)]
async fn a_small_tenant_is_not_stuck_behind_a_big_import() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let b = tb.broker::<RedisBroker>();

    // A big tenant queues 1,000 rows, then a small one queues one (the broker's publisher:
    // it does not wait for the handlers, as `b.message(..)` does).
    let publisher = b.broker().publisher();
    let rows: Vec<Import> = (0..1000).map(|row| Import { row }).collect();
    publisher
        .messages(&rows)
        .to("{imports}")
        .group("big")
        .publish()
        .await?;
    publisher
        .message(&Import { row: 0 })
        .to("{imports}")
        .group("small")
        .publish()
        .await?;

    // A tenth of a second a row: the small tenant's row joins the round robin behind the big
    // tenant's next turn, so it is among the first three handled, not the 1,001st.
    tb.advance(Duration::from_millis(350)).await?;
    let calls = b.subscriber("{imports}");
    let groups: Vec<&str> = calls
        .ran()
        .map(|c| c.headers.get("rs.group").map_or("", String::as_str))
        .collect();
    assert!(groups.len() <= 4 && groups.contains(&"small"), "{groups:?}");
    tb.shutdown().await
}
// ANCHOR_END: test
