//! The values the keyspace holds beyond strings, lists and hashes: sorted sets with their score
//! order and ranges, and streams with consumer groups and pending entries.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use bytes::Bytes;

use super::{R, err};

/// A score with the total order Redis uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Score(pub(crate) f64);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A sorted set: members ordered by score, then bytewise.
#[derive(Debug, Clone, Default)]
pub(crate) struct ZSet {
    pub(crate) by_member: HashMap<Bytes, f64>,
    pub(crate) ordered: BTreeSet<(Score, Bytes)>,
}

impl ZSet {
    /// Adds or updates; returns whether the member is new.
    pub(crate) fn insert(&mut self, member: Bytes, score: f64) -> bool {
        let new = match self.by_member.insert(member.clone(), score) {
            Some(old) => {
                self.ordered.remove(&(Score(old), member.clone()));
                false
            }
            None => true,
        };
        self.ordered.insert((Score(score), member));
        new
    }

    pub(crate) fn remove(&mut self, member: &[u8]) -> bool {
        match self.by_member.remove(member) {
            Some(score) => {
                self.ordered
                    .remove(&(Score(score), Bytes::copy_from_slice(member)));
                true
            }
            None => false,
        }
    }

    /// Members with `min <= score <= max` (bounds exclusive when flagged), in order.
    pub(crate) fn range_by_score(&self, min: Bound, max: Bound) -> Vec<(Bytes, f64)> {
        self.ordered
            .iter()
            .filter(|(s, _)| min.below(s.0) && max.above(s.0))
            .map(|(s, m)| (m.clone(), s.0))
            .collect()
    }
}

/// One end of a score range: `5`, `(5`, `-inf`, `+inf`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bound {
    pub(crate) value: f64,
    pub(crate) exclusive: bool,
}

impl Bound {
    fn below(self, score: f64) -> bool {
        if self.exclusive {
            self.value < score
        } else {
            self.value <= score
        }
    }

    fn above(self, score: f64) -> bool {
        if self.exclusive {
            score < self.value
        } else {
            score <= self.value
        }
    }
}

/// A stream entry id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct StreamId {
    pub(crate) ms: u64,
    pub(crate) seq: u64,
}

impl StreamId {
    pub(crate) const MAX: StreamId = StreamId {
        ms: u64::MAX,
        seq: u64::MAX,
    };

    /// Parses `ms-seq`, or `ms` with `seq` as given.
    pub(crate) fn parse(s: &[u8], default_seq: u64) -> Option<StreamId> {
        let s = std::str::from_utf8(s).ok()?;
        match s.split_once('-') {
            Some((ms, seq)) => Some(StreamId {
                ms: ms.parse().ok()?,
                seq: seq.parse().ok()?,
            }),
            None => Some(StreamId {
                ms: s.parse().ok()?,
                seq: default_seq,
            }),
        }
    }

    pub(crate) fn next(self) -> Option<StreamId> {
        if self.seq == u64::MAX {
            self.ms.checked_add(1).map(|ms| StreamId { ms, seq: 0 })
        } else {
            Some(StreamId {
                ms: self.ms,
                seq: self.seq + 1,
            })
        }
    }

    pub(crate) fn bytes(self) -> Bytes {
        Bytes::from(self.to_string())
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// A stream with its consumer groups.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stream {
    pub(crate) entries: BTreeMap<StreamId, Vec<(Bytes, Bytes)>>,
    pub(crate) last_id: StreamId,
    pub(crate) groups: BTreeMap<Bytes, Group>,
}

/// A consumer group: what it was delivered and what is pending.
#[derive(Debug, Clone, Default)]
pub(crate) struct Group {
    pub(crate) last_delivered: StreamId,
    pub(crate) pending: BTreeMap<StreamId, Pending>,
    /// Consumer name to the time it was last seen (ms).
    pub(crate) consumers: BTreeMap<Bytes, u64>,
}

/// A pending entry: delivered, not acknowledged.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub(crate) consumer: Bytes,
    pub(crate) delivered_ms: u64,
    pub(crate) count: u64,
}

impl Stream {
    /// Whether `group` has entries it was not delivered yet.
    pub(crate) fn has_new_for(&self, group: &[u8]) -> bool {
        self.groups.get(group).is_some_and(|g| {
            self.entries
                .range(g.last_delivered..)
                .any(|(id, _)| *id > g.last_delivered)
        })
    }

    /// Appends an entry with an id made from `now` (`*`), or the given id.
    pub(crate) fn add(
        &mut self,
        id: Option<StreamId>,
        now: u64,
        fields: Vec<(Bytes, Bytes)>,
    ) -> R<StreamId> {
        let id = match id {
            Some(id) => {
                if id <= self.last_id || id == StreamId::default() {
                    return Err(err(
                        "ERR The ID specified in XADD is equal or smaller than the target stream top item",
                    ));
                }
                id
            }
            None if now > self.last_id.ms => StreamId { ms: now, seq: 0 },
            None => self.last_id.next().ok_or_else(|| {
                err("ERR The stream has exhausted the last possible ID, unable to add more items")
            })?,
        };
        self.entries.insert(id, fields);
        self.last_id = id;
        Ok(id)
    }
}
