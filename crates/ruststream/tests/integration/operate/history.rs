//! The subscriptions' history: every worker adds its counts once per interval with one script
//! call, the operator reads them back by the minute, and every key it writes expires.

use std::time::Duration;

use ruststream::prelude::*;
use ruststream::redis::history::Span;

use crate::harness;
use harness::{Env, WAIT, on, wait_until};

use super::{Poisonable, job, operator_of};

on!(
    [standalone, cluster]
    two_workers_write_one_history_that_expires,
);

fn now_ms() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970");
    i64::try_from(d.as_millis()).expect("ms fit")
}

async fn two_workers_write_one_history_that_expires(env: &Env) {
    let handler = Poisonable::default();
    handler
        .broken
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let app = || {
        let h = handler.clone();
        let broker = env.broker_with(|b| b.history_interval(Duration::from_millis(200)));
        RustStream::new(AppInfo::new("history", "1.0.0"))
            .shutdown_timeout(Duration::from_secs(1))
            .with_broker(broker, move |b| {
                b.include(
                    subscriber(
                        RedisList::new("{hist}")
                            .reliable()
                            .max_attempts(1)
                            .block(Duration::from_millis(200)),
                        h,
                    )
                    .build(),
                );
            })
    };
    let op = operator_of(&app()).await;
    let first = env.start(app()).await;
    let second = env.start(app()).await;
    let publisher = env.broker().publisher();
    for n in 0..30 {
        publisher
            .message(&job(n, n % 3 == 0))
            .to("{hist}")
            .publish()
            .await
            .expect("publish");
    }
    wait_until("both workers wrote all 30", WAIT, async || {
        let points = op
            .history("{hist}", Span::Hour, now_ms())
            .await
            .expect("history");
        let handled: u64 = points.iter().map(|p| p.counts.handled).sum();
        handled == 30
    })
    .await;
    let points = op
        .history("{hist}", Span::Hour, now_ms())
        .await
        .expect("history");
    assert_eq!(points.len(), 60, "one point a minute");
    let sum = |f: fn(&ruststream::redis::history::Point) -> u64| points.iter().map(f).sum::<u64>();
    assert_eq!(sum(|p| p.counts.dead), 10, "every third was poisoned");
    assert_eq!(sum(|p| p.counts.failed), 10);
    let busy = points
        .iter()
        .rev()
        .find(|p| p.counts.handled > 0)
        .expect("a busy minute");
    assert!(
        busy.counts.percentile_ms(0.99).is_some(),
        "handler times kept"
    );
    assert!(
        points.iter().any(|p| p.waiting.is_some()),
        "the depth is sampled"
    );
    let day = op
        .history("{hist}", Span::Day, now_ms())
        .await
        .expect("a day");
    assert_eq!(day.iter().map(|p| p.counts.handled).sum::<u64>(), 30);
    let month = op
        .history("{hist}", Span::Month, now_ms())
        .await
        .expect("a month");
    assert_eq!(month.iter().map(|p| p.counts.handled).sum::<u64>(), 30);

    let keys = env.keys_matching(&env.key("*history*")).await;
    assert!(!keys.is_empty(), "history keys");
    for key in keys {
        let ttl = env.pttl(&key[env.key("").len()..]).await;
        assert!(ttl > 0 && ttl <= 31 * 86_400_000, "{key} expires: {ttl}");
    }
    env.stop(first).await;
    env.stop(second).await;
}
