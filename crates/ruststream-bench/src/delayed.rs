//! The delayed scenario, run by the parent: a burst due at one instant, then a steady run.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::{Config, Msg, Scenario, Tuning, now_ns, per_s};
use crate::inspect::{calls_per_msg, command_calls, leftovers};
use crate::line::{Line, take_consumer};
use crate::running::{Running, Spec};
use crate::{BoxError, Ctx, KEY, Role, child, raw};

/// Rate of the delayed scenario's lateness run, messages per second.
const DELAYED_RATE: u64 = 5_000;
/// Most messages in the delayed scenario's lateness run.
const DELAYED_STEADY_N: u64 = 10_000;
/// How far ahead each message of the lateness run is due.
const DELAYED_AHEAD: Duration = Duration::from_millis(100);

/// The delayed scenario: a burst of `n` entries all due at one instant (throughput, and the
/// burst's lateness), then a steady run of entries each due 100 ms after its publish (lateness).
pub(crate) async fn run(
    ctx: &Ctx<'_>,
    c: Config,
    tuning: &Tuning,
    prefix: &str,
    raw_key: &str,
    line: &mut Line,
) -> Result<(), BoxError> {
    let n = ctx.cli.n;
    let s = Scenario::Delayed;
    let broker = child::broker(&ctx.target, prefix, tuning);
    broker.connect().await?;
    // Due once the fill is surely over: 1 s plus 15 µs a message.
    let due = SystemTime::now() + Duration::from_secs(1) + Duration::from_micros(15 * n);
    let due_ns = u64::try_from(due.duration_since(UNIX_EPOCH)?.as_nanos())?;
    let (fill, _) = child::publish_batches(&broker.publisher(), KEY, n, tuning, Some(due)).await?;
    line.publish_per_s = Some(per_s(n, fill));
    if SystemTime::now() > due {
        line.extra("warning", "fill-ended-after-due");
    }
    let before = command_calls(&ctx.raw).await?;
    let st = Running::spawn(
        ctx,
        Spec {
            due_ns: Some(due_ns),
            ..Spec::new(Role::Consumer, s, c, n, prefix)
        },
    )
    .await?
    .stats()
    .await?;
    let after = command_calls(&ctx.raw).await?;
    take_consumer(line, n, &st);
    line.extra("calls_per_msg", calls_per_msg(&before, &after, n));
    line.extra(
        "burst_p50_ms",
        format!("{:.1}", st.ms("p50_us").unwrap_or(0.0)),
    );
    line.extra(
        "burst_p99_ms",
        format!("{:.1}", st.ms("p99_us").unwrap_or(0.0)),
    );

    // Lateness on a steady stream of delayed publishes.
    let steady_n = n.min(DELAYED_STEADY_N);
    let running = Running::spawn(
        ctx,
        Spec {
            stamped: true,
            ..Spec::new(Role::Consumer, s, c, steady_n, prefix)
        },
    )
    .await?;
    let publisher = broker.publisher();
    raw::paced(DELAYED_RATE, steady_n, |i| {
        let publisher = publisher.clone();
        async move {
            let at = SystemTime::now() + DELAYED_AHEAD;
            let at_ns = u64::try_from(at.duration_since(UNIX_EPOCH)?.as_nanos())?;
            let m = Msg::new(i, at_ns);
            publisher.message(&m).to(KEY).at(at).publish().await?;
            Ok(())
        }
    })
    .await?;
    let st2 = running.stats().await?;
    ruststream_core::Broker::close(&broker).await;
    line.p50_ms = st2.ms("p50_us");
    line.p99_ms = st2.ms("p99_us");
    line.extra("steady_n", steady_n);
    line.extra(
        "steady_lost",
        steady_n.saturating_sub(st2.u("distinct").unwrap_or(0)),
    );
    line.extra("steady_dup", st2.u("dups").unwrap_or(0));
    line.rss_mb = match (line.rss_mb, st2.mb("hwm_kb")) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    line.extra("left", leftovers(&ctx.raw, prefix).await?);
    if !ctx.cli.no_baseline {
        let due_ms = now_ns() / 1_000_000 + 1000 + 15 * n / 1000;
        let out = raw::delayed(&ctx.raw, raw_key, n, tuning.batch(), due_ms).await?;
        line.baseline_per_s = Some(out.per_s);
        line.extra("baseline_seen", out.seen);
    }
    Ok(())
}
