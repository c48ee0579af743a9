//! The raw baselines measured over time rather than over a drained queue: Pub/Sub (a subscriber
//! counting while pipelined `PUBLISH`es go out) and latency (publishes at a steady rate, paced).

use crate::BoxError;
use crate::common::{Msg, now_ns, per_s};
use crate::tracker::quantile;
use bytes::Bytes;
use fred::prelude::*;
use fred::types::CustomCommand;
use fred::types::lists::LMoveDirection;
use futures::{StreamExt, TryStreamExt};
use ruststream::redis::frame::Frame;
use std::time::{Duration, Instant};

use super::{DEPTH, FILL_CHUNK, Out, bytes_of, client, frame, frames};

/// The raw Pub/Sub subscriber's buffer: its counter shares this process's cores with the raw
/// publisher, and a smaller buffer (16,384) overflowed in measured runs.
pub const PUBSUB_BUFFER: usize = 1 << 17;

/// What the raw Pub/Sub baseline measured.
#[derive(Debug, Default)]
pub struct PubsubOut {
    /// Messages per second the subscriber counted, from the first message to the last.
    pub per_s: f64,
    /// Messages the subscriber counted.
    pub seen: u64,
    /// Messages fred's buffer dropped before the counter read them.
    pub lagged: u64,
}

/// Raw Pub/Sub: a fred subscriber (buffer `buffer`) counts the messages of
/// `channel` while `PUBLISH channel frame` goes out in pipelines of 1000, 8 in flight. The run
/// ends when all `n` were counted (or dropped), or none came for `quiet`.
pub async fn pubsub(
    url: &str,
    c: &Client,
    channel: &str,
    n: u64,
    buffer: usize,
    quiet: Duration,
) -> Result<PubsubOut, BoxError> {
    let subscriber = Builder::from_config(Config::from_url(url)?)
        .with_performance_config(|p| p.broadcast_channel_capacity = buffer)
        .build_subscriber_client()?;
    subscriber.init().await?;
    let mut messages = subscriber.message_rx();
    subscriber.subscribe(channel).await?;
    let values = frames(n);
    let counter = tokio::spawn(async move {
        let (mut seen, mut lagged) = (0u64, 0u64);
        let mut span: Option<(Instant, Instant)> = None;
        while seen + lagged < n {
            match tokio::time::timeout(quiet, messages.recv()).await {
                Ok(Ok(_)) => {
                    seen += 1;
                    let now = Instant::now();
                    span = Some(span.map_or((now, now), |(first, _)| (first, now)));
                }
                Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(k))) => lagged += k,
                Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) | Err(_) => break,
            }
        }
        (seen, lagged, span)
    });
    let chunks: Vec<Vec<Bytes>> = values.chunks(FILL_CHUNK).map(<[Bytes]>::to_vec).collect();
    futures::stream::iter(chunks)
        .map(|chunk| async move {
            let p = c.pipeline();
            for v in chunk {
                let () = p.publish(channel, v).await?;
            }
            p.all::<Vec<Value>>().await
        })
        .buffer_unordered(DEPTH)
        .try_collect::<Vec<_>>()
        .await?;
    let (seen, lagged, span) = counter.await?;
    let _ = subscriber.quit().await;
    Ok(PubsubOut {
        per_s: span.map_or(0.0, |(first, last)| per_s(seen, last - first)),
        seen,
        lagged,
    })
}

/// Raw latency at a steady `rate`: one `LPUSH` per message; a consumer on its own connection
/// `BLMOVE`s the first entry, `LMOVE`s up to 8 more per pipeline while they keep coming, then
/// `LREM`s them in one pipeline.
pub async fn latency(url: &str, c: &Client, key: &str, n: u64, rate: u64) -> Result<Out, BoxError> {
    let reader = client(url).await?;
    let processing = format!("{key}.processing");
    let consumer = {
        let (key, processing) = (key.to_owned(), processing.clone());
        tokio::spawn(async move {
            let mut lat = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
            while (lat.len() as u64) < n {
                let first: Value = reader
                    .custom(
                        CustomCommand::new_static(
                            "BLMOVE",
                            fred::types::ClusterHash::FirstKey,
                            true,
                        ),
                        vec![key.as_str(), processing.as_str(), "RIGHT", "LEFT", "1"],
                    )
                    .await?;
                let Some(first) = bytes_of(first) else {
                    continue;
                };
                let mut got = vec![first];
                loop {
                    let p = reader.pipeline();
                    for _ in 0..8 {
                        let () = p
                            .lmove(
                                &key,
                                &processing,
                                LMoveDirection::Right,
                                LMoveDirection::Left,
                            )
                            .await?;
                    }
                    let more: Vec<Value> = p.all().await?;
                    let before = got.len();
                    got.extend(more.into_iter().filter_map(bytes_of));
                    if got.len() - before < 8 {
                        break;
                    }
                }
                let now = now_ns();
                for v in &got {
                    let frame = Frame::decode(v.clone());
                    if let Ok(m) = serde_json::from_slice::<Msg>(&frame.payload)
                        && let Some(stamp) = m.body.get(..20).and_then(|s| s.parse::<u64>().ok())
                    {
                        lat.push(
                            u32::try_from(now.saturating_sub(stamp) / 1000).unwrap_or(u32::MAX),
                        );
                    }
                }
                let p = reader.pipeline();
                for v in got {
                    let () = p.lrem(&processing, -1, v).await?;
                }
                let _: Vec<Value> = p.all().await?;
            }
            Ok::<Vec<u32>, fred::error::Error>(lat)
        })
    };
    let t0 = Instant::now();
    let sent = paced(rate, n, |i| {
        let c = c.clone();
        let key = key.to_owned();
        async move {
            c.lpush::<i64, _, _>(&key, frame(i, now_ns())).await?;
            Ok(())
        }
    })
    .await?;
    let mut lat = consumer.await??;
    let elapsed = t0.elapsed();
    lat.sort_unstable();
    let q = |x| quantile(&lat, x).unwrap_or(0);
    Ok(Out {
        per_s: per_s(sent, elapsed),
        seen: lat.len() as u64,
        lat_us: Some((q(0.5), q(0.99), q(0.999))),
    })
}

/// Calls `send(i)` for `i` in `0..n` at `rate` per second: every millisecond, the messages due by
/// then, concurrently. Returns how many were sent.
pub async fn paced<F, Fut>(rate: u64, n: u64, send: F) -> Result<u64, BoxError>
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = Result<(), BoxError>>,
{
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sent = 0;
    while sent < n {
        tick.tick().await;
        let due = u64::try_from(t0.elapsed().as_micros() * u128::from(rate) / 1_000_000)
            .unwrap_or(u64::MAX)
            .min(n);
        futures::future::try_join_all((sent..due).map(&send)).await?;
        sent = sent.max(due);
    }
    Ok(sent)
}
