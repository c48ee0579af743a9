//! A Pub/Sub subscription as the broker sees it ([`Transport`]): its keys, the checks made at
//! startup, its description for the AsyncAPI document, its default route, what becomes of a
//! retry ([`NO_REDELIVERY`]), and opening its receiver (`receive.rs`). Sends no command itself.

use futures::future::BoxFuture;
use ruststream_core::{ChannelDoc, ConfigError, Result, Retries};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::publish::Publish;
use super::source::{Kind, MAX_BUFFER, RedisChannel};
use super::{receive, shard};
use crate::conn::Connections;
use crate::keys::{KeySpace, SourceKeys};
use crate::options::SourceOptions;
use crate::policy::PublishPolicy;
use crate::transport::{RedisReceiver, Transport};

/// The dead-letter reason of a message whose handler asked for a retry.
pub const NO_REDELIVERY: &str =
    "no-redelivery: pub/sub cannot redeliver (use a list or stream for retries)";

impl Transport for RedisChannel {
    fn key(&self) -> &str {
        &self.name
    }

    fn options(&self) -> &SourceOptions {
        &self.options
    }

    fn source_keys(&self, space: &KeySpace) -> SourceKeys {
        SourceKeys {
            name: self.name.clone(),
            transport: "pubsub",
            mode: self.kind.mode().to_owned(),
            queue: self.full_name(space),
            processing: None,
            recovery: None,
            settle_tokens: None,
            min_idle_ms: None,
            group: None,
            delayed: None,
            delayed_payloads: None,
            dead: space.dead(&self.name, &self.options.dead_letter),
            paused: None,
            concurrency: self.options.core.concurrency,
            partition_of: None,
            rate_limit: None,
            max_in_flight: None,
            levels: Vec::new(),
            groups: None,
        }
    }

    /// Pub/Sub stores nothing, so a retry goes to the dead-letter list with [`NO_REDELIVERY`].
    fn retries(&self) -> Retries {
        Retries::DeadLetter(NO_REDELIVERY)
    }

    fn describe(&self) -> ChannelDoc {
        let mut bindings = json!({
            "subscribe": self.kind.mode(),
            "delivery": "at-most-once",
        });
        if let Some(dead) = KeySpace::default().dead(&self.name, &self.options.dead_letter) {
            bindings["deadLetter"] = json!(dead);
        }
        ChannelDoc {
            address: self.name.clone(),
            transport: "pubsub",
            bindings,
        }
    }

    /// Its one key, the dead-letter list, is used alone (`LPUSH`): no slot rule applies, except
    /// that a sharded channel's dead letters are requeued by a script that `SPUBLISH`es them, so
    /// on a cluster its dead-letter list must share the channel's slot (the default one does).
    fn validate(&self, space: &KeySpace) -> Result<()> {
        let what = match self.kind {
            Kind::Channel | Kind::Sharded => "channel",
            Kind::Pattern => "pattern",
        };
        let name = &self.name;
        if name.is_empty() {
            return Err(ConfigError::new(
                what,
                format!("a RedisChannel has an empty {what}"),
                "name it",
            )
            .into());
        }
        self.options.validate(name)?;
        if self.buffer == 0 || self.buffer > MAX_BUFFER {
            return Err(ConfigError::new(
                "buffer",
                format!(
                    "must be between 1 and {MAX_BUFFER} messages (it is {})",
                    self.buffer
                ),
                format!("give a buffer from 1 to {MAX_BUFFER}"),
            )
            .on(name)
            .into());
        }
        if self.kind == Kind::Sharded {
            shard::validate(name, space, &self.options.dead_letter)?;
        }
        Ok(())
    }

    fn route(&self) -> Option<PublishPolicy> {
        match self.kind {
            Kind::Channel => Some(PublishPolicy::PubSub(Publish::new())),
            Kind::Sharded => Some(PublishPolicy::PubSub(Publish::sharded())),
            Kind::Pattern => None,
        }
    }

    fn prepare<'a>(&'a self, _: &'a Connections) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn open<'a>(
        &'a self,
        conns: &'a std::sync::Arc<Connections>,
        stop: CancellationToken,
    ) -> BoxFuture<'a, Result<RedisReceiver>> {
        Box::pin(receive::open(self, conns, stop))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_need_a_name_and_a_usable_buffer() {
        let cluster = KeySpace::new(String::new(), true);
        let check = |c: RedisChannel| c.validate(&cluster);
        assert!(check(RedisChannel::new("events")).is_ok());
        assert!(check(RedisChannel::pattern("events.*")).is_ok());
        let e = check(RedisChannel::new("")).unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(
            (config.option.as_ref(), config.subject.as_deref()),
            ("channel", None)
        );
        let e = check(RedisChannel::new("e").buffer(0)).unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "buffer");
        assert_eq!(config.subject.as_deref(), Some("e"));
        assert!(config.problem.contains("between 1 and"), "{e}");
        assert!(check(RedisChannel::new("e").buffer(MAX_BUFFER + 1)).is_err());
        assert!(check(RedisChannel::pattern("e.*").concurrency(0)).is_err());
        assert!(check(RedisChannel::new("e").block(std::time::Duration::ZERO)).is_err());
        assert!(check(RedisChannel::new("events").dead_letter("other")).is_ok());
    }

    #[test]
    fn dead_letter_defaults_to_the_name_dot_dead() {
        let dead = |c: &RedisChannel| {
            c.describe().bindings["deadLetter"]
                .as_str()
                .map(str::to_owned)
        };
        assert_eq!(
            dead(&RedisChannel::new("events")).as_deref(),
            Some("events.dead")
        );
        assert_eq!(
            dead(&RedisChannel::pattern("events.*")).as_deref(),
            Some("events.*.dead")
        );
        assert_eq!(dead(&RedisChannel::new("e").no_dead_letter()), None);
    }

    #[test]
    fn describe_says_channel_or_pattern() {
        let d = RedisChannel::new("events").describe();
        assert_eq!((d.transport, d.address.as_str()), ("pubsub", "events"));
        assert_eq!(d.bindings["subscribe"], "channel");
        assert_eq!(
            RedisChannel::pattern("e.*").describe().bindings["subscribe"],
            "pattern"
        );
        assert_eq!(
            RedisChannel::sharded("e").describe().bindings["subscribe"],
            "sharded"
        );
    }

    #[test]
    fn a_sharded_channel_routes_to_spublish_and_a_pattern_nowhere() {
        let route = |c: &RedisChannel| c.route();
        assert_eq!(
            route(&RedisChannel::sharded("o")),
            Some(PublishPolicy::PubSub(Publish::sharded()))
        );
        assert_eq!(
            route(&RedisChannel::new("o")),
            Some(PublishPolicy::PubSub(Publish::new()))
        );
        assert_eq!(route(&RedisChannel::pattern("o.*")), None);
        let keys = RedisChannel::sharded("o").source_keys(&KeySpace::default());
        assert_eq!((keys.transport, keys.mode.as_str()), ("pubsub", "sharded"));
    }
}
