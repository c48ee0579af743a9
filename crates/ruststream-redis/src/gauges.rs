//! Queue gauges: every few seconds, one pipelined read of a subscription's key sizes
//! (`LLEN` queue, processing and dead-letter lists, `ZCARD` delayed set; for a stream `XLEN` and
//! the group's pending count from `XPENDING`), published as `metrics` gauges labelled `queue`:
//! `ruststream_queue_ready`, `ruststream_queue_in_flight`, `ruststream_queue_delayed`,
//! `ruststream_queue_dead`; and of a queue with a delayed set, the messages in a durable sleep
//! and those parked waiting for a signal (`crate::steps`): `ZCOUNT` of its sleeping and parked
//! sets from now (this process's clock) on, as `ruststream_queue_sleeping` and
//! `ruststream_queue_parked`. Those sets hold an id until its wake-up time (the settle of a
//! sleep or a park adds it, a signal, a cancel and an operator's promote remove it), so what
//! they count is what sleeps or waits now, on every worker. A queue that never sleeps nor
//! waits has neither set: each `ZCOUNT` finds no key. A Pub/Sub channel stores nothing but its
//! dead letters: only
//! `ruststream_queue_dead` (`LLEN` of its dead-letter list), labelled with the channel.

use std::time::Duration;

use fred::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::keys::SourceKeys;

/// How often the sizes are read.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Samples the sizes of the keys of a list or stream subscription until `stop`; the label is
/// the queue's full name.
pub(crate) fn spawn(pool: Pool, keys: SourceKeys, stop: CancellationToken) {
    tokio::spawn(async move {
        let label = keys.queue.clone();
        let ready = metrics::gauge!("ruststream_queue_ready", "queue" => label.clone());
        let in_flight = metrics::gauge!("ruststream_queue_in_flight", "queue" => label.clone());
        let delayed = metrics::gauge!("ruststream_queue_delayed", "queue" => label.clone());
        let dead = metrics::gauge!("ruststream_queue_dead", "queue" => label.clone());
        let sleeping = metrics::gauge!("ruststream_queue_sleeping", "queue" => label.clone());
        let parked = metrics::gauge!("ruststream_queue_parked", "queue" => label);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(SAMPLE_EVERY) => {}
            }
            match sample(&pool, &keys).await {
                Ok([r, f, d, x, s, p]) => {
                    #[allow(clippy::cast_precision_loss)]
                    {
                        ready.set(r as f64);
                        in_flight.set(f as f64);
                        delayed.set(d as f64);
                        dead.set(x as f64);
                        sleeping.set(s as f64);
                        parked.set(p as f64);
                    }
                }
                Err(e) => tracing::debug!(queue = %keys.queue, error = %e, "queue gauges not read"),
            }
        }
    });
}

/// Samples the size of a Pub/Sub subscription's dead-letter list until `stop`; `label` is the
/// (prefixed) channel or pattern.
pub(crate) fn spawn_dead(pool: Pool, label: String, dead: Option<String>, stop: CancellationToken) {
    let Some(dead) = dead else { return };
    tokio::spawn(async move {
        let gauge = metrics::gauge!("ruststream_queue_dead", "queue" => label.clone());
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(SAMPLE_EVERY) => {}
            }
            match pool.next().llen::<i64, _>(&dead).await {
                #[allow(clippy::cast_precision_loss)]
                Ok(n) => gauge.set(n as f64),
                Err(e) => tracing::debug!(queue = %label, error = %e, "dead-letter gauge not read"),
            }
        }
    });
}

/// The sizes: ready, in flight, delayed, dead, sleeping, parked.
pub(crate) async fn sample(pool: &Pool, k: &SourceKeys) -> Result<[i64; 6], fred::error::Error> {
    let p = pool.next().pipeline();
    match &k.group {
        None => {
            let _: () = p.llen(&k.queue).await?;
            match &k.processing {
                Some(processing) => p.llen(processing).await?,
                None => p.custom(fred::cmd!("ECHO"), vec!["0"]).await?,
            }
        }
        Some(group) => {
            let _: () = p.xlen(&k.queue).await?;
            let _: () = p
                .custom(
                    fred::cmd!("XPENDING"),
                    vec![k.queue.as_str(), group.as_str()],
                )
                .await?;
        }
    }
    match &k.delayed {
        Some(delayed) => p.zcard(delayed).await?,
        None => p.custom(fred::cmd!("ECHO"), vec!["0"]).await?,
    }
    match &k.dead {
        Some(dead) => p.llen(dead).await?,
        None => p.custom(fred::cmd!("ECHO"), vec!["0"]).await?,
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    for index in [".sleeping", ".parked"] {
        match &k.delayed {
            Some(delayed) => {
                let args = vec![
                    format!("{delayed}{index}"),
                    format!("({now}"),
                    "+inf".into(),
                ];
                let () = p.custom(fred::cmd!("ZCOUNT"), args).await?;
            }
            None => {
                let () = p.custom(fred::cmd!("ECHO"), vec!["0"]).await?;
            }
        }
    }
    let out: Vec<Value> = p.all().await?;
    let n = |v: Option<&Value>| match v {
        Some(Value::Array(items)) => items.first().and_then(Value::as_i64).unwrap_or(0),
        Some(v) => v.as_i64().unwrap_or(0),
        None => 0,
    };
    Ok([0, 1, 2, 3, 4, 5].map(|i| n(out.get(i))))
}
