//! `examples/payments.rs`: the hours on TestApp's virtual clock, and a short-delay
//! version of the same service on a real Redis.

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/payments.rs"]
mod payments;

use crate::harness;

use std::time::Duration;

use harness::{Env, on, wait_until};
use payments::{
    CHECKS, CREATED, CheckPayment, NOTIFICATIONS, Notification, PaymentCreated, Timing,
};
use ruststream::Settlement;
use ruststream::prelude::*;
use ruststream::testing::TestApp;

const MIN: Duration = Duration::from_secs(60);

on!([standalone] the_short_version_runs_on_redis);

fn created(id: &str, user: &str) -> PaymentCreated {
    PaymentCreated {
        id: id.into(),
        user: user.into(),
    }
}

async fn start() -> ruststream::Result<TestApp> {
    TestApp::start(payments::service(
        RedisBroker::standalone("redis://localhost:6379"),
        Timing::PRODUCTION,
    ))
    .await
}

#[tokio::test(start_paused = true)]
async fn a_payment_is_checked_three_hours_after_it_is_created() -> ruststream::Result<()> {
    let tb = start().await?;
    let b = tb.broker::<RedisBroker>();
    b.message(&created("p-1", "ann"))
        .to(CREATED)
        .publish()
        .await?;
    tb.advance(3 * 60 * MIN - MIN).await?;
    b.subscriber(CREATED)
        .assert_called_once()
        .settled(HandlerOutcome::ack());
    b.subscriber(CHECKS).assert_not_called();
    tb.advance(2 * MIN).await?;
    b.subscriber(CHECKS)
        .assert_called_once()
        .with(&CheckPayment {
            id: "p-1".into(),
            user: "ann".into(),
        })
        .settled(HandlerOutcome::ack());
    b.subscriber(NOTIFICATIONS)
        .assert_called_once()
        .with(&Notification {
            user: "ann".into(),
            text: "payment p-1 is settled".into(),
        })
        .settled(HandlerOutcome::ack());
    let checks = b.subscriber(CHECKS);
    let check = &checks.calls()[0];
    assert_eq!(
        check.headers.get("payment").map(String::as_str),
        Some("p-1"),
        "the event context"
    );
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn an_announcement_delivered_twice_schedules_one_check() -> ruststream::Result<()> {
    let tb = start().await?;
    let b = tb.broker::<RedisBroker>();
    b.message(&created("p-2", "bob"))
        .to(CREATED)
        .publish()
        .await?;
    b.message(&created("p-2", "bob"))
        .to(CREATED)
        .publish()
        .await?;
    tb.advance(3 * 60 * MIN + MIN).await?;
    b.subscriber(CREATED).assert_called(2);
    b.subscriber(CHECKS).assert_called_once();
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn a_pending_payment_is_checked_again_at_growing_intervals() -> ruststream::Result<()> {
    let tb = start().await?;
    let b = tb.broker::<RedisBroker>();
    b.message(&created("slow-1", "cy"))
        .to(CREATED)
        .publish()
        .await?;
    // Checks at 3h, 3h10 (10 min later), 3h30 (20 min later): the third finds it settled.
    tb.advance(3 * 60 * MIN + MIN).await?;
    b.subscriber(CHECKS)
        .assert_called_once()
        .settled(HandlerOutcome::retry());
    tb.advance(8 * MIN).await?;
    b.subscriber(CHECKS).assert_called(1);
    tb.advance(2 * MIN).await?;
    b.subscriber(CHECKS)
        .assert_called(2)
        .settled(HandlerOutcome::retry());
    tb.advance(18 * MIN).await?;
    b.subscriber(CHECKS).assert_called(2);
    tb.advance(2 * MIN).await?;
    b.subscriber(CHECKS)
        .assert_called(3)
        .settled(HandlerOutcome::ack());
    let attempts: Vec<u32> = b
        .subscriber(CHECKS)
        .calls()
        .iter()
        .map(|c| c.attempt)
        .collect();
    assert_eq!(attempts, vec![1, 2, 3]);
    b.subscriber(NOTIFICATIONS).assert_called_once();
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn a_payment_that_never_settles_stops_after_five_checks() -> ruststream::Result<()> {
    let tb = start().await?;
    let b = tb.broker::<RedisBroker>();
    b.message(&created("never-1", "dan"))
        .to(CREATED)
        .publish()
        .await?;
    // 3h, then 10, 20, 40 and 80 minutes later: the fifth check is the last.
    tb.advance(3 * 60 * MIN + 149 * MIN).await?;
    b.subscriber(CHECKS).assert_called(4);
    tb.advance(2 * MIN).await?;
    b.subscriber(CHECKS)
        .assert_called(5)
        .settled(Settlement::Dead {
            reason: "max-attempts".into(),
        });
    tb.advance(3 * 60 * MIN).await?;
    b.subscriber(CHECKS).assert_called(5);
    b.subscriber(NOTIFICATIONS).assert_not_called();
    tb.shutdown().await
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_user_is_notified_again_45_minutes_later() -> ruststream::Result<()> {
    let tb = start().await?;
    let b = tb.broker::<RedisBroker>();
    b.message(&created("p-3", "offline"))
        .to(CREATED)
        .publish()
        .await?;
    tb.advance(3 * 60 * MIN + MIN).await?;
    b.subscriber(NOTIFICATIONS)
        .assert_called_once()
        .settled(HandlerOutcome::retry_after(45 * MIN));
    tb.advance(43 * MIN).await?;
    b.subscriber(NOTIFICATIONS).assert_called(1);
    tb.advance(2 * MIN).await?;
    b.subscriber(NOTIFICATIONS)
        .assert_called(2)
        .settled(HandlerOutcome::ack());
    tb.shutdown().await
}

/// The same service on a real Redis, with milliseconds for hours.
async fn the_short_version_runs_on_redis(env: &Env) {
    let timing = Timing {
        check_after: Duration::from_millis(300),
        recheck_after: Duration::from_millis(100),
        max_checks: 3,
        resend_after: Duration::from_millis(200),
    };
    let running = env.start(payments::service(env.broker(), timing)).await;
    let started = std::time::Instant::now();
    let publisher = env.broker().publisher();
    let payments = [
        created("p-9", "eve"),
        created("slow-9", "offline"),
        created("never-9", "fay"),
    ];
    publisher
        .messages(&payments)
        .to(CREATED)
        .publish()
        .await
        .unwrap();
    let dead = format!("{CHECKS}.dead");
    wait_until(
        "the never-settling payment is dead-lettered",
        Duration::from_secs(10),
        async || env.llen(&dead).await == 1,
    )
    .await;
    // 300 ms, then retries after 100 and 200 ms: not before 600 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
    wait_until("every queue drained", Duration::from_secs(10), async || {
        let mut left = 0;
        for key in [CREATED, CHECKS, NOTIFICATIONS] {
            left += env.llen(key).await + env.llen(&format!("{key}.processing")).await;
            left += env.zcard(&format!("{key}.delayed")).await;
        }
        left == 0
    })
    .await;
    env.stop(running).await;
    let frames = env.frames(&dead).await;
    assert_eq!(
        frames[0].headers.get("reason").map(String::as_str),
        Some("max-attempts")
    );
    assert_eq!(frames[0].attempt, 3);
    assert_eq!(env.llen(&format!("{NOTIFICATIONS}.dead")).await, 0);
}
