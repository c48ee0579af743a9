//! Pub/Sub: a channel and a pattern subscription, dead letters, no redelivery.

use std::time::Duration;

use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::subscriber;

use super::*;
use crate::harness::{Env, on};

on!([memory, standalone] pubsub_channel_and_pattern);

/// The harness's recorder; retries 1, drops 2, acks the rest.
fn channel_rec() -> Rec {
    Rec::new(|job, _| match job.n {
        1 => Err(HandlerOutcome::retry()),
        2 => Err(HandlerOutcome::drop()),
        _ => Ok(()),
    })
}

impl Rec {
    /// The numbers and source channels recorded.
    fn channels(&self) -> Vec<(u32, String)> {
        self.seen()
            .iter()
            .map(|d| (d.n, d.source.clone()))
            .collect()
    }
}

async fn numsub(env: &Env, channel: &str) -> i64 {
    let reply = env
        .cmd(
            "PUBSUB",
            vec!["NUMSUB".into(), env.key(channel).as_str().into()],
        )
        .await
        .expect("PUBSUB NUMSUB");
    match reply {
        Value::Array(v) => v.get(1).and_then(Value::as_i64).unwrap_or(0),
        _ => 0,
    }
}

async fn pubsub_channel_and_pattern(env: &Env) {
    let (one, all) = (channel_rec(), channel_rec());
    let (o, a) = (one.clone(), all.clone());
    let app = env
        .start_with(|b| {
            b.include(subscriber(RedisChannel::new("ev"), o).build());
            b.include(subscriber(RedisChannel::pattern("ev.*"), a).build());
        })
        .await;
    env.eventually("the channel's subscriber", async || {
        numsub(env, "ev").await == 1
    })
    .await;
    // The app reads `ev` as a channel: its publisher PUBLISHes there.
    publish(env, "ev", &[Job { n: 1 }, Job { n: 2 }, Job { n: 3 }]).await;
    let raw: i64 = env
        .client
        .publish(env.key("ev"), "not json")
        .await
        .expect("PUBLISH");
    assert_eq!(raw, 1, "one subscriber of `ev`");
    let to_pattern: i64 = env
        .client
        .publish(env.key("ev.x"), job_json(9))
        .await
        .expect("PUBLISH");
    assert_eq!(to_pattern, 1, "one subscriber of `ev.*`");
    env.eventually("three dead letters", async || {
        env.llen("ev.dead").await == 3
    })
    .await;
    env.eventually("the pattern's message", async || all.count() > 0)
        .await;
    // Nothing comes back: Pub/Sub cannot redeliver.
    env.advance(Duration::from_millis(1500)).await;
    env.stop(app).await;

    let mut seen = one.channels();
    seen.sort();
    assert_eq!(
        seen,
        [
            (1, "ev".to_owned()),
            (2, "ev".to_owned()),
            (3, "ev".to_owned())
        ]
    );
    assert_eq!(all.channels(), [(9, "ev.x".to_owned())]);
    let mut reasons: Vec<String> = env
        .frames("ev.dead")
        .await
        .iter()
        .map(|f| f.headers.get("reason").cloned().unwrap_or_default())
        .map(|r| {
            if r.starts_with("decode:") {
                "decode".to_owned()
            } else {
                r
            }
        })
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "decode".to_owned(),
            "dropped".to_owned(),
            ruststream::pubsub::NO_REDELIVERY.to_owned()
        ]
    );
    assert_eq!(env.keys().await, ["ev.dead"]);
    env.eventually("no subscriber left", async || numsub(env, "ev").await == 0)
        .await;
}
