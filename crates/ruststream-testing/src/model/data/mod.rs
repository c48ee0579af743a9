//! The keyspace of the model: values, expiry, and the type rules Redis enforces on them.
//!
//! Each operation here mirrors one Redis command's effect on the data (no argument parsing: see
//! `commands`). Like Redis, a list, hash, sorted set or string that becomes empty is deleted (and
//! its expiry with it); a stream is not.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use fred::error::{Error, ErrorKind};

mod glob;
mod values;

pub(crate) use glob::glob;
pub(crate) use values::{Bound, Group, Pending, Stream, StreamId, ZSet};

/// The result of a model operation; errors carry Redis's own error text.
pub(crate) type R<T> = Result<T, Error>;

/// A Redis error reply, with the kind fred gives the same text from a real server.
pub(crate) fn err(text: impl Into<String>) -> Error {
    let text = text.into();
    let kind = match text.split_whitespace().next() {
        Some("WRONGTYPE") => ErrorKind::InvalidArgument,
        Some("NOAUTH" | "WRONGPASS") => ErrorKind::Auth,
        Some("MOVED" | "ASK" | "CLUSTERDOWN") => ErrorKind::Cluster,
        _ => ErrorKind::Unknown,
    };
    Error::new(kind, text)
}

pub(crate) fn wrongtype() -> Error {
    err("WRONGTYPE Operation against a key holding the wrong kind of value")
}

/// A stored value.
#[derive(Debug, Clone)]
pub(crate) enum Val {
    Str(Bytes),
    List(VecDeque<Bytes>),
    Hash(HashMap<Bytes, Bytes>),
    ZSet(ZSet),
    Stream(Stream),
}

impl Val {
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Val::Str(_) => "string",
            Val::List(_) => "list",
            Val::Hash(_) => "hash",
            Val::ZSet(_) => "zset",
            Val::Stream(_) => "stream",
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Val::Str(_) | Val::Stream(_) => false,
            Val::List(l) => l.is_empty(),
            Val::Hash(h) => h.is_empty(),
            Val::ZSet(z) => z.by_member.is_empty(),
        }
    }
}

/// A key's value and its expiry (ms since the epoch on the model's clock).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) val: Val,
    pub(crate) expires: Option<u64>,
}

/// Every key of the model.
#[derive(Debug, Default)]
pub(crate) struct Keyspace {
    pub(crate) keys: HashMap<Bytes, Entry>,
}

impl Keyspace {
    /// Drops keys whose expiry has passed: a key expires once `now` is past its time, as in Redis.
    pub(crate) fn purge(&mut self, now: u64) {
        self.keys.retain(|_, e| e.expires.is_none_or(|t| t >= now));
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.keys.get(key)
    }

    pub(crate) fn remove(&mut self, key: &[u8]) -> bool {
        self.keys.remove(key).is_some()
    }

    /// Deletes `key` if its value became empty.
    pub(crate) fn tidy(&mut self, key: &[u8]) {
        if self.keys.get(key).is_some_and(|e| e.val.is_empty()) {
            self.keys.remove(key);
        }
    }

    fn entry_or(&mut self, key: &Bytes, make: impl FnOnce() -> Val) -> &mut Entry {
        self.keys.entry(key.clone()).or_insert_with(|| Entry {
            val: make(),
            expires: None,
        })
    }

    // ---- lists ----

    pub(crate) fn list(&self, key: &[u8]) -> R<Option<&VecDeque<Bytes>>> {
        match self.keys.get(key).map(|e| &e.val) {
            None => Ok(None),
            Some(Val::List(l)) => Ok(Some(l)),
            Some(_) => Err(wrongtype()),
        }
    }

    pub(crate) fn list_mut(&mut self, key: &[u8]) -> R<Option<&mut VecDeque<Bytes>>> {
        match self.keys.get_mut(key).map(|e| &mut e.val) {
            None => Ok(None),
            Some(Val::List(l)) => Ok(Some(l)),
            Some(_) => Err(wrongtype()),
        }
    }

    fn list_create(&mut self, key: &Bytes) -> R<&mut VecDeque<Bytes>> {
        match &mut self.entry_or(key, || Val::List(VecDeque::new())).val {
            Val::List(l) => Ok(l),
            _ => Err(wrongtype()),
        }
    }

    /// `LPUSH` (`left`) or `RPUSH`: returns the new length.
    pub(crate) fn push(&mut self, key: &Bytes, values: &[Bytes], left: bool) -> R<usize> {
        if values.is_empty() {
            return Ok(self.list(key)?.map_or(0, VecDeque::len));
        }
        let list = self.list_create(key)?;
        for v in values {
            if left {
                list.push_front(v.clone());
            } else {
                list.push_back(v.clone());
            }
        }
        Ok(list.len())
    }

    /// `LPOP`/`RPOP key count`.
    pub(crate) fn pop(&mut self, key: &[u8], count: usize, left: bool) -> R<Vec<Bytes>> {
        let out = match self.list_mut(key)? {
            None => Vec::new(),
            Some(list) => {
                let n = count.min(list.len());
                (0..n)
                    .filter_map(|_| {
                        if left {
                            list.pop_front()
                        } else {
                            list.pop_back()
                        }
                    })
                    .collect()
            }
        };
        self.tidy(key);
        Ok(out)
    }

    /// `LMOVE src dst from to`: the moved value.
    pub(crate) fn lmove(
        &mut self,
        src: &Bytes,
        dst: &Bytes,
        from_left: bool,
        to_left: bool,
    ) -> R<Option<Bytes>> {
        // Type checks first, as Redis does, so a wrong destination moves nothing.
        if self.list(src)?.is_none() {
            return Ok(None);
        }
        self.list(dst)?;
        let Some(v) = self.pop(src, 1, from_left)?.pop() else {
            return Ok(None);
        };
        self.push(dst, std::slice::from_ref(&v), to_left)?;
        Ok(Some(v))
    }

    /// `LTRIM key start stop`: keeps only the elements of that index range.
    pub(crate) fn ltrim(&mut self, key: &[u8], start: i64, stop: i64) -> R<()> {
        if let Some(list) = self.list_mut(key)? {
            match rank_range(list.len(), start, stop) {
                Some((from, to)) => {
                    list.truncate(to + 1);
                    list.drain(..from);
                }
                None => list.clear(),
            }
        }
        self.tidy(key);
        Ok(())
    }

    /// `LREM key count value`: how many were removed.
    pub(crate) fn lrem(&mut self, key: &[u8], count: i64, value: &[u8]) -> R<usize> {
        let removed = match self.list_mut(key)? {
            None => 0,
            Some(list) => {
                let limit = if count == 0 {
                    usize::MAX
                } else {
                    usize::try_from(count.unsigned_abs()).unwrap_or(usize::MAX)
                };
                let mut removed = 0;
                if count >= 0 {
                    let mut i = 0;
                    while i < list.len() && removed < limit {
                        if list[i] == value {
                            list.remove(i);
                            removed += 1;
                        } else {
                            i += 1;
                        }
                    }
                } else {
                    let mut i = list.len();
                    while i > 0 && removed < limit {
                        i -= 1;
                        if list[i] == value {
                            list.remove(i);
                            removed += 1;
                        }
                    }
                }
                removed
            }
        };
        self.tidy(key);
        Ok(removed)
    }

    // ---- hashes ----

    pub(crate) fn hash(&self, key: &[u8]) -> R<Option<&HashMap<Bytes, Bytes>>> {
        match self.keys.get(key).map(|e| &e.val) {
            None => Ok(None),
            Some(Val::Hash(h)) => Ok(Some(h)),
            Some(_) => Err(wrongtype()),
        }
    }

    fn hash_create(&mut self, key: &Bytes) -> R<&mut HashMap<Bytes, Bytes>> {
        match &mut self.entry_or(key, || Val::Hash(HashMap::new())).val {
            Val::Hash(h) => Ok(h),
            _ => Err(wrongtype()),
        }
    }

    /// `HSET key field value`: whether the field is new.
    pub(crate) fn hset(&mut self, key: &Bytes, field: &Bytes, value: &Bytes) -> R<bool> {
        Ok(self
            .hash_create(key)?
            .insert(field.clone(), value.clone())
            .is_none())
    }

    /// `HSETNX`: whether it was set.
    pub(crate) fn hsetnx(&mut self, key: &Bytes, field: &Bytes, value: &Bytes) -> R<bool> {
        if self.hash(key)?.is_some_and(|h| h.contains_key(field)) {
            return Ok(false);
        }
        self.hset(key, field, value)
    }

    pub(crate) fn hget(&self, key: &[u8], field: &[u8]) -> R<Option<Bytes>> {
        Ok(self.hash(key)?.and_then(|h| h.get(field).cloned()))
    }

    pub(crate) fn hdel(&mut self, key: &[u8], field: &[u8]) -> R<bool> {
        let removed = match self.keys.get_mut(key).map(|e| &mut e.val) {
            None => false,
            Some(Val::Hash(h)) => h.remove(field).is_some(),
            Some(_) => return Err(wrongtype()),
        };
        self.tidy(key);
        Ok(removed)
    }

    // ---- sorted sets ----

    pub(crate) fn zset(&self, key: &[u8]) -> R<Option<&ZSet>> {
        match self.keys.get(key).map(|e| &e.val) {
            None => Ok(None),
            Some(Val::ZSet(z)) => Ok(Some(z)),
            Some(_) => Err(wrongtype()),
        }
    }

    pub(crate) fn zset_create(&mut self, key: &Bytes) -> R<&mut ZSet> {
        match &mut self.entry_or(key, || Val::ZSet(ZSet::default())).val {
            Val::ZSet(z) => Ok(z),
            _ => Err(wrongtype()),
        }
    }

    /// `ZADD key score member`: whether the member is new.
    pub(crate) fn zadd(&mut self, key: &Bytes, score: f64, member: &Bytes) -> R<bool> {
        Ok(self.zset_create(key)?.insert(member.clone(), score))
    }

    pub(crate) fn zrem(&mut self, key: &[u8], member: &[u8]) -> R<bool> {
        let removed = match self.keys.get_mut(key).map(|e| &mut e.val) {
            None => false,
            Some(Val::ZSet(z)) => z.remove(member),
            Some(_) => return Err(wrongtype()),
        };
        self.tidy(key);
        Ok(removed)
    }

    /// `ZRANGEBYSCORE key min max LIMIT offset count` (count < 0: all).
    pub(crate) fn zrangebyscore(
        &self,
        key: &[u8],
        min: Bound,
        max: Bound,
        offset: usize,
        count: i64,
    ) -> R<Vec<(Bytes, f64)>> {
        let Some(z) = self.zset(key)? else {
            return Ok(Vec::new());
        };
        let all = z.range_by_score(min, max).into_iter().skip(offset);
        Ok(match usize::try_from(count) {
            Ok(n) => all.take(n).collect(),
            Err(_) => all.collect(),
        })
    }

    /// `ZRANGE key start stop` by rank (negative ranks count from the end).
    pub(crate) fn zrange(&self, key: &[u8], start: i64, stop: i64) -> R<Vec<(Bytes, f64)>> {
        let Some(z) = self.zset(key)? else {
            return Ok(Vec::new());
        };
        let Some((from, to)) = rank_range(z.ordered.len(), start, stop) else {
            return Ok(Vec::new());
        };
        Ok(z.ordered
            .iter()
            .skip(from)
            .take(to - from + 1)
            .map(|(s, m)| (m.clone(), s.0))
            .collect())
    }

    // ---- streams ----

    pub(crate) fn stream(&self, key: &[u8]) -> R<Option<&Stream>> {
        match self.keys.get(key).map(|e| &e.val) {
            None => Ok(None),
            Some(Val::Stream(s)) => Ok(Some(s)),
            Some(_) => Err(wrongtype()),
        }
    }

    pub(crate) fn stream_mut(&mut self, key: &[u8]) -> R<Option<&mut Stream>> {
        match self.keys.get_mut(key).map(|e| &mut e.val) {
            None => Ok(None),
            Some(Val::Stream(s)) => Ok(Some(s)),
            Some(_) => Err(wrongtype()),
        }
    }

    pub(crate) fn stream_create(&mut self, key: &Bytes) -> R<&mut Stream> {
        match &mut self.entry_or(key, || Val::Stream(Stream::default())).val {
            Val::Stream(s) => Ok(s),
            _ => Err(wrongtype()),
        }
    }

    /// `XADD key * field value ...`.
    pub(crate) fn xadd(
        &mut self,
        key: &Bytes,
        id: Option<StreamId>,
        now: u64,
        fields: Vec<(Bytes, Bytes)>,
    ) -> R<StreamId> {
        self.stream_create(key)?.add(id, now, fields)
    }

    /// `XACK key group id`: whether it was pending.
    pub(crate) fn xack(&mut self, key: &[u8], group: &[u8], id: StreamId) -> R<bool> {
        Ok(self
            .stream_mut(key)?
            .and_then(|s| s.groups.get_mut(group))
            .is_some_and(|g| g.pending.remove(&id).is_some()))
    }

    // ---- expiry ----

    /// `PEXPIRE key ms` at `now`: whether the key exists. A non-positive ttl deletes it.
    pub(crate) fn pexpire(&mut self, key: &[u8], ttl_ms: i64, now: u64) -> bool {
        if ttl_ms <= 0 {
            return self.keys.remove(key).is_some();
        }
        match self.keys.get_mut(key) {
            Some(e) => {
                e.expires = Some(now.saturating_add(ttl_ms.unsigned_abs()));
                true
            }
            None => false,
        }
    }
}

/// The inclusive index range `start..=stop` of a sequence of `len` items, Redis-style.
pub(crate) fn rank_range(len: usize, start: i64, stop: i64) -> Option<(usize, usize)> {
    let len_i = i64::try_from(len).ok()?;
    let start = if start < 0 { len_i + start } else { start }.max(0);
    let stop = if stop < 0 { len_i + stop } else { stop }.min(len_i - 1);
    if start > stop || start >= len_i {
        return None;
    }
    Some((usize::try_from(start).ok()?, usize::try_from(stop).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lrem_from_the_tail_removes_the_last_match() {
        let mut k = Keyspace::default();
        let key = Bytes::from_static(b"l");
        let vals: Vec<Bytes> = [b"a", b"b", b"a"]
            .map(|s: &'static [u8; 1]| Bytes::from_static(s))
            .into();
        k.push(&key, &vals, false).unwrap();
        assert_eq!(k.lrem(&key, -1, b"a").unwrap(), 1);
        let left: Vec<&[u8]> = k
            .list(&key)
            .unwrap()
            .unwrap()
            .iter()
            .map(|b| &b[..])
            .collect();
        assert_eq!(left, [&b"a"[..], b"b"]);
        assert_eq!(k.lrem(&key, 0, b"a").unwrap(), 1);
        assert_eq!(k.lrem(&key, 0, b"b").unwrap(), 1);
        assert!(k.get(b"l").is_none(), "an emptied list is deleted");
    }

    #[test]
    fn ltrim_keeps_a_range_and_deletes_an_emptied_list() {
        let mut k = Keyspace::default();
        let key = Bytes::from_static(b"l");
        let vals: Vec<Bytes> = [b"a", b"b", b"c", b"d"]
            .map(|s: &'static [u8; 1]| Bytes::from_static(s))
            .into();
        k.push(&key, &vals, false).unwrap();
        k.ltrim(&key, 0, -2).unwrap();
        let left: Vec<&[u8]> = k
            .list(&key)
            .unwrap()
            .unwrap()
            .iter()
            .map(|b| &b[..])
            .collect();
        assert_eq!(left, [&b"a"[..], b"b", b"c"]);
        k.ltrim(&key, 1, 1).unwrap();
        assert_eq!(k.list(&key).unwrap().unwrap().len(), 1);
        k.ltrim(&key, 0, -2).unwrap();
        assert!(k.get(b"l").is_none(), "an emptied list is deleted");
    }

    #[test]
    fn rank_ranges() {
        assert_eq!(rank_range(3, 0, -1), Some((0, 2)));
        assert_eq!(rank_range(3, 0, 0), Some((0, 0)));
        assert_eq!(rank_range(0, 0, 0), None);
        assert_eq!(rank_range(3, 5, 9), None);
        assert_eq!(rank_range(3, -9, 1), Some((0, 1)));
    }
}
