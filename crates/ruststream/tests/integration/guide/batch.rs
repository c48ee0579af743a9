//! The guide's "Batch handlers": rows stored many at a time, by the macro and by hand.

use std::time::Duration;

use ruststream::Settlement;
use ruststream::prelude::*;
use ruststream::testing::TestApp;

// ANCHOR: service
#[derive(Debug, PartialEq, Deserialize, Serialize, Outgoing)]
struct Row {
    id: u64,
}

/// One outcome per row, in the order given; or return one `HandlerOutcome` (or `()`,
/// `Result<(), E>`) for the whole batch.
#[subscriber(
    RedisList::new("{rows}").reliable().concurrency(200),
    batch = 100,
    max_wait = Duration::from_millis(50)
)]
async fn store(rows: &[Row], ctx: &mut BatchContext<'_>) -> Vec<HandlerOutcome> {
    tracing::info!(rows = rows.len(), first = ?ctx.info(0).map(|i| &i.message_id), "stored");
    rows.iter()
        .map(|row| {
            if row.id == 0 {
                HandlerOutcome::drop()
            } else {
                HandlerOutcome::ack()
            }
        })
        .collect()
}

/// The same by hand: a `HandleBatch`, mounted with `.batch(n)`.
struct Store;

impl HandleBatch<Row> for Store {
    async fn handle_batch(&self, rows: &[Row], _ctx: &mut BatchContext<'_>) -> BatchOutcome {
        tracing::info!(rows = rows.len(), "stored");
        BatchOutcome::ack()
    }
}

fn app() -> impl App {
    RustStream::new(AppInfo::new("rows", "0.1.0")).with_broker(RedisBroker::from_env(), |b| {
        b.include(store);
        b.include(
            subscriber(RedisStream::new("{events}").group("rows"), Store)
                .batch(100)
                .max_wait(Duration::from_millis(50))
                .build(),
        );
    })
}
// ANCHOR_END: service

// ANCHOR: test
#[tokio::test(start_paused = true)]
async fn each_row_is_settled_on_its_own() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let rows = [Row { id: 1 }, Row { id: 0 }, Row { id: 2 }];
    tb.broker::<RedisBroker>()
        .messages(&rows)
        .to("{rows}")
        .publish()
        .await?;
    // The batch closes `max_wait` after its first row.
    tb.advance(Duration::from_millis(60)).await?;
    let calls = tb.broker::<RedisBroker>().subscriber("{rows}");
    calls.assert_called(3);
    let settled: Vec<_> = calls.calls().iter().map(|c| c.settlement.clone()).collect();
    let dropped = Settlement::Dead {
        reason: "dropped".into(),
    };
    assert_eq!(
        settled,
        [Some(Settlement::Ack), Some(dropped), Some(Settlement::Ack)]
    );
    tb.shutdown().await
}
// ANCHOR_END: test
