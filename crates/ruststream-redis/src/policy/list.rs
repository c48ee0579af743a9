//! [`ListPublish`], how a message is pushed onto a list. Sends no command.

use std::time::Duration;

use ruststream_core::{ConfigError, Durability};

use super::layout::{ListLayout, list_layout_setters};
use super::setters::durable_setter;

/// How a message is pushed onto a list: `LPUSH`, and with [`ttl`](Self::ttl) the key's expiry
/// re-armed in the same script, so a queue nobody feeds expires with what is left in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[must_use]
pub struct ListPublish {
    pub(crate) ttl: Option<Duration>,
    /// Its partitions, priority levels and groups, as the list's subscription has them.
    #[serde(flatten)]
    pub(crate) layout: ListLayout,
    /// The level one group of messages goes onto: set per message by the publisher (see
    /// `list::levels::place`), 0 in a route.
    pub(crate) level: u8,
    pub(crate) durable: Option<Durability>,
}

list_layout_setters!(ListPublish);
durable_setter!(ListPublish);

impl ListPublish {
    /// Plain `LPUSH`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Re-arms the list's expiry to `ttl` on every push.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Whether the policy can be sent, for the destination `key`; the error says what to fix.
    ///
    /// # Errors
    /// Priority levels outside 2 ..= [`MAX_PRIORITIES`](super::MAX_PRIORITIES).
    pub fn check(&self, key: &str) -> Result<(), ConfigError> {
        self.layout.check(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flow's stored plan holds its routes as JSON (`crate::flow::plan`): the layout's fields
    /// stay at the top level, so a plan written by either shape reads the same.
    #[test]
    fn a_routes_json_keeps_the_layout_at_the_top_level() {
        let route = ListPublish::new().partitions(2).priorities(3).groups();
        let flat = serde_json::json!({
            "ttl": null, "partitions": 2, "priorities": 3, "level": 0, "durable": null, "groups": true
        });
        assert_eq!(serde_json::to_value(route).unwrap(), flat);
        assert_eq!(serde_json::from_value::<ListPublish>(flat).unwrap(), route);
    }
}
