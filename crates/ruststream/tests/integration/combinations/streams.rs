//! The stream matrix: every pair of the features a [`RedisStream`] has (rate limit, partitions,
//! pause, batch handler, delays, recovery after a killed claim) on one stream read by a group,
//! every message handled exactly once and nothing left pending, unread or delayed.

use crate::harness;

use std::time::Duration;

use harness::{Env, Stuck, WAIT, on, stop, wait_until};
use ruststream::Mount;
use ruststream::prelude::*;

use super::Feature::{self, *};
use super::{BLOCK, Job, N, Tally, handle_every_job, mount_of};

on!([memory, standalone, cluster] every_pair_of_stream_features_loses_and_duplicates_nothing);

/// The features of a [`RedisStream`]: those of the list matrix but priorities and the per-key
/// limit, which a stream does not have.
const STREAM_FEATURES: [Feature; 6] = [Rate, Partitions, Pause, Batch, Delays, Recovery];

/// The stream's consumer group.
const GROUP: &str = "g";

async fn every_pair_of_stream_features_loses_and_duplicates_nothing(env: &Env) {
    for (i, &a) in STREAM_FEATURES.iter().enumerate() {
        for &b in &STREAM_FEATURES[i + 1..] {
            let pair = [a, b];
            run_stream_pair(env, &format!("s{a:?}{b:?}").to_lowercase(), &pair).await;
        }
    }
}

/// The stream of `pair` named `name`: read by [`GROUP`], 8 at once, with the pair's options.
fn stream_source(name: &str, pair: &[Feature]) -> RedisStream {
    let key = if pair.contains(&Partitions) {
        name.to_owned()
    } else {
        format!("{{{name}}}")
    };
    let mut stream = RedisStream::new(key)
        .group(GROUP)
        .block(BLOCK)
        .concurrency(8)
        .min_idle(Duration::from_millis(300));
    for f in pair {
        stream = match f {
            Rate => stream.rate_limit(20, Duration::from_millis(100)),
            Partitions => stream.partitions(2),
            Pause | Batch | Delays | Recovery => stream,
            other => unreachable!("{other:?} is not in the stream matrix"),
        };
    }
    stream
}

/// Runs `pair` on its own stream: every job handled once; nothing pending in the group,
/// unread by it or waiting in a delayed set, on any partition.
async fn run_stream_pair(env: &Env, name: &str, pair: &[Feature]) {
    let stream = stream_source(name, pair);
    let key = stream.key().to_owned();
    let tally = Tally::default();
    let mount = mount_of(stream.clone(), &tally, pair);
    let mut route = stream::Publish::new();
    if pair.contains(&Partitions) {
        route = route.partitions(2);
    }
    let producer = env.broker_with(|b| b.route(&key, route));
    producer.connect().await.expect("connect");
    let publisher = producer.publisher();
    let publish = async |range: std::ops::Range<u32>| {
        for n in range {
            let job = Job { n };
            let mut m = publisher.message(&job).to(&key);
            if pair.contains(&Delays) && n % 4 == 0 {
                m = m.delay(Duration::from_millis(200));
            }
            m.publish().await.expect("publish");
        }
    };

    let dying = {
        let stream = stream.clone();
        move |b: &mut Mount<RedisBroker>, stuck: Stuck| {
            b.include(subscriber(stream.concurrency(4), stuck).build::<Job>());
        }
    };
    let apps = handle_every_job(env, pair, &key, &tally, mount, dying, publish).await;
    let streams = if pair.contains(&Partitions) {
        stream.partition_keys()
    } else {
        vec![key.clone()]
    };
    wait_until(&format!("{pair:?}: all settled"), WAIT, async || {
        let mut left = 0;
        for s in &streams {
            let (pending, unread) = group_state(env, s).await;
            left += pending + unread + env.zcard(&format!("{s}.delayed")).await;
        }
        left == 0
    })
    .await;
    for app in apps {
        stop(app).await;
    }
    assert_eq!(
        tally.not_once(N),
        [],
        "{pair:?}: jobs handled other than once"
    );
}

/// The group's entries pending and not yet read (`XINFO GROUPS`' `pending` and `lag`) on the
/// stream `key`.
async fn group_state(env: &Env, key: &str) -> (i64, i64) {
    let field = group_fields(env, key, GROUP).await;
    let of = |name: &str| {
        field
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_i64())
    };
    of("pending")
        .zip(of("lag"))
        .unwrap_or_else(|| panic!("no group {GROUP} on {key}"))
}

/// The fields of the group `group` in `XINFO GROUPS` of the stream `key` (none without it).
pub(crate) async fn group_fields(
    env: &Env,
    key: &str,
    group: &str,
) -> Vec<(String, fred::prelude::Value)> {
    use fred::prelude::*;
    let groups: Vec<Value> = env
        .client
        .custom(
            fred::cmd!("XINFO", hash: fred::types::ClusterHash::from(env.key(key).as_str())),
            vec!["GROUPS".to_owned(), env.key(key)],
        )
        .await
        .expect("XINFO GROUPS");
    groups
        .into_iter()
        .map(|g| {
            // A record is a flat array of names and values (RESP2) or a map (RESP3).
            let fields: Vec<(String, Value)> = match g {
                Value::Array(flat) => flat
                    .chunks(2)
                    .filter_map(|kv| Some((kv.first()?.as_string()?, kv.get(1)?.clone())))
                    .collect(),
                Value::Map(map) => map
                    .inner()
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v)))
                    .collect(),
                _ => Vec::new(),
            };
            fields
        })
        .find(|f| {
            f.iter()
                .any(|(k, v)| k == "name" && v.as_string().as_deref() == Some(group))
        })
        .unwrap_or_default()
}
