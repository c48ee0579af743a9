//! What every list or stream reader runs beside its reads: the gauges of its keys
//! (`crate::gauges`) and the pause gate (`crate::pause`). Sends no command itself.

use ruststream_core::Result;
use tokio_util::sync::CancellationToken;

use super::source::Transport;
use crate::conn::Connections;
use crate::pause::Gate;

/// What every list or stream reader runs beside its reads: the queue gauges of its keys, and the
/// gate that holds its reads while an operator has paused it.
pub(crate) async fn watch_source(
    conns: &Connections,
    source: &dyn Transport,
    pool: &fred::clients::Pool,
    stop: &CancellationToken,
) -> Result<Option<Gate>> {
    let keys = source.source_keys(&conns.keys);
    crate::gauges::spawn(pool.clone(), keys, stop.clone());
    pause_gate(conns, source, pool, stop).await
}

/// The gate that holds a reader's reads while an operator has paused its source (a stream's
/// second reader has this without the gauges: its first reader samples them).
pub(crate) async fn pause_gate(
    conns: &Connections,
    source: &dyn Transport,
    pool: &fred::clients::Pool,
    stop: &CancellationToken,
) -> Result<Option<Gate>> {
    let Some(key) = source.source_keys(&conns.keys).paused else {
        return Ok(None);
    };
    let wake = conns.notifier(&key).await?;
    let gate = Gate::open(&conns.pauses, pool.clone(), wake, key, stop.clone()).await?;
    Ok(Some(gate))
}
