//! The guide's "Partitions and the cluster": one queue over four keys in different hash slots.

use std::collections::BTreeSet;

use ruststream::prelude::*;
use ruststream::testing::TestApp;

// ANCHOR: service
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Outgoing)]
struct Invoice {
    customer: String,
    n: u32,
}

/// `{invoices:0}` .. `{invoices:3}`: four lists a cluster spreads over its nodes, read at once.
#[subscriber(RedisList::new("invoices").reliable().partitions(4))]
async fn issue(invoice: &Invoice) -> HandlerOutcome {
    tracing::info!(invoice.customer, invoice.n, "invoice issued");
    HandlerOutcome::ack()
}

fn app() -> impl App {
    RustStream::new(AppInfo::new("invoices", "0.1.0")).with_broker(RedisBroker::from_env(), |b| {
        b.include(issue);
    })
}
// ANCHOR_END: service

// ANCHOR: test
#[tokio::test(start_paused = true)]
async fn one_customer_stays_on_one_partition() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let b = tb.broker::<RedisBroker>();
    for n in 0..6 {
        let invoice = Invoice {
            customer: "acme".into(),
            n,
        };
        // Messages with one partition key share a partition, so they stay in order.
        b.message(&invoice)
            .to("invoices")
            .partition_key("acme")
            .publish()
            .await?;
    }
    let calls = b.subscriber("invoices");
    calls.assert_called(6);
    let partitions: BTreeSet<&str> = calls.calls().iter().map(|c| c.source.as_str()).collect();
    assert_eq!(partitions.len(), 1, "one partition: {partitions:?}");
    let keys = RedisList::new("invoices").partitions(4).partition_keys();
    assert!(partitions.iter().all(|p| keys.iter().any(|k| k == p)));
    tb.shutdown().await
}
// ANCHOR_END: test
