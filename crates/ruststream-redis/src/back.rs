//! The way back to a queue: [`Dest`], a destination as `back.lua` takes it, the one Lua part
//! through which every script that puts an entry onto a queue does it (a retry, the recovery
//! sweep, the delayed mover, the operator's requeue, a unique publish). The destination's shape
//! (a list's levels and ttl, a stream's bound, a channel) is written here and in `back.lua`
//! only.
//!
//! Sends no command: the scripts that take a [`Dest`] send `LPUSH`/`RPUSH` (+ `PUBLISH` on a
//! level's first entry, `PEXPIRE` with a ttl), `XADD` + `XTRIM`, `PUBLISH` or `SPUBLISH`.

use fred::prelude::*;

use crate::lua;

/// Where a script puts entries: one queue, as `back.lua`'s `dest_of` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dest {
    /// A list: its levels' full keys, lowest first (the queue alone without levels), and its
    /// ttl in ms, set after a put (0: none).
    List {
        /// The levels, lowest first.
        levels: Vec<String>,
        /// The list's ttl in ms (0: none).
        ttl_ms: i64,
    },
    /// A stream, trimmed to `bound` (`stream/bound.lua`'s spec, `""`: none) after a put.
    Stream {
        /// The stream's full key.
        key: String,
        /// Its bound.
        bound: String,
    },
    /// A sharded Pub/Sub channel (`SPUBLISH`; in the cluster its slot is a key's).
    Sharded {
        /// The channel's full name.
        channel: String,
    },
    /// A plain Pub/Sub channel (`PUBLISH`, any node).
    PubSub {
        /// The channel's full name.
        channel: String,
    },
}

impl Dest {
    /// A list without a ttl: its levels, lowest first.
    pub fn list(levels: Vec<String>) -> Self {
        Self::List { levels, ttl_ms: 0 }
    }

    /// The destination's first key (a list's level 0), if it has one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::List { levels, .. } => levels.first().map(String::as_str),
            Self::Stream { key, .. } => Some(key),
            Self::Sharded { channel } => Some(channel),
            Self::PubSub { .. } => None,
        }
    }

    /// The destination as one line-separated string (kind, spec, keys), for a header that
    /// names where an entry goes later (a flow's parent, `crate::flow`); read back by
    /// [`decode`](Self::decode).
    pub(crate) fn encode(&self) -> String {
        let (kind, spec, keys): (&str, String, Vec<&str>) = match self {
            Self::List { levels, ttl_ms } => (
                "list",
                ttl_ms.to_string(),
                levels.iter().map(String::as_str).collect(),
            ),
            Self::Stream { key, bound } => ("stream", bound.clone(), vec![key.as_str()]),
            Self::Sharded { channel } => ("sharded", String::new(), vec![channel.as_str()]),
            Self::PubSub { channel } => ("pubsub", channel.clone(), Vec::new()),
        };
        let mut out = format!("{kind}\n{spec}");
        for k in keys {
            out.push('\n');
            out.push_str(k);
        }
        out
    }

    /// The destination [`encode`](Self::encode) wrote; `None` when `s` is not one.
    pub(crate) fn decode(s: &str) -> Option<Self> {
        let mut parts = s.split('\n');
        let (kind, spec) = (parts.next()?, parts.next()?.to_owned());
        let keys: Vec<String> = parts.map(str::to_owned).collect();
        match (kind, keys.len()) {
            ("list", 1..) => Some(Self::List {
                levels: keys,
                ttl_ms: spec.parse().ok()?,
            }),
            ("stream", 1) => Some(Self::Stream {
                key: keys.into_iter().next()?,
                bound: spec,
            }),
            ("sharded", 1) => Some(Self::Sharded {
                channel: keys.into_iter().next()?,
            }),
            ("pubsub", 0) => Some(Self::PubSub { channel: spec }),
            _ => None,
        }
    }

    /// Appends the destination's keys to `keys` and `kind, number of keys, spec` to `args`.
    pub(crate) fn push(&self, keys: &mut Vec<String>, args: &mut Vec<Value>) {
        let before = keys.len();
        let (kind, spec): (&'static str, Value) = match self {
            Self::List { levels, ttl_ms } => {
                keys.extend(levels.iter().cloned());
                ("list", Value::from(ttl_ms.to_string()))
            }
            Self::Stream { key, bound } => {
                keys.push(key.clone());
                ("stream", Value::from(bound.as_str()))
            }
            Self::Sharded { channel } => {
                keys.push(channel.clone());
                ("sharded", Value::from_static_str(""))
            }
            Self::PubSub { channel } => ("pubsub", Value::from(channel.as_str())),
        };
        let n = keys.len() - before;
        args.extend([Value::from_static_str(kind), lua::int(n), spec]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_writes_its_keys_and_three_arguments() {
        let (mut keys, mut args) = (Vec::new(), Vec::new());
        Dest::list(vec!["q".into(), "q.p1".into()]).push(&mut keys, &mut args);
        Dest::PubSub {
            channel: "c".into(),
        }
        .push(&mut keys, &mut args);
        assert_eq!(keys, ["q", "q.p1"]);
        for d in [
            Dest::list(vec!["q".into(), "q.p1".into()]),
            Dest::Stream {
                key: "s".into(),
                bound: "maxlen:5".into(),
            },
            Dest::PubSub {
                channel: "c".into(),
            },
        ] {
            assert_eq!(Dest::decode(&d.encode()), Some(d));
        }
        assert_eq!(Dest::decode("list\n0"), None);
        assert_eq!(
            args,
            [
                Value::from("list"),
                Value::Integer(2),
                Value::from("0"),
                Value::from("pubsub"),
                Value::Integer(0),
                Value::from("c"),
            ]
        );
    }
}
