//! A list subscription as the broker sees it ([`Transport`]): its keys, the checks made at
//! startup, its description for the AsyncAPI document, and opening its receiver (`receive.rs`
//! reads). At start, `LLEN processing` of a reliable list without recovery, to warn of the
//! entries a dead worker left there.

use fred::prelude::*;
use futures::future::BoxFuture;
use ruststream_core::{ChannelDoc, ConfigError, Result, Retries};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::source::{Mode, RedisList};
use super::{Publish, levels, receive};
use crate::conn::Connections;
use crate::keys::{DeadLetter, KeySpace, SourceKeys};
use crate::options::SourceOptions;
use crate::policy::{ListLayout, PublishPolicy};
use crate::queue_options::QueueOptions;
use crate::transport::{RedisReceiver, Transport};

impl Transport for RedisList {
    fn key(&self) -> &str {
        &self.key
    }

    fn options(&self) -> &SourceOptions {
        &self.options
    }

    fn describe(&self) -> ChannelDoc {
        let mut bindings = json!({
            "mode": match self.mode { Mode::Simple => "simple", Mode::Reliable => "reliable" },
        });
        if let Some(n) = self.layout.partitions {
            bindings["partitions"] = json!(n);
        }
        self.queue.describe(&mut bindings);
        if let Some(n) = self.layout.priorities {
            bindings["priorities"] = json!(n);
        }
        if self.layout.groups {
            bindings["groups"] = json!(true);
        }
        if let Some(n) = self.group_max_in_flight {
            bindings["groupMaxInFlight"] = json!(n);
        }
        if self.mode == Mode::Reliable {
            bindings["processing"] = json!(self.processing_key());
        }
        if self.mode == Mode::Reliable && !self.queue.no_recovery {
            let zset = self
                .recovery_zset
                .clone()
                .unwrap_or_else(|| format!("{}.claims", self.key));
            bindings["recoveryZset"] = json!(zset);
        }
        ChannelDoc {
            address: self.key.clone(),
            transport: "list",
            bindings,
        }
    }

    fn source_keys(&self, space: &KeySpace) -> SourceKeys {
        let keys = self.keys(space);
        let mode = match (self.mode, self.queue.no_recovery) {
            (Mode::Simple, _) => "simple",
            (Mode::Reliable, false) => "reliable",
            (Mode::Reliable, true) => "reliable, no recovery",
        };
        let rate_limit = self.queue.rate.as_ref().map(|r| r.keys(space, &keys.queue));
        SourceKeys {
            name: self.key.clone(),
            transport: "list",
            mode: mode.to_owned(),
            paused: Some(space.paused(&keys.queue)),
            levels: keys.levels,
            groups: keys.ring,
            queue: keys.queue,
            processing: keys.processing,
            min_idle_ms: keys
                .recovery
                .is_some()
                .then(|| u64::try_from(self.queue.idle().as_millis()).unwrap_or(u64::MAX)),
            recovery: keys.recovery,
            settle_tokens: keys.settle_tokens,
            group: None,
            delayed: Some(keys.delayed.set),
            delayed_payloads: Some(keys.delayed.payloads),
            dead: keys.dead,
            concurrency: self.options.core.concurrency,
            partition_of: None,
            rate_limit,
            max_in_flight: self.queue.max_in_flight,
        }
    }

    fn partitions(&self) -> Vec<Box<dyn Transport>> {
        crate::partition::transports(&self.key, self.layout.partitions, |key| Self {
            key,
            layout: ListLayout {
                partitions: None,
                ..self.layout
            },
            // The limit holds over the whole queue: the partitions' reader reserves from it.
            queue: QueueOptions {
                rate: None,
                ..self.queue.clone()
            },
            ..self.clone()
        })
    }

    fn limiter(&self, space: &KeySpace) -> Option<crate::claim::limit::Limiter> {
        self.layout.partitions?;
        self.queue.whole_limiter(space, &self.key)
    }

    /// A partitioned list's publishers spread messages over its partitions; one with priority
    /// levels lets them publish onto its levels.
    fn route(&self) -> Option<PublishPolicy> {
        if self.layout.is_plain() {
            return None;
        }
        Some(PublishPolicy::List(Publish {
            layout: self.layout,
            ..Publish::new()
        }))
    }

    /// A simple list popped the entry before its handler ran: a retry settles nothing.
    fn retries(&self) -> Retries {
        match self.mode {
            Mode::Simple => Retries::Ignored,
            Mode::Reliable => Retries::Redeliver,
        }
    }

    fn validate(&self, space: &KeySpace) -> Result<()> {
        let key = &self.key;
        if key.is_empty() {
            return Err(
                ConfigError::new("key", "a RedisList has an empty key", "name the list").into(),
            );
        }
        let cannot = match (self.mode, self.layout.partitions) {
            (Mode::Simple, _) => Some((
                "needs a reliable list (a pop records nothing in flight to count)",
                "add `.reliable()`",
            )),
            (_, Some(_)) => Some((
                "cannot span partitions (each partition records its claims in its own slot, and no one script sees them all)",
                "cap a queue without partitions, or lower each instance's `.concurrency(n)`",
            )),
            _ => None,
        };
        self.queue.validate(key, cannot)?;
        let per_key = self
            .queue
            .rate
            .as_ref()
            .is_some_and(|r| r.header().is_some());
        if self.layout.partitions.is_some() && per_key {
            return Err(ConfigError::new(
                "rate_limit_by",
                "a per-key rate limit cannot span partitions (it looks at each entry's key inside the claim, and the entries live in the partitions' slots, the limiter in another)",
                "use `.rate_limit(n, per)` for the whole queue, or a per-key limit without partitions",
            )
            .on(key)
            .into());
        }
        levels::check(key, self.layout.priorities)?;
        if self.layout.groups && self.layout.priorities.is_some() {
            return Err(ConfigError::new(
                "groups",
                "fair groups and priority levels do not combine (a claim takes round robin over the groups, not highest level first)",
                "give each priority a queue of its own with groups, or drop `.priorities(n)`",
            )
            .on(key)
            .into());
        }
        crate::claim::cap::validate(key, "group_max_in_flight", self.group_max_in_flight, cannot)?;
        if let Some(n) = self.layout.partitions {
            let named = [
                ("processing", self.processing.is_some()),
                ("recovery_zset", self.recovery_zset.is_some()),
                (
                    "dead_letter",
                    matches!(self.options.dead_letter, DeadLetter::Named(_)),
                ),
            ];
            let named: Vec<&str> = named.iter().filter(|n| n.1).map(|n| n.0).collect();
            crate::partition::validate(key, n, &named)?;
            return self.partitions().iter().try_for_each(|p| p.validate(space));
        }
        self.options.validate(key)?;
        if self.mode == Mode::Simple && self.processing.is_some() {
            return Err(ConfigError::new(
                "processing",
                "needs a reliable list",
                "add `.reliable()`",
            )
            .on(key)
            .into());
        }
        self.check_recovery()?;
        if self.mode == Mode::Reliable && self.processing_key() == *key {
            return Err(ConfigError::new(
                "processing",
                "the processing list must differ from the queue",
                "name another list, or leave it unset for the default",
            )
            .on(key)
            .into());
        }
        space.check_same_slot(key, &self.keys(space).used_together())
    }

    /// A reliable list without recovery says how many entries sit in its processing list
    /// (`LLEN`): nobody can tell which of them belong to a worker that died.
    fn prepare<'a>(&'a self, conns: &'a Connections) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let keys = self.keys(&conns.keys);
            if let (Some(processing), None) = (&keys.processing, &keys.recovery) {
                let held: i64 = conns
                    .pool()?
                    .next()
                    .llen(processing)
                    .await
                    .map_err(crate::error::core)?;
                if held > 0 {
                    tracing::warn!(queue = %keys.queue, %processing, entries = held,
                        "this reliable list runs without crash recovery (no_recovery): entries in its processing list stay there if their worker died; move them back by hand (LMOVE) once no worker holds them");
                }
            }
            Ok(())
        })
    }

    fn open<'a>(
        &'a self,
        conns: &'a std::sync::Arc<Connections>,
        stop: CancellationToken,
    ) -> BoxFuture<'a, Result<RedisReceiver>> {
        Box::pin(receive::open(self, conns, stop))
    }
}
