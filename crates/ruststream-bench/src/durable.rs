//! The `durable` scenario: what `.durable(1, 1 s)` costs a publish, next to the same publish
//! without it, on `--redis` (a primary with at least one replica: `WAIT 1 1000` after each
//! publish call). Two shapes, each plain then durable: one message per call from one task
//! (the latency a caller sees), and `messages(&chunk)` of 100 per call (one `WAIT` covers the
//! chunk). Prints one `RESULT scenario=durable ..` line per shape and mode; nothing is consumed
//! (the queue is deleted after).

use std::time::{Duration, Instant};

use fred::prelude::*;
use ruststream::prelude::*;

use crate::BoxError;
use crate::common::Msg;

const TIMEOUT: Duration = Duration::from_secs(1);

/// Runs both shapes, plain and durable, with `n` messages each, on `redis`.
pub async fn run(redis: &str, n: usize) -> Result<(), BoxError> {
    let prefix = format!("bench-durable-{}:", std::process::id());
    let broker = RedisBroker::standalone(redis).prefix(&prefix);
    broker.connect().await?;
    let raw = Builder::from_config(Config::from_url(redis)?).build()?;
    raw.init().await?;
    let publisher = broker.publisher();
    for (shape, per_call) in [("single", 1usize), ("batch100", 100)] {
        for durable in [false, true] {
            let msgs: Vec<Msg> = (0..n as u64).map(|i| Msg::new(i, 0)).collect();
            let mut lat = Vec::with_capacity(n / per_call + 1);
            let started = Instant::now();
            for chunk in msgs.chunks(per_call) {
                let t = Instant::now();
                let mut p = publisher.messages(chunk).to("durable");
                if durable {
                    p = p.durable(1, TIMEOUT);
                }
                p.publish().await?;
                lat.push(t.elapsed());
            }
            let secs = started.elapsed().as_secs_f64();
            lat.sort();
            let q = |f: f64| {
                let i = ((lat.len() as f64 * f) as usize).min(lat.len() - 1);
                lat[i].as_secs_f64() * 1e6
            };
            println!(
                "RESULT scenario=durable shape={shape} durable={} n={n} publish_per_s={:.0} call_p50_us={:.0} call_p99_us={:.0}",
                u8::from(durable),
                n as f64 / secs,
                q(0.5),
                q(0.99)
            );
            let _: i64 = raw.del(format!("{prefix}durable")).await?;
        }
    }
    let _ = raw.quit().await;
    Ok(())
}
