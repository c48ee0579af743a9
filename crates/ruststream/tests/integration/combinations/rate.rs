//! A rate limit holds over all partitions of a list and of a stream.

use crate::harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Env, WAIT, on, start, stop, wait_until};
use ruststream::Mount;
use ruststream::prelude::*;
use tokio::time::Instant;

use super::{BLOCK, Job, Tally, own_app};

on!(
    [memory, standalone, cluster]
    a_rate_limit_holds_over_all_partitions_of_a_list,
    a_rate_limit_holds_over_all_partitions_of_a_stream,
);

async fn a_rate_limit_holds_over_all_partitions_of_a_list(env: &Env) {
    let list = RedisList::new("limited")
        .reliable()
        .partitions(4)
        .block(BLOCK)
        .rate_limit(5, Duration::from_secs(1));
    let route = ruststream::PublishPolicy::List(list::Publish::new().partitions(4));
    rate_over_partitions(env, list, route).await;
}

async fn a_rate_limit_holds_over_all_partitions_of_a_stream(env: &Env) {
    let stream = RedisStream::new("limited")
        .group("g")
        .partitions(4)
        .block(BLOCK)
        .rate_limit(5, Duration::from_secs(1));
    let route = ruststream::PublishPolicy::Stream(stream::Publish::new().partitions(4));
    rate_over_partitions(env, stream, route).await;
}

/// A rate limit of 5 a second on a queue of 4 partitions read by two apps: the limiter is the
/// logical queue's, so the burst is 5 in all (a limit per partition would let 20 through at
/// once), and within any window W at most 5 + 5 W/s pass (one more for the clocks), and all
/// 20 jobs are handled once.
async fn rate_over_partitions(
    env: &Env,
    source: impl ruststream::Source<Broker = RedisBroker> + Clone,
    route: ruststream::PublishPolicy,
) {
    let stamps: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let tally = Tally::default();
    #[derive(Clone)]
    struct Stamped(Tally, Arc<Mutex<Vec<Instant>>>);
    impl Handle<Job> for Stamped {
        async fn handle(&self, m: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
            self.1.lock().expect("lock").push(Instant::now());
            self.0.add(m.n);
            Ok(())
        }
    }
    let handler = Stamped(tally.clone(), stamps.clone());
    let mount = move |b: &mut Mount<RedisBroker>| {
        b.include(subscriber(source.clone(), handler.clone()).build());
    };
    let producer = env.broker_with(|b| b.route("limited", route));
    producer.connect().await.expect("connect");
    for n in 0..20 {
        producer
            .publisher()
            .message(&Job { n })
            .to("limited")
            .publish()
            .await
            .expect("publish");
    }
    let apps = [
        start(own_app(env, mount.clone())).await,
        start(own_app(env, mount)).await,
    ];
    wait_until("all 20 handled", WAIT, async || tally.handled() == 20).await;
    for app in apps {
        stop(app).await;
    }
    assert_eq!(tally.not_once(20), [], "each handled once");
    let stamps = stamps.lock().expect("lock").clone();
    for (i, first) in stamps.iter().enumerate() {
        for (j, last) in stamps.iter().enumerate().skip(i) {
            let w = last.duration_since(*first).as_secs_f64();
            let bound = 5.0 + 5.0 * w + 1.0;
            assert!(
                (j - i + 1) as f64 <= bound,
                "{} passed within {w:.3} s, over the limit's {bound}",
                j - i + 1
            );
        }
    }
}
