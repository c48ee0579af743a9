//! A stream subscription as the broker sees it ([`Transport`]): its keys, the checks made at
//! startup, its description for the AsyncAPI document, creating its consumer group
//! (`XGROUP CREATE key group 0 MKSTREAM`, an existing group is kept; at `maxmemory`,
//! `XINFO GROUPS key` to see that it exists), and opening its receiver (`receive.rs`).

use crate::keys::slot_of;
use fred::prelude::*;
use futures::future::BoxFuture;
use ruststream_core::{ChannelDoc, ConfigError, ErrorKind, Result};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::receive;
use super::source::RedisStream;
use crate::conn::Connections;
use crate::keys::{KeySpace, SourceKeys};
use crate::options::SourceOptions;
use crate::policy::PublishPolicy;
use crate::queue_options::QueueOptions;
use crate::transport::{RedisReceiver, Transport};

impl Transport for RedisStream {
    fn key(&self) -> &str {
        &self.key
    }

    fn options(&self) -> &SourceOptions {
        &self.options
    }

    fn describe(&self) -> ChannelDoc {
        ChannelDoc {
            address: self.key.clone(),
            transport: "stream",
            bindings: {
                let mut b = json!({ "group": self.group_name() });
                if let Some(n) = self.partitions {
                    b["partitions"] = json!(n);
                }
                self.queue.describe(&mut b);
                b
            },
        }
    }

    fn source_keys(&self, space: &KeySpace) -> SourceKeys {
        let keys = self.keys(space);
        let rate_limit = self
            .queue
            .rate
            .as_ref()
            .map(|r| r.keys(space, &keys.stream));
        SourceKeys {
            name: self.key.clone(),
            transport: "stream",
            mode: format!("group {}", self.group_name()),
            paused: Some(space.paused(&keys.stream)),
            queue: keys.stream,
            processing: None,
            recovery: None,
            settle_tokens: None,
            min_idle_ms: (!self.queue.no_recovery)
                .then(|| u64::try_from(self.queue.idle().as_millis()).unwrap_or(u64::MAX)),
            group: Some(self.group_name().to_owned()),
            delayed: Some(keys.delayed.set),
            delayed_payloads: Some(keys.delayed.payloads),
            dead: keys.dead,
            concurrency: self.options.core.concurrency,
            partition_of: None,
            rate_limit,
            max_in_flight: self.queue.max_in_flight,
            levels: Vec::new(),
            groups: None,
        }
    }

    fn validate(&self, space: &KeySpace) -> Result<()> {
        let key = &self.key;
        if self.group.as_deref().is_none_or(str::is_empty) {
            return Err(ConfigError::new(
                "group",
                "a stream subscription needs a consumer group",
                "add `.group(\"name\")`",
            )
            .on(key)
            .into());
        }
        self.options.validate(key)?;
        let refuse =
            |option: &'static str, problem: &'static str, fix: &'static str| -> Result<()> {
                Err(ConfigError::new(option, problem, fix).on(key).into())
            };
        if self.queue.no_recovery && self.queue.min_idle.is_some() {
            return refuse(
                "no_recovery",
                "no_recovery turns crash recovery off, so min_idle does not apply",
                "remove one or the other",
            );
        }
        if self.readers == Some(0) {
            return refuse("readers", "must be at least 1", "set it to 1 or more");
        }
        if self.partitions.is_some() && self.readers.is_some_and(|n| n > 1) {
            return refuse(
                "readers",
                "a stream with partitions reads them all with one reader",
                "remove `.readers(n)`",
            );
        }
        if self.trim_acked.is_some_and(|d| d.is_zero()) {
            return refuse(
                "trim_acked",
                "needs a period longer than zero: it runs a script each period",
                "give a period such as 10 s",
            );
        }
        if self.queue.min_idle.is_some_and(|d| d.is_zero()) {
            return refuse(
                "min_idle",
                "must be longer than zero, or every pending entry is claimed at once",
                "give how long a dead reader's entries take to come back, e.g. `.min_idle(Duration::from_secs(60))`",
            );
        }
        let cannot = self.partitions.is_some().then_some((
            "cannot span partitions (each partition's pending entries are in its own slot, and no one script sees them all)",
            "cap a stream without partitions, or lower each instance's `.concurrency(n)`",
        ));
        self.queue.validate(key, cannot)?;
        if let Some(n) = self.partitions {
            let named = matches!(self.options.dead_letter, crate::keys::DeadLetter::Named(_));
            let named: &[&str] = if named { &["dead_letter"] } else { &[] };
            crate::partition::validate(key, n, named)?;
            return self.partitions().iter().try_for_each(|p| p.validate(space));
        }
        space.check_same_slot(key, &self.keys(space).used_together())
    }

    fn route(&self) -> Option<PublishPolicy> {
        let publish = crate::policy::StreamPublish::new();
        Some(PublishPolicy::Stream(match self.partitions {
            Some(n) => publish.partitions(n),
            None => publish,
        }))
    }

    fn partitions(&self) -> Vec<Box<dyn Transport>> {
        crate::partition::transports(&self.key, self.partitions, |key| Self {
            key,
            partitions: None,
            partition_of: Some(self.key.clone()),
            // The limit holds over the whole stream: the partitions' reader reserves from it.
            queue: QueueOptions {
                rate: None,
                ..self.queue.clone()
            },
            ..self.clone()
        })
    }

    fn limiter(&self, space: &KeySpace) -> Option<crate::claim::limit::Limiter> {
        self.partitions?;
        self.queue.whole_limiter(space, &self.key)
    }

    /// Creates the consumer group (and the stream) if missing.
    fn prepare<'a>(&'a self, conns: &'a Connections) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let key = conns.keys.key(&self.key);
            let client = conns.pool()?.next().clone();
            create_group(&client, &key, self.group_name()).await?;
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

/// Creates the consumer group `group` of the stream `key` (and the stream) if missing, reading
/// from the stream's start: `XGROUP CREATE key group 0 MKSTREAM`. Whether it was missing.
pub(super) async fn create_group(client: &Client, key: &str, group: &str) -> Result<bool> {
    let r: Result<Value, _> = client
        .custom(
            fred::cmd!("XGROUP", hash: slot_of(key)),
            vec!["CREATE", key, group, "0", "MKSTREAM"],
        )
        .await;
    match r {
        Ok(_) => Ok(true),
        Err(e) if crate::error::kind_of(&e) == ErrorKind::GroupExists => Ok(false),
        // At maxmemory Redis refuses XGROUP CREATE before looking, even for a group that
        // exists; an existing group is all the consumer needs to drain the stream.
        Err(e)
            if crate::error::kind_of(&e) == ErrorKind::OutOfMemory
                && has_group(client, key, group).await =>
        {
            Ok(false)
        }
        Err(e) => {
            let message = format!(
                "cannot create consumer group `{group}` on stream `{key}`: {}",
                crate::error::redact(e.details())
            );
            Err(crate::error::core_as(e, message))
        }
    }
}

/// Whether the stream `key` has the consumer group `group` (`XINFO GROUPS`).
async fn has_group(client: &Client, key: &str, group: &str) -> bool {
    let groups: Result<Value, _> = client
        .custom(fred::cmd!("XINFO", hash: slot_of(key)), vec!["GROUPS", key])
        .await;
    let Ok(Value::Array(groups)) = groups else {
        return false;
    };
    groups.into_iter().any(|g| {
        pairs(g)
            .iter()
            .any(|(k, v)| k == "name" && v.as_str().as_deref() == Some(group))
    })
}

/// The fields of one `XINFO` record (a flat array of names and values, or a map).
pub(crate) fn pairs(record: Value) -> Vec<(String, Value)> {
    match record {
        Value::Array(fields) => {
            let mut out = Vec::with_capacity(fields.len() / 2);
            let mut it = fields.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k.as_string().unwrap_or_default(), v));
            }
            out
        }
        Value::Map(map) => map
            .inner()
            .into_iter()
            .map(|(k, v)| (k.as_str().map(str::to_owned).unwrap_or_default(), v))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_readers_from_the_default_concurrency_one_with_partitions() {
        let space = KeySpace::new(String::new(), false);
        let stream = || RedisStream::new("s").group("g");
        assert_eq!(stream().reader_count(), 2);
        assert_eq!(stream().concurrency(127).reader_count(), 1);
        assert_eq!(stream().concurrency(16).readers(3).reader_count(), 3);
        assert_eq!(stream().partitions(2).reader_count(), 1);
        let e = stream().readers(0).validate(&space).unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "readers");
        assert_eq!(config.subject.as_deref(), Some("s"));
        assert!(config.problem.contains("at least 1"), "{e}");
        let e = stream()
            .partitions(2)
            .readers(2)
            .validate(&space)
            .unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "readers");
        assert!(config.problem.contains("one reader"), "{e}");
    }

    #[test]
    fn a_cap_cannot_span_partitions_and_one_rate_limit_holds_over_them() {
        let space = KeySpace::new(String::new(), false);
        let stream = || RedisStream::new("s").group("g").partitions(2);
        let capped = stream().max_in_flight(3).validate(&space);
        let e = capped.unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "max_in_flight");
        assert!(config.problem.contains("cannot span partitions"), "{e}");
        let limited = stream().rate_limit(5, std::time::Duration::from_secs(1));
        assert_eq!(
            limited.limiter(&space).map(|l| l.key),
            Some("s.rate".into())
        );
        let parts = Transport::partitions(&limited);
        assert_eq!(parts.len(), 2);
        for part in parts {
            let bindings = part.describe().bindings;
            assert!(bindings.get("rateLimit").is_none(), "{bindings}");
        }
    }

    #[test]
    fn untagged_streams_keep_derived_keys_in_their_slot() {
        let cluster = KeySpace::new(String::new(), true);
        assert!(
            RedisStream::new("uploads")
                .group("g")
                .validate(&cluster)
                .is_ok()
        );
        let named = RedisStream::new("uploads").group("g").dead_letter("failed");
        assert!(named.validate(&cluster).is_err());
        let e = RedisStream::new("uploads").validate(&cluster).unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "group");
        assert_eq!(config.subject.as_deref(), Some("uploads"));
    }
}
