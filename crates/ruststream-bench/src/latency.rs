//! The latency scenario, run by the parent: a steady rate of publishes, each stamped.

use crate::common::{Config, Msg, Scenario, Tuning, now_ns, per_s};
use crate::inspect::{calls_per_msg, command_calls, leftovers};
use crate::line::{Line, ms, take_consumer};
use crate::running::{Running, Spec};
use crate::{BoxError, Ctx, KEY, Role, child, raw};

/// The latency scenario: a steady rate of single publishes to a reliable list, end-to-end latency
/// from each message's creation (stamped in its body) to its handler.
pub(crate) async fn run(
    ctx: &Ctx<'_>,
    c: Config,
    prefix: &str,
    raw_key: &str,
    line: &mut Line,
) -> Result<(), BoxError> {
    let n = ctx.cli.n;
    let rate = ctx.cli.rate;
    let s = Scenario::Latency;
    let broker = child::broker(&ctx.target, prefix, &Tuning::of(s, c));
    broker.connect().await?;
    let before = command_calls(&ctx.raw).await?;
    let running = Running::spawn(
        ctx,
        Spec {
            stamped: true,
            ..Spec::new(Role::Consumer, s, c, n, prefix)
        },
    )
    .await?;
    let publisher = broker.publisher();
    let t0 = std::time::Instant::now();
    let sent = raw::paced(rate, n, |i| {
        let publisher = publisher.clone();
        async move {
            let m = Msg::new(i, now_ns());
            publisher.message(&m).to(KEY).publish().await?;
            Ok(())
        }
    })
    .await?;
    line.publish_per_s = Some(per_s(sent, t0.elapsed()));
    let st = running.stats().await?;
    let after = command_calls(&ctx.raw).await?;
    ruststream_core::Broker::close(&broker).await;
    take_consumer(line, n, &st);
    line.extra("calls_per_msg", calls_per_msg(&before, &after, n));
    line.p50_ms = st.ms("p50_us");
    line.p99_ms = st.ms("p99_us");
    line.extra("p999_ms", format!("{:.2}", st.ms("p999_us").unwrap_or(0.0)));
    line.extra("max_ms", format!("{:.2}", st.ms("max_us").unwrap_or(0.0)));
    line.extra("rate", rate);
    line.extra("left", leftovers(&ctx.raw, prefix).await?);
    if !ctx.cli.no_baseline {
        let out = raw::latency(&ctx.cli.redis, &ctx.raw, raw_key, n, rate).await?;
        line.baseline_per_s = Some(out.per_s);
        if let Some((p50, p99, p999)) = out.lat_us {
            line.extra("baseline_p50_ms", format!("{:.2}", ms(p50)));
            line.extra("baseline_p99_ms", format!("{:.2}", ms(p99)));
            line.extra("baseline_p999_ms", format!("{:.2}", ms(p999)));
        }
    }
    Ok(())
}
