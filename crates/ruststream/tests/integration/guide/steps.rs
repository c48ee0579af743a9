//! The guide's "Steps, sleeps and signals": a checkout of durable steps (charge, reserve, a
//! wait for the payment provider's webhook, an hour's sleep, email), on TestApp's virtual clock.

use std::sync::Mutex;
use std::time::Duration;

use ruststream::prelude::*;
use ruststream::steps::Signalled;
use ruststream::testing::TestApp;

// ANCHOR: service
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Outgoing)]
struct Order {
    id: String,
    cents: u64,
}

/// Stands for the payment provider: it records each charge with its idempotency key.
static CHARGES: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The payment provider's webhook, sent to the order as the signal `paid`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
struct Paid {
    receipt: String,
}

/// Stands for the mail service.
static EMAILS: Mutex<Vec<String>> = Mutex::new(Vec::new());

async fn charge(idempotency_key: &str, cents: u64) -> Result<u64, String> {
    CHARGES
        .lock()
        .map_err(|e| e.to_string())?
        .push(idempotency_key.to_owned());
    Ok(cents)
}

async fn email(order: &str, receipt: &str) -> Result<(), String> {
    let mut sent = EMAILS.lock().map_err(|e| e.to_string())?;
    sent.push(format!("{order}: {receipt}"));
    Ok(())
}

const DAY: Duration = Duration::from_secs(24 * 3600);
const HOUR: Duration = Duration::from_secs(3600);

/// Charge, reserve, wait for the payment's webhook (a day at most), then email an hour later. A retry or a crash
/// redelivery replays the steps already recorded; the wait and the sleep hold no worker.
#[subscriber(RedisList::new("{orders}").reliable())]
async fn checkout(order: &Order, ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
    let key = ctx.step_key("charge");
    ctx.step("charge", || charge(&key, order.cents)).await?;
    ctx.step("reserve", || async { Ok::<_, String>(order.cents > 0) })
        .await?;
    let Ok(paid) = ctx.wait_for::<Paid>("paid", DAY).await? else {
        // No webhook within a day: the order goes to the dead letters for a person to look at.
        return Err(HandlerOutcome::drop());
    };
    ctx.sleep(HOUR).await?;
    ctx.step("email", || email(&order.id, &paid.receipt))
        .await?;
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
async fn a_checkout_waits_for_its_webhook_and_charges_once() -> ruststream::Result<()> {
    let tb = TestApp::start(app()).await?;
    let order = Order {
        id: "o-1".into(),
        cents: 1250,
    };
    let b = tb.broker::<RedisBroker>();
    b.message(&order).to("{orders}").id("o-1").publish().await?;
    tb.advance(Duration::from_secs(60)).await?;
    assert_eq!(*CHARGES.lock().unwrap(), ["o-1:charge"], "charged at once");
    // The provider's webhook arrives: the parked order comes back.
    let paid = Paid {
        receipt: "r-42".into(),
    };
    let sent = b.signal("{orders}", "o-1", "paid", &paid).await?;
    assert_eq!(sent, Signalled::Woken);
    tb.advance(Duration::from_secs(60)).await?;
    assert!(EMAILS.lock().unwrap().is_empty(), "asleep for an hour");
    tb.advance(HOUR).await?;
    assert_eq!(
        *CHARGES.lock().unwrap(),
        ["o-1:charge"],
        "replayed, not charged again"
    );
    assert_eq!(*EMAILS.lock().unwrap(), ["o-1: r-42"]);
    b.subscriber("{orders}").assert_called(3);
    tb.shutdown().await
}
// ANCHOR_END: test

/// The pages an import read, in order; the import fails once, at page 2, the first time.
static PAGES: Mutex<Vec<u32>> = Mutex::new(Vec::new());

async fn import(page: u32) -> Result<(), String> {
    let mut pages = PAGES.lock().map_err(|e| e.to_string())?;
    if page == 2 && !pages.contains(&99) {
        pages.push(99);
        return Err("the source timed out".into());
    }
    pages.push(page);
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Outgoing)]
struct Import {
    pages: u32,
}

#[subscriber(RedisList::new("{imports}").reliable().retry(Backoff::fixed(Duration::from_secs(1))))]
async fn import_file(file: &Import, ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
    let pages = file.pages;
    // ANCHOR: checkpoint
    let from: u32 = ctx.resume_from().await?.unwrap_or(0);
    for page in from..pages {
        import(page).await.map_err(|_| HandlerOutcome::retry())?;
        ctx.checkpoint(&(page + 1)).await?;
        if ctx.is_stopping() {
            // The app stops: back to the queue now, to go on at the next page.
            return Err(HandlerOutcome::retry());
        }
    }
    // ANCHOR_END: checkpoint
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_import_resumes_at_its_last_checkpoint() -> ruststream::Result<()> {
    let app = RustStream::new(AppInfo::new("imports", "0.1.0")).with_broker(
        RedisBroker::from_env(),
        |b| {
            b.include(import_file);
        },
    );
    let tb = TestApp::start(app).await?;
    let b = tb.broker::<RedisBroker>();
    b.message(&Import { pages: 4 })
        .to("{imports}")
        .id("file-1")
        .publish()
        .await?;
    tb.advance(Duration::from_secs(5)).await?;
    assert_eq!(
        *PAGES.lock().unwrap(),
        [0, 1, 99, 2, 3],
        "pages 0 and 1 once"
    );
    tb.shutdown().await
}
