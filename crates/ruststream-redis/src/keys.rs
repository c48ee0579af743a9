//! [`KeySpace`]: the one owner of key names (the broker's prefix, every name derived from a
//! subscription's key) and of the cluster's hash-slot rule. Sends no command.
//!
//! Names of a subscription on key `K` (prefixed with the broker's prefix):
//!
//! | name | what |
//! |---|---|
//! | `K` | the queue (list or stream), or a Pub/Sub channel |
//! | `K.processing` | a reliable list's claimed entries (or the name `.processing(..)` gives) |
//! | `K.delayed`, `K.delayed.payloads` | delayed publishes and retries waiting for their time |
//! | `K.dead` | dead letters, with a `reason` header (or the name `.dead_letter(..)` gives) |
//! | `K.cancels` | the queue's cancel record: message id → what the cancel did (`crate::cancel`); at most 10,000 ids, expires 24 h after the last cancel |
//! | `K.cancel` | the Pub/Sub channel a cancel signals a running message's id on (stores nothing) |
//! | `K.steps:<id>` | message `id`'s step records (`crate::steps`): at most 1,000 steps, removed by the settle that acknowledges or dead-letters it, else expires 7 days after its last write (a sleep's: after its wake-up) |
//! | `K.paused` | present while an operator has paused the subscription (`pause`/`resume`) |
//! | `K.rate` | a rate limit's state (`.rate_limit(n, per)`): a string, expires when idle |
//! | `K.rate.keys` | a per-key rate limit's state (`.rate_limit_by(..)`): a sorted set, key → its state |
//! | `K.history.m:<hour>` | the subscription's history of one hour, by the minute (`crate::history`); expires 25 h after its last write |
//! | `K.history.h:<day>` | the subscription's history of one day, by the hour; expires 31 days after its last write |
//! | `K.unique:<id>` | marks `id` as published to `K` within its `.unique_for(..)` window (expires with it) |
//! | `K.p1` … `K.p<n-1>` | a list with priority levels: level `i` (level 0 is `K` itself); also the name of the Pub/Sub channel that wakes its readers when the level gets an entry |
//!
//! On a cluster, every key one script touches must hash to one slot. A key with a hash tag passes
//! it on (`{thumbnails}.dead`); the default derived names of an untagged key put the whole key in
//! a tag (`app:uploads` → `{app:uploads}.dead`), which hashes like the untagged key itself, so
//! simple lists and streams need no tag. The processing list is never wrapped: an untagged
//! reliable queue is refused at startup with the tag to use.
//!
//! A command sent with fred's `custom` is routed to the node owning its key by [`slot_of`].

use fred::types::ClusterHash;
use ruststream_core::{ConfigError, Result};

/// Routes a command on a cluster to the node owning `key`'s slot. fred 10 honours only a
/// computed slot on a custom command: `ClusterHash::Offset` there is ignored and the command goes
/// by its first string argument (`EVALSHA`'s digest, `XREAD`'s `BLOCK`), to a node that answers
/// `MOVED`. fred follows the redirection after resynchronising the whole cluster map, and a
/// blocking read redirected so is no longer where fred's `CLIENT UNBLOCK` looks for it, so an
/// interrupt (a delayed entry's wake-up) left it waiting out its block.
pub(crate) fn slot_of(key: &str) -> ClusterHash {
    ClusterHash::from(key)
}

/// How a subscription names its dead-letter list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum DeadLetter {
    /// `K.dead`, in `K`'s slot.
    #[default]
    Default,
    /// A name the user gave (prefixed, not derived).
    Named(String),
    /// None: such messages are discarded, with a log.
    Off,
}

/// The broker's prefix and topology: every key name the broker sends comes from here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeySpace {
    prefix: String,
    cluster: bool,
}

impl KeySpace {
    pub(crate) fn new(prefix: String, cluster: bool) -> Self {
        Self { prefix, cluster }
    }

    /// The prefix put before every key (`""` when none).
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether keys one script uses together must share a hash slot.
    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The full (prefixed) name of the user's key `key`.
    pub(crate) fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// A name derived from the full key `full` by adding `suffix`, in `full`'s slot on a cluster.
    pub(crate) fn derived(&self, full: &str, suffix: &str) -> String {
        if self.cluster && !has_hash_tag(full) {
            format!("{{{full}}}{suffix}")
        } else {
            format!("{full}{suffix}")
        }
    }

    /// The delayed set of the full key `full`, its payload hash, and the set of the flows being
    /// published whose parent goes to `full` (the mover of `full` repairs them).
    pub(crate) fn delayed(&self, full: &str) -> Delayed {
        Delayed {
            set: self.derived(full, ".delayed"),
            payloads: self.derived(full, ".delayed.payloads"),
            publishing: self.publishing(full),
        }
    }

    /// The flows being published whose parent goes to the full key `full` (record key → start
    /// ms; `crate::flow`): `full.flows.publishing`, in `full`'s slot.
    pub(crate) fn publishing(&self, full: &str) -> String {
        self.derived(full, ".flows.publishing")
    }

    /// Priority level `level` (above 0) of the full list key `full`: `full.p<level>`, in
    /// `full`'s slot. The scripts and the publisher also `PUBLISH` on this name when the level
    /// gets an entry, to wake readers blocked on level 0.
    pub(crate) fn level(&self, full: &str, level: u8) -> String {
        self.derived(full, &format!(".p{level}"))
    }

    /// The step record of message `id` read from the full key `full` (`crate::steps`):
    /// `full.steps:<id>`, in `full`'s slot.
    pub(crate) fn steps(&self, full: &str, id: &str) -> String {
        self.derived(full, &format!(".steps:{id}"))
    }

    /// The cancel record of the full key `full` (`crate::cancel`), in its slot.
    pub(crate) fn cancels(&self, full: &str) -> String {
        self.derived(full, ".cancels")
    }

    /// The Pub/Sub channel a cancel of a running message of the full key `full` is signalled on.
    pub(crate) fn cancel_channel(&self, full: &str) -> String {
        self.derived(full, ".cancel")
    }

    /// The key whose existence pauses every reader of the full key `full`.
    pub(crate) fn paused(&self, full: &str) -> String {
        self.derived(full, ".paused")
    }

    /// The history hash of the full key `full` holding hour `hour` (since the epoch) at minute
    /// resolution (`crate::history`), in `full`'s slot.
    pub(crate) fn history_minutes(&self, full: &str, hour: i64) -> String {
        self.derived(full, &format!(".history.m:{hour}"))
    }

    /// The history hash of the full key `full` holding day `day` (since the epoch) at hour
    /// resolution (`crate::history`), in `full`'s slot.
    pub(crate) fn history_hours(&self, full: &str, day: i64) -> String {
        self.derived(full, &format!(".history.h:{day}"))
    }

    /// The full dead-letter list of the user's key `key`, as `dead` says; `None` when off.
    pub(crate) fn dead(&self, key: &str, dead: &DeadLetter) -> Option<String> {
        match dead {
            DeadLetter::Default => Some(self.derived(&self.key(key), ".dead")),
            DeadLetter::Named(name) => Some(self.key(name)),
            DeadLetter::Off => None,
        }
    }

    /// The full processing list of the user's key `key`: `named`, or `key.processing`, never
    /// wrapped in a tag (the queue's own tag must carry it).
    pub(crate) fn processing(&self, key: &str, named: Option<&str>) -> String {
        match named {
            Some(name) => self.key(name),
            None => self.key(&format!("{key}.processing")),
        }
    }

    /// On a cluster, checks that `keys` (full names used together by the subscription on the
    /// user's key `source`) hash to one slot. The error names the keys, their slots and the tag.
    pub(crate) fn check_same_slot(&self, source: &str, keys: &[String]) -> Result<()> {
        if !self.cluster {
            return Ok(());
        }
        let Some(first) = keys.first() else {
            return Ok(());
        };
        let slot = fred::util::redis_keyslot(first.as_bytes());
        for k in &keys[1..] {
            let other = fred::util::redis_keyslot(k.as_bytes());
            if other != slot {
                let tag = suggested_tag(source);
                return Err(ConfigError::new(
                    "key",
                    format!(
                        "keys `{first}` (slot {slot}) and `{k}` (slot {other}) are used together in one script but fall in different hash slots of the cluster"
                    ),
                    format!(
                        "put the queue in a hash tag: `{tag}` (derived names such as `{tag}.processing` inherit it), and name any custom processing, dead-letter or recovery key with the same tag"
                    ),
                )
                .on(source)
                .into());
            }
        }
        Ok(())
    }
}

/// Every key of one subscription, by full name (prefixed, tagged as the cluster needs): what the
/// operator tools read and change, and what the startup log shows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SourceKeys {
    /// The subscription's key (or channel) as the user named it.
    pub name: String,
    /// `list`, `stream` or `pubsub`.
    pub transport: &'static str,
    /// `simple`, `reliable`, `reliable, no recovery`, `group <g>`, `channel`, `pattern` or
    /// `sharded`.
    pub mode: String,
    /// The queue: a list, a stream, or a channel (or pattern) name.
    pub queue: String,
    /// A reliable list's processing list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processing: Option<String>,
    /// A reliable list's recovery set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery: Option<String>,
    /// A reliable list without recovery: the settle tokens already used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settle_tokens: Option<String>,
    /// With crash recovery (reliable lists, streams): how long a dead worker's entries take to
    /// come back, in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_idle_ms: Option<u64>,
    /// A stream's consumer group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The delayed set (lists and streams).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delayed: Option<String>,
    /// The delayed set's payload hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delayed_payloads: Option<String>,
    /// The dead-letter list, unless dead letters are off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead: Option<String>,
    /// A list with priority levels: the keys of levels 1 … n-1 (level 0 is [`queue`](Self::queue)).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub levels: Vec<String>,
    /// A list with fair groups: its ring of non-empty groups (`crate::list::groups`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups: Option<String>,
    /// The key whose existence pauses the subscription (lists and streams).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
    /// Most handlers running at once, per process.
    pub concurrency: usize,
    /// On a queue spread over partitions, this is one partition (named after its key, e.g.
    /// `{jobs:0}`), and this is the queue's name (`jobs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition_of: Option<String>,
    /// Its rate limit (`.rate_limit`, `.rate_limit_by`) and the limiter's key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateKeys>,
    /// Its concurrency cap across workers (`.max_in_flight(n)`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
}

/// A subscription's rate limit as the operator reads it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RateKeys {
    /// Most messages per period.
    pub n: u32,
    /// The period, in ms.
    pub per_ms: u64,
    /// A per-key limit: the header naming each message's key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_header: Option<String>,
    /// The limiter's key: `K.rate` (a string), or `K.rate.keys` per key (a sorted set).
    pub key: String,
}

impl SourceKeys {
    /// How entries are taken, in words: `simple (popped: at most once)`, `reliable with
    /// recovery (min_idle 30s)`, `group \`g\`, without recovery`, `subscribe (at most once)`,
    /// `ssubscribe (sharded, at most once)`.
    pub fn mode_in_words(&self) -> String {
        let idle = self
            .min_idle_ms
            .map(|ms| format!("{:?}", std::time::Duration::from_millis(ms)));
        match (self.transport, self.mode.as_str(), idle) {
            ("list", "simple", _) => "simple (popped: at most once)".to_owned(),
            ("list", _, Some(idle)) => format!("reliable with recovery (min_idle {idle})"),
            ("list", _, None) => "reliable without recovery".to_owned(),
            ("stream", _, Some(idle)) => format!(
                "group `{}`, recovering entries pending over {idle}",
                self.group.as_deref().unwrap_or_default()
            ),
            ("stream", _, None) => format!(
                "group `{}`, without recovery",
                self.group.as_deref().unwrap_or_default()
            ),
            (_, "pattern", _) => "psubscribe (at most once)".to_owned(),
            (_, "sharded", _) => "ssubscribe (sharded, at most once)".to_owned(),
            _ => "subscribe (at most once)".to_owned(),
        }
    }

    /// Every key as `name=key` pairs: `queue=app:jobs processing=app:jobs.processing ...`.
    pub fn key_list(&self) -> String {
        let queue = match (self.transport, self.mode.as_str()) {
            ("stream", _) => "stream",
            ("pubsub", "pattern") => "pattern",
            ("pubsub", _) => "channel",
            _ => "queue",
        };
        [
            (queue, Some(&self.queue)),
            ("processing", self.processing.as_ref()),
            ("claims", self.recovery.as_ref()),
            ("settles", self.settle_tokens.as_ref()),
            ("dead", self.dead.as_ref()),
            ("delayed", self.delayed.as_ref()),
        ]
        .into_iter()
        .filter_map(|(name, key)| Some(format!("{name}={}", key?)))
        .collect::<Vec<_>>()
        .join(" ")
    }
}

/// A delayed set and its payload hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delayed {
    /// Message id → due time (ms since the epoch).
    pub(crate) set: String,
    /// Message id → frame.
    pub(crate) payloads: String,
    /// Flows being published whose parent goes here: record key → when last started or taken
    /// for repair (ms).
    pub(crate) publishing: String,
}

/// Whether Redis Cluster hashes only part of `key`: a `{` followed later by a `}` with
/// something between them.
fn has_hash_tag(key: &str) -> bool {
    key.find('{')
        .is_some_and(|open| key[open + 1..].find('}').is_some_and(|len| len > 0))
}

/// The key with its hash-tag part in braces: `jobs` -> `{jobs}`, `{jobs}` stays.
fn suggested_tag(key: &str) -> String {
    if has_hash_tag(key) {
        key.to_owned()
    } else {
        format!("{{{key}}}")
    }
}

/// The full key of job `id`'s record (`crate::results`).
pub(crate) fn job_key(prefix: &str, id: &str) -> String {
    format!("{prefix}ruststream:job:{{{id}}}")
}

/// `text` with the glob characters of `SCAN MATCH` and `PSUBSCRIBE` (`*`, `?`, `[`, `]`, `\`)
/// `\`-escaped, so that a pattern built from it matches only `text` itself there.
pub(crate) fn escape_glob(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(escape_glob("app:"), "app:");
        assert_eq!(escape_glob("{orders}.flow:"), "{orders}.flow:");
        assert_eq!(escape_glob("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn derived_names_stay_in_the_slot_of_their_key() {
        let cluster = KeySpace::new("app:".into(), true);
        let full = cluster.key("cache.warmups");
        assert_eq!(
            cluster.delayed(&full).set,
            "{app:cache.warmups}.delayed".to_owned()
        );
        assert_eq!(
            cluster.dead("cache.warmups", &DeadLetter::Default),
            Some("{app:cache.warmups}.dead".to_owned())
        );
        assert_eq!(cluster.derived("{t}", ".dead"), "{t}.dead");
        let standalone = KeySpace::new(String::new(), false);
        assert_eq!(standalone.derived("q", ".dead"), "q.dead");
        assert_eq!(standalone.dead("q", &DeadLetter::Off), None);
        assert_eq!(
            standalone.dead("q", &DeadLetter::Named("failed".into())),
            Some("failed".into())
        );
        assert_eq!(standalone.processing("q", None), "q.processing");
        assert_eq!(standalone.level("q", 2), "q.p2");
        assert_eq!(cluster.level("app:jobs", 1), "{app:jobs}.p1");
        assert_eq!(cluster.level("{t}", 3), "{t}.p3");
        assert_eq!(
            cluster.history_minutes("app:jobs", 7),
            "{app:jobs}.history.m:7"
        );
        assert_eq!(standalone.history_hours("q", 3), "q.history.h:3");
    }

    #[test]
    fn the_slot_rule_names_keys_slots_and_tag() {
        let space = KeySpace::new(String::new(), true);
        let keys = vec!["jobs".to_owned(), "jobs.processing".to_owned()];
        let e = space.check_same_slot("jobs", &keys).unwrap_err();
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "key");
        assert_eq!(config.subject.as_deref(), Some("jobs"));
        assert!(
            config.problem.contains("`jobs` (slot ")
                && config.problem.contains("`jobs.processing` (slot "),
            "{e}"
        );
        assert!(config.fix.contains("hash tag: `{jobs}`"), "{e}");
        let tagged = vec!["{t}".to_owned(), "{t}.processing".to_owned()];
        assert!(space.check_same_slot("{t}", &tagged).is_ok());
        let standalone = KeySpace::new(String::new(), false);
        assert!(standalone.check_same_slot("jobs", &keys).is_ok());
    }
}
