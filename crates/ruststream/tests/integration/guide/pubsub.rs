//! The guide's "Pub/Sub": price updates fanned out to every running instance.

use ruststream::prelude::*;
use ruststream::testing::TestApp;

// ANCHOR: service
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Outgoing)]
#[outgoing(name = "prices")]
struct Price {
    sku: String,
    cents: u64,
}

/// Every instance hears every update (fan-out); one that is down misses it (at most once).
#[subscriber(RedisChannel::new("prices"))]
async fn refresh(price: &Price) -> HandlerOutcome {
    tracing::info!(price.sku, price.cents, "cache refreshed");
    HandlerOutcome::ack()
}

fn app() -> impl App {
    RustStream::new(AppInfo::new("prices", "0.1.0")).with_broker(RedisBroker::from_env(), |b| {
        b.include(refresh);
    })
}
// ANCHOR_END: service

// ANCHOR: test
#[tokio::test(start_paused = true)]
async fn a_price_update_reaches_the_subscriber() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let price = Price {
        sku: "book".into(),
        cents: 1299,
    };
    tb.broker::<RedisBroker>().message(&price).publish().await?;
    tb.broker::<RedisBroker>()
        .subscriber("prices")
        .assert_called_once()
        .with(&price)
        .settled(HandlerOutcome::ack());
    tb.shutdown().await
}
// ANCHOR_END: test
