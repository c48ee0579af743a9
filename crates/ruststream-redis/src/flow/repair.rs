//! The repair of a flow whose publisher stopped halfway (see `crate::flow`'s module docs): a
//! reader of the parent's queue learns from `move_due.lua` which flows of its publishing set
//! were started more than the grace ago and are still not published whole; for each, [`repair`]
//! reads the record's plan and publishes the children still unsent through `publish_flow`, with
//! the policies the plan holds. A record gone (expired with its max age) leaves the set; so does
//! a plan this reader cannot decode, with an error logged (see `docs/decisions.md`, "A
//! flow's publish is one unit").
//!
//! Commands: `HGET` of the record's plan, `ZREM` from the publishing set, and `publish_flow`'s.

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::{Headers, Result};

use crate::conn::Connections;
use crate::error::core;

/// What a repair did, as `ruststream_flow_repairs_total{queue,outcome}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repaired {
    /// The children still unsent were published.
    Published,
    /// The record was gone, or published whole: nothing to do.
    Gone,
    /// The plan could not be decoded: nothing published (an error is logged).
    Undecodable,
}

impl Repaired {
    /// The metric's `outcome` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::Gone => "gone",
            Self::Undecodable => "undecodable",
        }
    }
}

/// [`repair`] as the broker hands it to the delayed sets' movers
/// (`crate::conn::RepairFlow`): the outcome's label.
pub(crate) fn repair_boxed<'a>(
    conns: &'a Connections,
    publishing: &'a str,
    record: &'a str,
) -> futures::future::BoxFuture<'a, Result<&'static str>> {
    Box::pin(async move { repair(conns, publishing, record).await.map(Repaired::label) })
}

/// Publishes what the flow of `record` (an entry of `publishing`) left unsent.
///
/// # Errors
/// Redis's, or the publish's: the entry stays, and a reader tries again after the grace.
pub(crate) async fn repair(
    conns: &Connections,
    publishing: &str,
    record: &str,
) -> Result<Repaired> {
    let pool = conns.pool()?;
    let plan: Option<Bytes> = pool.next().hget(record, "plan").await.map_err(core)?;
    let decoded = plan.as_deref().map(super::plan::decode);
    let (flow, routes) = match decoded {
        Some(Ok(decoded)) => decoded,
        None => {
            tracing::debug!(record, "flow record gone or published whole: not repaired");
            return forget(conns, publishing, record)
                .await
                .map(|()| Repaired::Gone);
        }
        Some(Err(e)) => {
            tracing::error!(record, error = %e,
                "flow not repaired: its plan cannot be decoded (written by another version?); \
                 its unsent children stay unpublished and its record expires with its max age");
            return forget(conns, publishing, record)
                .await
                .map(|()| Repaired::Undecodable);
        }
    };
    tracing::warn!(
        record,
        "flow left half published (its publisher stopped?): publishing the rest"
    );
    super::publish_flow(conns, &routes, flow, Headers::new(), true).await?;
    Ok(Repaired::Published)
}

/// Takes `record` out of `publishing`.
async fn forget(conns: &Connections, publishing: &str, record: &str) -> Result<()> {
    let _: i64 = conns
        .pool()?
        .next()
        .zrem(publishing, record)
        .await
        .map_err(core)?;
    Ok(())
}
