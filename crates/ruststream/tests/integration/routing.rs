//! On a cluster, every command RustStream sends goes at once to the node owning its key: no
//! node answers `MOVED`, which Redis counts in `INFO errorstats` (`errorstat_MOVED`). The
//! cluster is the test's own (`scripts/stand`'s `stand_cluster`), so only this test's commands
//! are counted.
//!
//! A command sent to another node still works (fred follows the redirection), which is how
//! this went unseen: fred resynchronised its whole cluster map on each redirection, and a
//! blocking read redirected so could not be interrupted, so a stream reader woken for a due
//! delayed entry sometimes waited out its whole block (`keys::slot_of` in `ruststream-redis`).

use crate::harness;

use std::time::{Duration, Instant};

use fred::prelude::*;
use harness::stand::{Stand, node_client};
use harness::{Seen, bounded, start, stop, unique, wait_until};
use ruststream::operate::operators;
use ruststream::prelude::*;
use ruststream::{list, pubsub, stream};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Job {
    n: u32,
}
outgoing!(Job);

/// Retries each message once, 100 ms later, then acknowledges it.
fn retrying_once() -> Seen<Job> {
    Seen::new(|_, attempt| {
        if attempt == 1 {
            Err(HandlerOutcome::retry_after(Duration::from_millis(100)))
        } else {
            Ok(())
        }
    })
}

/// `errorstat_MOVED` of every node of the cluster at `urls`, summed.
async fn moved(urls: &[String]) -> u64 {
    let mut total = 0;
    for url in urls {
        let node = node_client(url.trim_start_matches("redis://")).await;
        let stats: String = node
            .custom(fred::cmd!("INFO"), vec!["errorstats"])
            .await
            .expect("INFO errorstats");
        total += stats
            .lines()
            .find_map(|l| l.strip_prefix("errorstat_MOVED:count="))
            .map_or(0, |n| n.trim().parse::<u64>().expect("a count"));
        let _ = node.quit().await;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_goes_at_once_to_the_node_owning_its_key() {
    let stand = Stand::start("stand_cluster");
    let urls = stand.cluster_urls();
    let prefix = format!("{}:", unique("routing"));
    let broker = || {
        RedisBroker::cluster(urls.clone())
            .prefix(&prefix)
            .route("{jobs}", list::Publish::new().priorities(2))
            .route("events", stream::Publish::new())
            .route("news", pubsub::Publish::new())
    };
    let (jobs, events, news) = (retrying_once(), retrying_once(), Seen::<Job>::acking());
    let app = RustStream::new(AppInfo::new("routing", "0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(broker(), |b| {
            b.include(
                subscriber(
                    RedisList::new("{jobs}").reliable().priorities(2),
                    jobs.clone(),
                )
                .build(),
            );
            // A read blocks far longer than the test waits: a due delayed entry must
            // interrupt it.
            b.include(
                subscriber(
                    RedisStream::new("events")
                        .group("g")
                        .block(Duration::from_secs(60)),
                    events.clone(),
                )
                .build(),
            );
            b.include(subscriber(RedisChannel::new("news"), news.clone()).build());
        });
    // From before the app starts: its group creation and first reads count too.
    let before = moved(&urls).await;
    let op = operators(&app).pop().expect("a Redis broker");
    let app = start(app).await;
    op.connect().await.expect("the operator connects");
    let producer = broker();
    producer.connect().await.expect("the producer connects");
    let p = producer.publisher();

    for n in 0..4 {
        let level = if n % 2 == 0 { 0 } else { 1 };
        let job = Job { n };
        let to_jobs = p.message(&job).to("{jobs}").priority(level);
        to_jobs.publish().await.expect("publish to the list");
        p.message(&job).to("events").publish().await.expect("XADD");
    }
    let delayed = Duration::from_millis(300);
    p.message(&Job { n: 4 })
        .to("{jobs}")
        .delay(delayed)
        .publish()
        .await
        .expect("a delayed publish to the list");
    let sent = Instant::now();
    p.message(&Job { n: 4 })
        .to("events")
        .delay(delayed)
        .publish()
        .await
        .expect("a delayed publish to the stream");
    wait_until(
        "the news subscriber listens",
        Duration::from_secs(5),
        async || p.message(&Job { n: 0 }).to("news").publish().await.is_ok() && news.count() > 0,
    )
    .await;
    // Every message twice: its first attempt, then its retry.
    wait_until(
        "every job and event handled and retried",
        Duration::from_secs(10),
        async || jobs.count() == 10 && events.count() == 10,
    )
    .await;
    let retried_event = events
        .seen()
        .iter()
        .find(|d| d.n == 4 && d.attempt == 2)
        .map(|d| d.at.into_std())
        .expect("the delayed event's retry");
    // Due at 300 ms, retried 100 ms after: far within the 60 s block, and the 5 s schedule
    // interval a reader looks at the delayed set without a wake-up.
    let took = retried_event.duration_since(sent);
    assert!(
        took < Duration::from_secs(3),
        "the delayed event's retry came {took:?} after its publish"
    );
    let queues = bounded("inspect", Duration::from_secs(5), op.inspect(None))
        .await
        .expect("inspect");
    assert_eq!(queues.len(), 3, "{queues:?}");

    let after = moved(&urls).await;
    stop(app).await;
    assert_eq!(after - before, 0, "commands redirected with MOVED");
    drop(stand);
}
