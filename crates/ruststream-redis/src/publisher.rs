//! The publish backend of a [`RedisBroker`](crate::RedisBroker): [`RedisPublisher`], which
//! hands plain messages to `crate::publish`, flows to `crate::flow`, cancels to
//! `crate::cancel`, signals and step records to `crate::steps`, and is the job store
//! (`crate::results`). It sits above those modules so that none of them reaches back to
//! another through it. Sends no command itself.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use ruststream_core::{OutMessage, PublishBackend, Result, StepRecord, StepStore, StepWrite};

use crate::conn::Connections;
use crate::policy::Routes;
use crate::publish::publish;

/// The publish backend of a [`RedisBroker`](crate::RedisBroker).
pub(crate) struct RedisPublisher {
    pub(crate) conns: Arc<Connections>,
    pub(crate) routes: Arc<Routes>,
}

impl PublishBackend for RedisPublisher {
    fn publish(&self, messages: Vec<OutMessage>) -> BoxFuture<'_, Result<usize>> {
        Box::pin(async move {
            // A publisher taken from a broker that no app started connects on first use.
            self.conns.connect().await?;
            publish(&self.conns, &self.routes, messages, None).await
        })
    }

    /// Job records are hashes with a ttl (`crate::results`).
    fn jobs(&self) -> Option<&dyn ruststream_core::JobStore> {
        Some(self)
    }

    /// Step records are hashes beside their queue, with a ttl (`crate::steps`).
    fn steps(&self) -> Option<&dyn ruststream_core::StepStore> {
        Some(self)
    }

    /// `steps/signal.lua` on the destination (`crate::steps`).
    fn signal<'a>(
        &'a self,
        destination: &'a str,
        id: &'a str,
        name: &'a str,
        payload: bytes::Bytes,
    ) -> BoxFuture<'a, Result<ruststream_core::Signalled>> {
        Box::pin(crate::steps::signal(
            &self.conns,
            destination,
            id,
            name,
            payload,
        ))
    }

    /// `cancel.lua` on each partition of the list (`crate::cancel`).
    fn cancel<'a>(
        &'a self,
        destination: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<ruststream_core::CancelOutcome>> {
        Box::pin(async move {
            self.conns.connect().await?;
            crate::cancel::cancel(&self.conns, destination, id).await
        })
    }

    /// The record, then the children (`crate::flow`).
    fn publish_flow(&self, flow: ruststream_core::flow::OutFlow) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.conns.connect().await?;
            crate::flow::publish_flow(&self.conns, &self.routes, flow, Default::default(), false)
                .await
        })
    }

    /// `flow/done.lua` (`crate::flow`).
    fn flow_child<'a>(
        &'a self,
        headers: &'a ruststream_core::Headers,
        child_id: &'a str,
        outcome: ruststream_core::ChildOutcome,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.conns.connect().await?;
            crate::flow::child_done(&self.conns, headers, child_id, outcome).await
        })
    }

    /// One `HGETALL` of the record.
    fn read_flow<'a>(
        &'a self,
        record: &'a str,
    ) -> BoxFuture<'a, Result<Option<ruststream_core::FlowState>>> {
        Box::pin(async move {
            self.conns.connect().await?;
            crate::flow::read(self.conns.pool()?.next(), record).await
        })
    }
}

/// Step records are hashes beside their queue (`crate::steps`).
impl StepStore for RedisPublisher {
    fn read_steps<'a>(&'a self, source: &'a str, id: &'a str) -> BoxFuture<'a, Result<StepRecord>> {
        Box::pin(crate::steps::read_steps(&self.conns, source, id))
    }

    fn write_step<'a>(
        &'a self,
        source: &'a str,
        id: &'a str,
        name: &'a str,
        write: StepWrite,
    ) -> BoxFuture<'a, Result<Bytes>> {
        Box::pin(crate::steps::write_step(
            &self.conns,
            source,
            id,
            name,
            write,
        ))
    }

    fn begin_wait<'a>(
        &'a self,
        source: &'a str,
        id: &'a str,
        name: &'a str,
        timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<ruststream_core::Waited>> {
        let key = crate::steps::record_key(&self.conns, source, id);
        crate::steps::begin_wait(&self.conns, key, name, timeout)
    }

    fn steps_key(&self, source: &str, id: &str) -> String {
        crate::steps::record_key(&self.conns, source, id)
    }
}
