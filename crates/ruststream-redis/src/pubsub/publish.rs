//! Publishing to a channel: `PUBLISH channel frame`, or `SPUBLISH channel frame` for a sharded
//! one, a batch in one pipeline.

use fred::prelude::*;
use ruststream_core::Result;

use crate::error::core;
pub use crate::policy::ChannelPublish as Publish;

/// Publishes `frames` to the (prefixed) channel `channel` in one pipeline, as `how` says.
pub(crate) async fn publish(
    client: &Client,
    channel: &str,
    how: Publish,
    frames: Vec<Value>,
) -> Result<()> {
    let pipeline = client.pipeline();
    for frame in frames {
        let () = if how.sharded {
            pipeline.spublish(channel, frame).await
        } else {
            pipeline.publish(channel, frame).await
        }
        .map_err(core)?;
    }
    let _: Vec<Value> = pipeline.all().await.map_err(core)?;
    Ok(())
}
