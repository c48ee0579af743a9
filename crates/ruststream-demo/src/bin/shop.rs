//! A small web shop's back office on `REDIS_URL`, with its dashboard: what `scripts/screenshots`
//! runs to take the guide's pictures of the dashboard.
//!
//! Orders are charged (a reliable list: some fail and are retried, a few are declined for good
//! and dead-lettered), confirmation emails are sent (a stream), thumbnails are rendered per
//! tenant (a list with fair groups), invoices go out later (delayed), and a nightly report is
//! a periodic job. It publishes a mixed load for `--minutes` (default 1), keeps the history every
//! 5 s, then keeps serving the dashboard on `--addr` (default 127.0.0.1:8090) until stopped.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use ruststream::IntoHandlerResult;
use ruststream::dashboard::Dashboard;
use ruststream::periodic::Tz;
use ruststream::prelude::*;

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
struct ChargeOrder {
    order: String,
    customer: String,
    cents: u64,
}
outgoing!(ChargeOrder);

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
struct SendEmail {
    to: String,
    template: String,
}
outgoing!(SendEmail);

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
struct RenderThumbnail {
    image: String,
    width: u32,
}
outgoing!(RenderThumbnail);

/// Waits a while, as a handler doing real work would.
async fn work(min_ms: u64, max_ms: u64) {
    tokio::time::sleep(Duration::from_millis(fastrand::u64(min_ms..=max_ms))).await;
}

struct Payments;

impl Handle<ChargeOrder> for Payments {
    fn handle(
        &self,
        order: &ChargeOrder,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        let declined = order.cents.is_multiple_of(97);
        let flaky = ctx.attempt() == 1 && fastrand::u8(0..100) < 8;
        async move {
            work(5, 60).await;
            if declined {
                // An error's text is the retry's reason in the job's history; after its third
                // attempt the order is dead-lettered (`max-attempts`).
                let declined = Err::<(), _>(format!("card declined: {} cents", order.cents));
                return declined.into_handler_result();
            }
            if flaky {
                return Err(HandlerOutcome::retry());
            }
            Ok(())
        }
    }
}

struct Mailer;

impl Handle<SendEmail> for Mailer {
    async fn handle(
        &self,
        _email: &SendEmail,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        work(20, 180).await;
        Ok(())
    }
}

struct Thumbnails;

impl Handle<RenderThumbnail> for Thumbnails {
    async fn handle(
        &self,
        _job: &RenderThumbnail,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        work(30, 250).await;
        Ok(())
    }
}

const CUSTOMERS: [&str; 6] = ["ada", "grace", "linus", "margaret", "ken", "barbara"];
const TENANTS: [&str; 4] = ["acme", "globex", "initech", "umbrella"];

fn arg(name: &str) -> Option<String> {
    let mut args = std::env::args().skip_while(|a| a != name);
    args.next()?;
    args.next()
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shop: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> ruststream::Result<()> {
    let minutes: f64 = arg("--minutes").and_then(|m| m.parse().ok()).unwrap_or(1.0);
    let addr = arg("--addr").unwrap_or_else(|| "127.0.0.1:8090".to_owned());
    let addr: std::net::SocketAddr = addr.parse().map_err(|e: std::net::AddrParseError| {
        ruststream::ConfigError::new(
            "--addr",
            e.to_string(),
            "give an address such as 127.0.0.1:8090",
        )
        .on(&addr)
    })?;
    let broker = RedisBroker::from_env()
        .prefix("shop:")
        .history_interval(Duration::from_secs(5));
    let publisher = broker.publisher();
    let report = publisher
        .every("0 0 2 * * *")
        .name("nightly-sales-report")
        .tz(Tz::UTC)
        .to("reports")
        .message(|| br#"{"report":"sales"}"#.to_vec());
    let app = RustStream::new(AppInfo::new("shop-backoffice", "1.4.0")).with_broker(broker, |b| {
        b.include(
            subscriber(
                RedisList::new("{payments}")
                    .reliable()
                    .concurrency(8)
                    .max_attempts(3)
                    .retry(Backoff::exponential(Duration::from_secs(2))),
                Payments,
            )
            .build(),
        );
        b.include(
            subscriber(
                RedisStream::new("emails").group("mailers").concurrency(8),
                Mailer,
            )
            .build(),
        );
        b.include(
            subscriber(
                RedisList::new("{thumbnails}")
                    .reliable()
                    .groups()
                    .concurrency(4),
                Thumbnails,
            )
            .build(),
        );
        b.periodic(report);
    });
    let dashboard = Dashboard::bind(&app, addr, None).await?;
    let running = app.start().await?;
    dashboard.spawn_beside(&running);
    println!("shop: dashboard on http://{addr}/");

    let until = tokio::time::Instant::now() + Duration::from_secs_f64(minutes * 60.0);
    let mut n: u64 = 10_000;
    while tokio::time::Instant::now() < until {
        n += 1;
        let customer = CUSTOMERS[fastrand::usize(..CUSTOMERS.len())];
        let order = ChargeOrder {
            order: format!("order-{n}"),
            customer: customer.to_owned(),
            cents: if n == 10_042 {
                97 * 100
            } else {
                fastrand::u64(500..20_000)
            },
        };
        publisher
            .message(&order)
            .to("{payments}")
            .id(format!("order-{n}"))
            .header("customer", customer)
            .publish()
            .await?;
        if n.is_multiple_of(2) {
            let email = SendEmail {
                to: format!("{customer}@example.com"),
                template: "order-confirmation".into(),
            };
            publisher.message(&email).to("emails").publish().await?;
        }
        if n.is_multiple_of(3) {
            let tenant = TENANTS[fastrand::usize(..TENANTS.len())];
            let thumb = RenderThumbnail {
                image: format!("{tenant}/products/{n}.jpg"),
                width: 320,
            };
            publisher
                .message(&thumb)
                .to("{thumbnails}")
                .group(tenant)
                .publish()
                .await?;
        }
        if n.is_multiple_of(10) {
            let preorder = ChargeOrder {
                order: format!("preorder-{n}"),
                customer: customer.to_owned(),
                cents: 4_900,
            };
            publisher
                .message(&preorder)
                .to("{payments}")
                .id(format!("preorder-{n}"))
                .delay(Duration::from_secs(3600))
                .publish()
                .await?;
        }
        // A busier stretch now and then, so the charts have a shape.
        let pause = if (n / 200).is_multiple_of(3) { 15 } else { 60 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    println!("shop: load done; serving the dashboard until stopped");
    running.wait().await
}
