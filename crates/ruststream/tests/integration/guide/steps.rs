//! The guide's "Steps, sleeps and signals": a checkout of durable steps (charge, reserve, an
//! hour's sleep, email), on TestApp's virtual clock.

use std::sync::Mutex;
use std::time::Duration;

use ruststream::prelude::*;
use ruststream::testing::TestApp;

// ANCHOR: service
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Outgoing)]
struct Order {
    id: String,
    cents: u64,
}

/// Stands for the payment provider: it records each charge with its idempotency key.
static CHARGES: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Stands for the mail service.
static EMAILS: Mutex<Vec<String>> = Mutex::new(Vec::new());

async fn charge(idempotency_key: &str, cents: u64) -> Result<String, String> {
    CHARGES
        .lock()
        .map_err(|e| e.to_string())?
        .push(idempotency_key.to_owned());
    Ok(format!("receipt {idempotency_key} for {cents} cents"))
}

async fn email(order: &str, receipt: &str) -> Result<(), String> {
    let mut sent = EMAILS.lock().map_err(|e| e.to_string())?;
    sent.push(format!("{order}: {receipt}"));
    Ok(())
}

/// Charge, reserve, wait an hour, then email. A retry or a crash redelivery replays the steps
/// already recorded; the sleep holds no worker.
#[subscriber(RedisList::new("{orders}").reliable())]
async fn checkout(order: &Order, ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
    let key = ctx.step_key("charge");
    let receipt: String = ctx.step("charge", || charge(&key, order.cents)).await?;
    ctx.step("reserve", || async { Ok::<_, String>(order.cents > 0) })
        .await?;
    ctx.sleep(Duration::from_secs(3600)).await?;
    ctx.step("email", || email(&order.id, &receipt)).await?;
    Ok(())
}

fn app() -> impl App {
    RustStream::new(AppInfo::new("shop", "0.1.0")).with_broker(RedisBroker::from_env(), |b| {
        b.include(checkout);
    })
}
// ANCHOR_END: service

// ANCHOR: test
#[tokio::test(start_paused = true)]
async fn a_checkout_sleeps_an_hour_and_charges_once() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let order = Order {
        id: "o-1".into(),
        cents: 1250,
    };
    let b = tb.broker::<RedisBroker>();
    b.message(&order).to("{orders}").id("o-1").publish().await?;
    tb.advance(Duration::from_secs(60)).await?;
    assert_eq!(*CHARGES.lock().unwrap(), ["o-1:charge"], "charged at once");
    assert!(EMAILS.lock().unwrap().is_empty(), "asleep for an hour");
    tb.advance(Duration::from_secs(3600)).await?;
    assert_eq!(
        *CHARGES.lock().unwrap(),
        ["o-1:charge"],
        "replayed, not charged again"
    );
    assert_eq!(
        *EMAILS.lock().unwrap(),
        ["o-1: receipt o-1:charge for 1250 cents"]
    );
    let calls = tb.broker::<RedisBroker>().subscriber("{orders}");
    calls.assert_called(2);
    tb.shutdown().await
}
// ANCHOR_END: test
