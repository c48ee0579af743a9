//! The guide's "Consumer groups and crash recovery": two services read one stream of orders,
//! each with its own group; a consumer that stops mid-message gets it back when it restarts.

use std::future::Future;
use std::time::Duration;

use ruststream::prelude::*;
use ruststream::testing::TestApp;

// ANCHOR: service
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Outgoing)]
#[outgoing(name = "orders")]
struct OrderPlaced {
    id: u64,
}

/// How long a stopped consumer's entries stay pending before another consumer takes them.
const MIN_IDLE: Duration = Duration::from_secs(30);

#[subscriber(RedisStream::new("orders").group("billing").min_idle(MIN_IDLE))]
async fn bill(order: &OrderPlaced) -> HandlerOutcome {
    tracing::info!(order.id, "invoice sent");
    HandlerOutcome::ack()
}

#[subscriber(RedisStream::new("orders").group("shipping"))]
async fn ship(order: &OrderPlaced) -> HandlerOutcome {
    tracing::info!(order.id, "parcel booked");
    HandlerOutcome::ack()
}

fn app() -> impl App {
    RustStream::new(AppInfo::new("shop", "0.1.0")).with_broker(RedisBroker::from_env(), |b| {
        b.include(bill);
        b.include(ship);
    })
}
// ANCHOR_END: service

// ANCHOR: test
#[tokio::test(start_paused = true)]
async fn every_group_gets_every_order() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let order = OrderPlaced { id: 7 };
    tb.broker::<RedisBroker>().message(&order).publish().await?;
    // Two subscriptions of one key: `orders` (billing) and `orders#2` (shipping), one call each.
    let calls = tb.broker::<RedisBroker>().subscriber("orders");
    calls
        .assert_called(2)
        .with(&order)
        .settled(HandlerOutcome::ack());
    let names: Vec<&str> = calls
        .calls()
        .iter()
        .map(|c| c.subscription.as_str())
        .collect();
    assert_eq!(names, ["orders", "orders#2"]);
    tb.shutdown().await
}
// ANCHOR_END: test

// ANCHOR: crash
/// Bills nothing the first time (it hangs, as a consumer that died mid-message), and bills for
/// real when the entry comes back.
struct HangsOnce;

impl Handle<OrderPlaced> for HangsOnce {
    fn handle(
        &self,
        _order: &OrderPlaced,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        let first = ctx.attempt() == 1;
        async move {
            if first {
                std::future::pending::<()>().await;
            }
            Ok(())
        }
    }
}

/// Billing under a fixed consumer name, as a restarted instance of one deployment has; a handler
/// still running at shutdown is abandoned at once, as a crash leaves it.
fn billing(consumer: &str) -> RustStream {
    let source = RedisStream::new("orders")
        .group("billing")
        .consumer(consumer)
        .min_idle(MIN_IDLE);
    RustStream::new(AppInfo::new("shop", "0.1.0"))
        .with_broker(RedisBroker::from_env(), |b| {
            b.include(subscriber(source, HangsOnce).build());
        })
        .shutdown_timeout(Duration::from_millis(1))
}

/// The order was delivered twice, and billed on its second delivery.
fn billed_on_the_second_attempt(tb: &TestApp, order: &OrderPlaced) {
    let calls = tb.broker::<RedisBroker>().subscriber("orders");
    calls
        .assert_called(2)
        .with(order)
        .settled(HandlerOutcome::ack());
    assert_eq!(calls.last().map(|c| c.attempt), Some(2));
}
// ANCHOR_END: crash

// ANCHOR: sweep
#[tokio::test(start_paused = true)]
async fn a_pending_entry_comes_back() -> ruststream::Result<()> {
    let mut tb = TestApp::start(billing("billing-1")).await?;
    let order = OrderPlaced { id: 8 };
    tb.broker::<RedisBroker>().message(&order).publish().await?;
    tb.broker::<RedisBroker>()
        .subscriber("orders")
        .assert_called_once();
    // Another consumer of the group takes the entry once it has been pending for `min_idle`.
    tb.restart(billing("billing-2")).await?;
    tb.advance(MIN_IDLE * 2).await?;
    billed_on_the_second_attempt(&tb, &order);
    tb.shutdown().await
}
// ANCHOR_END: sweep

// ANCHOR: restart
#[tokio::test(start_paused = true)]
async fn a_restart_under_the_same_name_takes_its_entries_back_at_once() -> ruststream::Result<()> {
    let mut tb = TestApp::start(billing("billing-1")).await?;
    let order = OrderPlaced { id: 9 };
    tb.broker::<RedisBroker>().message(&order).publish().await?;
    // The same consumer name again: its pending entry comes back without waiting for `min_idle`.
    tb.restart(billing("billing-1")).await?;
    tb.advance(Duration::from_secs(1)).await?;
    billed_on_the_second_attempt(&tb, &order);
    tb.shutdown().await
}
// ANCHOR_END: restart
