//! Delayed delivery and retries at growing intervals on a real Redis. Each test runs on the
//! standalone server and on the cluster (`name::standalone`, `name::cluster`, see `harness`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use ruststream::prelude::*;

use crate::harness;
use harness::{Env, on, start, stop, wait_until};

on!(
    [standalone, cluster]
    an_idle_consumer_is_woken_for_a_delayed_publish,
    competing_movers_deliver_each_entry_once_and_never_early,
    retries_follow_the_backoff_then_land_in_dead_letters,
    streams_get_delayed_publishes_and_delayed_retries,
    a_pure_handler_node_does_not_schedule,
    stop_subscription_stops_one_and_the_others_go_on,
    entries_due_a_millisecond_apart_each_arrive_once_and_never_early
);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A payment to check once it is due: `due_ms` is when it was meant to arrive.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Check {
    n: u32,
    due_ms: u64,
}
outgoing!(Check);

/// `(n, attempt, arrival ms, due ms)` of one delivery.
type Arrival = (u32, u32, u64, u64);

/// The harness's recorder: `Record::default()` acknowledges.
type Record = harness::Seen<Check>;

impl Record {
    /// Fails every attempt.
    fn failing() -> Self {
        Self::new(|_, _| Err(HandlerOutcome::retry()))
    }

    /// `(n, attempt, arrival ms, due ms)` of every delivery.
    fn arrivals(&self) -> Vec<Arrival> {
        let seen = self.seen();
        seen.iter()
            .map(|d| (d.n, d.attempt, d.wall_ms, d.due_ms))
            .collect()
    }
}

fn app(
    broker: RedisBroker,
    source: impl ruststream::Source<Broker = RedisBroker>,
    h: Record,
) -> RustStream {
    RustStream::new(AppInfo::new("delayed", "0"))
        .shutdown_timeout(Duration::from_millis(200))
        .with_broker(broker, |b| {
            b.include(subscriber(source, h).build());
        })
}

/// A publisher on a broker of its own, as another service would have.
async fn publisher(env: &Env) -> Publisher {
    let b = env.broker_with(|b| b);
    b.connect().await.unwrap();
    b.publisher()
}

async fn an_idle_consumer_is_woken_for_a_delayed_publish(env: &Env) {
    let h = Record::default();
    // A 5 s block: without the wake-up the entry would wait for the next poll.
    let source = RedisList::new("{pay}")
        .reliable()
        .block(Duration::from_secs(5));
    let running = start(app(env.broker_with(|b| b), source, h.clone())).await;
    let publisher = publisher(env).await;
    let due = now_ms() + 300;
    publisher
        .message(&Check { n: 1, due_ms: due })
        .to("{pay}")
        .delay(Duration::from_millis(300))
        .publish()
        .await
        .unwrap();
    wait_until("delivered", Duration::from_secs(5), || async {
        !h.arrivals().is_empty()
    })
    .await;
    stop(running).await;
    let (_, attempt, at, due) = h.arrivals()[0];
    assert_eq!(attempt, 1);
    assert!(
        at + 5 >= due,
        "delivered {}ms before its due time",
        due - at
    );
    assert!(
        at < due + 500,
        "delivered {}ms late: the reader slept through it",
        at - due
    );
}

async fn competing_movers_deliver_each_entry_once_and_never_early(env: &Env) {
    const N: u32 = 400;
    let p = &env.prefix;
    let handlers: Vec<Record> = (0..3).map(|_| Record::default()).collect();
    let mut apps = Vec::new();
    for h in &handlers {
        let source = RedisList::new("{pay}")
            .reliable()
            .block(Duration::from_millis(500));
        apps.push(start(app(env.broker_with(|b| b), source, h.clone())).await);
    }
    let publisher = publisher(env).await;
    let base = now_ms();
    let checks: Vec<Check> = (0..N)
        .map(|n| Check {
            n,
            due_ms: base + 200 + u64::from(n % 4) * 100,
        })
        .collect();
    for c in &checks {
        publisher
            .message(c)
            .to("{pay}")
            .delay(Duration::from_millis(c.due_ms - base))
            .publish()
            .await
            .unwrap();
    }
    let total = || handlers.iter().map(|h| h.arrivals().len()).sum::<usize>();
    wait_until("all delivered", Duration::from_secs(10), || async {
        total() >= N as usize
    })
    .await;
    let r = &env.client;
    wait_until("delayed set empty", Duration::from_secs(5), || async {
        let z: i64 = r.zcard(format!("{p}{{pay}}.delayed")).await.unwrap();
        let h: i64 = r
            .hlen(format!("{p}{{pay}}.delayed.payloads"))
            .await
            .unwrap();
        z == 0 && h == 0
    })
    .await;
    for a in apps {
        stop(a).await;
    }
    let mut count: HashMap<u32, usize> = HashMap::new();
    for h in &handlers {
        for (n, _, at, due) in h.arrivals() {
            // Publishing the 400 took time, so each delay was counted from its own publish:
            // nothing may arrive before the due time it was given (publish time + delay).
            assert!(at + 5 >= due, "entry {n} early");
            *count.entry(n).or_default() += 1;
        }
    }
    assert_eq!(count.len(), N as usize, "lost entries");
    assert!(
        count.values().all(|&c| c == 1),
        "an entry was delivered twice"
    );
}

/// Entries due one millisecond apart, published latest first (so each is a new earliest and
/// wakes the reader): each arrives once, none before it is due, now that the reader waits for
/// each next due entry to the millisecond and so moves them in many small calls. (Not in due
/// order: each call pushes its entries onto the consuming end, ahead of those an earlier call
/// moved and the handler has not taken yet.)
async fn entries_due_a_millisecond_apart_each_arrive_once_and_never_early(env: &Env) {
    const N: u32 = 20;
    let h = Record::default();
    let source = RedisList::new("{pay}").reliable().concurrency(1);
    let running = start(app(env.broker_with(|b| b), source, h.clone())).await;
    let publisher = publisher(env).await;
    let base = now_ms() + 200;
    for n in (0..N).rev() {
        let due_ms = base + u64::from(n);
        publisher
            .message(&Check { n, due_ms })
            .to("{pay}")
            .at(UNIX_EPOCH + Duration::from_millis(due_ms))
            .publish()
            .await
            .unwrap();
    }
    wait_until("all delivered", Duration::from_secs(5), || async {
        h.arrivals().len() >= N as usize
    })
    .await;
    stop(running).await;
    let arrivals = h.arrivals();
    let mut order: Vec<u32> = arrivals.iter().map(|a| a.0).collect();
    order.sort_unstable();
    assert_eq!(order, (0..N).collect::<Vec<_>>(), "each once");
    for (n, _, at, due) in arrivals {
        assert!(at + 1 >= due, "entry {n} arrived {}ms early", due - at);
    }
}

async fn retries_follow_the_backoff_then_land_in_dead_letters(env: &Env) {
    let p = &env.prefix;
    let h = Record::failing();
    let source = RedisList::new("{pay}")
        .reliable()
        .retry(Backoff::exponential(Duration::from_millis(150)).jitter(0.0))
        .max_attempts(4);
    let running = start(app(env.broker_with(|b| b), source, h.clone())).await;
    publisher(env)
        .await
        .message(&Check { n: 9, due_ms: 0 })
        .to("{pay}")
        .publish()
        .await
        .unwrap();
    let r = &env.client;
    let dead = format!("{p}{{pay}}.dead");
    wait_until("dead-lettered", Duration::from_secs(10), || async {
        let n: i64 = r.llen(&dead).await.unwrap();
        n == 1
    })
    .await;
    stop(running).await;
    let seen = h.arrivals();
    assert_eq!(
        seen.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    let gaps: Vec<u64> = seen.windows(2).map(|w| w[1].2 - w[0].2).collect();
    for (gap, expected) in gaps.iter().zip([150u64, 300, 600]) {
        assert!(
            *gap + 10 >= expected,
            "retry came after {gap} ms, backoff says {expected}"
        );
        assert!(
            *gap < expected + 600,
            "retry came after {gap} ms, backoff says {expected}"
        );
    }
    let raw: Vec<fred::bytes::Bytes> = r.lrange(&dead, 0, -1).await.unwrap();
    let frame = ruststream::redis::frame::Frame::decode(raw[0].clone());
    assert_eq!(
        frame.headers.get("reason").map(String::as_str),
        Some("max-attempts")
    );
    assert_eq!(frame.attempt, 4);
}

async fn streams_get_delayed_publishes_and_delayed_retries(env: &Env) {
    let p = &env.prefix;
    #[derive(Clone, Default)]
    struct FailOnce(Arc<Mutex<Vec<(u32, u32, u64)>>>);
    impl Handle<Check> for FailOnce {
        fn handle(
            &self,
            c: &Check,
            _o: &(),
            ctx: &mut Context<'_>,
        ) -> impl Future<Output = Result<(), HandlerOutcome>> {
            self.0.lock().unwrap().push((c.n, ctx.attempt(), now_ms()));
            std::future::ready(if ctx.attempt() == 1 {
                Err(HandlerOutcome::retry_after(Duration::from_millis(250)))
            } else {
                Ok(())
            })
        }
    }
    let h = FailOnce::default();
    let running =
        RustStream::new(AppInfo::new("s", "0")).with_broker(env.broker_with(|b| b), |b| {
            b.include(subscriber(RedisStream::new("events").group("g"), h.clone()).build());
        });
    let running = start(running).await;
    let due = now_ms() + 200;
    publisher(env)
        .await
        .message(&Check { n: 3, due_ms: due })
        .to("events")
        .delay(Duration::from_millis(200))
        .publish()
        .await
        .unwrap();
    wait_until("retried", Duration::from_secs(5), || async {
        h.0.lock().unwrap().len() == 2
    })
    .await;
    stop(running).await;
    let seen = h.0.lock().unwrap().clone();
    assert_eq!((seen[0].0, seen[0].1), (3, 1));
    assert!(seen[0].2 + 5 >= due, "delivered before due");
    assert_eq!(seen[1].1, 2, "the retry counts as attempt 2");
    assert!(
        seen[1].2 >= seen[0].2 + 240,
        "retry_after(250ms) came after {} ms",
        seen[1].2 - seen[0].2
    );
    let r = &env.client;
    let pending: Vec<Value> = r.xpending(format!("{p}events"), "g", ()).await.unwrap();
    assert_eq!(
        pending.first().cloned().and_then(|v| v.as_i64()),
        Some(0),
        "nothing pending"
    );
}

async fn a_pure_handler_node_does_not_schedule(env: &Env) {
    let p = &env.prefix;
    let h = Record::default();
    let pure = env.broker_with(|b| b.scheduling(false));
    let source = RedisList::new("{pay}")
        .reliable()
        .block(Duration::from_millis(100));
    let running = start(app(pure, source, h.clone())).await;
    publisher(env)
        .await
        .message(&Check { n: 1, due_ms: 0 })
        .to("{pay}")
        .delay(Duration::from_millis(50))
        .publish()
        .await
        .unwrap();
    let r = &env.client;
    // Well past due, the entry is still waiting: nobody schedules.
    env.advance(Duration::from_millis(600)).await;
    let waiting: i64 = r.zcard(format!("{p}{{pay}}.delayed")).await.unwrap();
    assert_eq!(waiting, 1);
    assert!(h.arrivals().is_empty());
    // A scheduling node moves it; the pure handler may be the one that handles it.
    let mover = Record::default();
    let source = RedisList::new("{pay}")
        .reliable()
        .block(Duration::from_millis(100));
    let second = start(app(env.broker_with(|b| b), source, mover.clone())).await;
    wait_until("delivered", Duration::from_secs(5), || async {
        h.arrivals().len() + mover.arrivals().len() == 1
    })
    .await;
    stop(running).await;
    stop(second).await;
}

async fn stop_subscription_stops_one_and_the_others_go_on(env: &Env) {
    let p = &env.prefix;
    let (a, b) = (Record::default(), Record::default());
    let running =
        RustStream::new(AppInfo::new("two", "0")).with_broker(env.broker_with(|b| b), |m| {
            m.include(
                subscriber(
                    RedisList::new("{a}")
                        .reliable()
                        .block(Duration::from_millis(100)),
                    a.clone(),
                )
                .build(),
            );
            m.include(
                subscriber(
                    RedisList::new("{b}")
                        .reliable()
                        .block(Duration::from_millis(100)),
                    b.clone(),
                )
                .build(),
            );
        });
    let mut running = start(running).await;
    running.stop_subscription("{a}").unwrap();
    assert!(
        running
            .stop_subscription("{nope}")
            .unwrap_err()
            .to_string()
            .contains("{b}")
    );
    let publisher = publisher(env).await;
    publisher
        .message(&Check { n: 1, due_ms: 0 })
        .to("{a}")
        .publish()
        .await
        .unwrap();
    publisher
        .message(&Check { n: 2, due_ms: 0 })
        .to("{b}")
        .publish()
        .await
        .unwrap();
    wait_until("b handled", Duration::from_secs(5), || async {
        b.arrivals().len() == 1
    })
    .await;
    let r = &env.client;
    let left: i64 = r.llen(format!("{p}{{a}}")).await.unwrap();
    assert_eq!(left, 1, "the stopped subscription does not read");
    assert!(a.arrivals().is_empty());
    stop(running).await;
}
