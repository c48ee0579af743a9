//! Consumer-group commands of streams: `XGROUP`, `XREADGROUP`, `XPENDING`, `XINFO GROUPS` and
//! `XINFO CONSUMERS` (the
//! claims are in `claims`).

use std::collections::BTreeMap;

use super::data::Group;
use super::*;

/// A stream's entries by id.
type Entries = BTreeMap<StreamId, Vec<(Bytes, Bytes)>>;

pub(super) fn xgroup(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
    let sub = upper(xgroup_arg(args, 0)?);
    let key = xgroup_arg(args, 1)?;
    match sub.as_str() {
        "CREATE" => xgroup_create(st, key, args),
        "DESTROY" => {
            let group = xgroup_arg(args, 2)?;
            Ok(Value::Integer(i64::from(
                st.db
                    .stream_mut(key)?
                    .is_some_and(|s| s.groups.remove(group).is_some()),
            )))
        }
        "SETID" => {
            let group = xgroup_arg(args, 2)?;
            let id = xgroup_arg(args, 3)?;
            let s = st.db.stream_mut(key)?.ok_or_else(no_group)?;
            let last = group_start(id, s.last_id)?;
            s.groups.get_mut(group).ok_or_else(no_group)?.last_delivered = last;
            Ok(ok())
        }
        "CREATECONSUMER" => {
            let (group, consumer) = (xgroup_arg(args, 2)?, xgroup_arg(args, 3)?);
            let g = group_mut(st, key, group)?;
            Ok(Value::Integer(i64::from(
                g.consumers.insert(consumer.clone(), now).is_none(),
            )))
        }
        "DELCONSUMER" => {
            let (group, consumer) = (xgroup_arg(args, 2)?, xgroup_arg(args, 3)?);
            let g = group_mut(st, key, group)?;
            g.consumers.remove(&consumer[..]);
            let before = g.pending.len();
            g.pending.retain(|_, p| p.consumer != consumer);
            Ok(int(before - g.pending.len()))
        }
        other => Err(err(format!("ERR unknown subcommand 'XGROUP {other}'"))),
    }
}

/// Argument `i` of `XGROUP`, which Redis's arity error answers the lack of.
fn xgroup_arg(args: &[Bytes], i: usize) -> R<&Bytes> {
    args.get(i).ok_or_else(|| wrong_args("XGROUP"))
}

/// `XGROUP CREATE key group id [MKSTREAM]`. The stream is made (with `MKSTREAM`) before the
/// group's name and id are checked, so a refused group still leaves it made.
fn xgroup_create(st: &mut State, key: &Bytes, args: &[Bytes]) -> R<Value> {
    let group = xgroup_arg(args, 2)?;
    let id = xgroup_arg(args, 3)?;
    let mkstream = args[4..].iter().any(|a| upper(a) == "MKSTREAM");
    if st.db.stream(key)?.is_none() {
        if !mkstream {
            return Err(err(
                "ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the MKSTREAM option to create an empty stream automatically.",
            ));
        }
        st.db.stream_create(key)?;
    }
    let s = st.db.stream_create(key)?;
    if s.groups.contains_key(group) {
        return Err(err("BUSYGROUP Consumer Group name already exists"));
    }
    let last = group_start(id, s.last_id)?;
    s.groups.insert(
        group.clone(),
        Group {
            last_delivered: last,
            ..Default::default()
        },
    );
    Ok(ok())
}

/// The last-delivered id a group starts from: `$` is the stream's last id.
fn group_start(id: &[u8], last_id: StreamId) -> R<StreamId> {
    if id == b"$" {
        Ok(last_id)
    } else {
        stream_id_arg(id, 0)
    }
}

/// The group `group` of the stream at `key`, or Redis's `NOGROUP` error.
fn group_mut<'a>(st: &'a mut State, key: &[u8], group: &[u8]) -> R<&'a mut Group> {
    st.db
        .stream_mut(key)?
        .and_then(|s| s.groups.get_mut(group))
        .ok_or_else(no_group)
}

/// Redis's error for a stream or group that does not exist.
pub(super) fn no_group() -> fred::error::Error {
    err("NOGROUP No such key or consumer group")
}

/// The arguments of an `XREADGROUP` call.
struct ReadGroup<'a> {
    group: &'a Bytes,
    consumer: &'a Bytes,
    /// `COUNT`, per stream; unbounded without one.
    count: usize,
    noack: bool,
    /// The streams' keys and, one each in the same order, the ids to read after (`>`: new).
    keys: &'a [Bytes],
    ids: &'a [Bytes],
}

/// Parses `GROUP group consumer [COUNT n] [BLOCK ms] [NOACK] STREAMS key.. id..`. `BLOCK` is
/// read and ignored: the model answers at once.
fn parse_xreadgroup(args: &[Bytes]) -> R<ReadGroup<'_>> {
    if args.len() < 6 || upper(&args[0]) != "GROUP" {
        return Err(syntax());
    }
    let (group, consumer) = (&args[1], &args[2]);
    let StreamsRead {
        count,
        noack,
        keys,
        ids,
    } = parse_read(&args[3..], "xreadgroup", "'>'")?;
    Ok(ReadGroup {
        group,
        consumer,
        count,
        noack,
        keys,
        ids,
    })
}

pub(super) fn xreadgroup(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
    let read = parse_xreadgroup(args)?;
    check_slot(st, &read.keys.iter().map(|k| &k[..]).collect::<Vec<_>>())?;
    let mut out = Vec::new();
    // Each stream is read before the next is looked up: an error on one leaves the reads before
    // it done.
    for (key, id) in read.keys.iter().zip(read.ids) {
        if let Some(items) = read_group_stream(st, now, &read, key, id)? {
            out.push(Value::Array(vec![bulk(key.clone()), Value::Array(items)]));
        }
    }
    Ok(if out.is_empty() {
        Value::Null
    } else {
        Value::Array(out)
    })
}

/// Reads one stream of an `XREADGROUP` after `id`: its entries, or `None` when `>` finds no new
/// one (Redis leaves that stream out of the reply).
fn read_group_stream(
    st: &mut State,
    now: u64,
    read: &ReadGroup<'_>,
    key: &Bytes,
    id: &Bytes,
) -> R<Option<Vec<Value>>> {
    let stream = st
        .db
        .stream_mut(key)?
        .filter(|s| s.groups.contains_key(read.group));
    let Some(stream) = stream else {
        return Err(err(format!(
            "NOGROUP No such key '{}' or consumer group '{}' in XREADGROUP with GROUP option",
            String::from_utf8_lossy(key),
            String::from_utf8_lossy(read.group)
        )));
    };
    let entries = &stream.entries;
    let Some(g) = stream.groups.get_mut(read.group) else {
        return Ok(None);
    };
    g.consumers.insert(read.consumer.clone(), now);
    if &id[..] == b">" {
        let items = deliver_new(g, entries, read, now);
        Ok((!items.is_empty()).then_some(items))
    } else {
        let after = stream_id_arg(id, 0)?;
        Ok(Some(redeliver_pending(g, entries, read, after, now)))
    }
}

/// The entries `g` was not delivered yet, delivered now: pending to the reader unless `NOACK`.
fn deliver_new(g: &mut Group, entries: &Entries, read: &ReadGroup<'_>, now: u64) -> Vec<Value> {
    let new: Vec<(StreamId, Vec<(Bytes, Bytes)>)> = entries
        .range(g.last_delivered..)
        .filter(|(eid, _)| **eid > g.last_delivered)
        .take(read.count)
        .map(|(eid, f)| (*eid, f.clone()))
        .collect();
    let mut items = Vec::new();
    for (eid, fields) in new {
        g.last_delivered = eid;
        if !read.noack {
            g.pending.insert(
                eid,
                Pending {
                    consumer: read.consumer.clone(),
                    delivered_ms: now,
                    count: 1,
                },
            );
        }
        items.push(entry_value(eid, &fields));
    }
    items
}

/// History: the reader's pending entries after `after`; each read counts a delivery. An entry
/// deleted meanwhile reads as its id with nil fields.
fn redeliver_pending(
    g: &mut Group,
    entries: &Entries,
    read: &ReadGroup<'_>,
    after: StreamId,
    now: u64,
) -> Vec<Value> {
    let mut items = Vec::new();
    for (eid, p) in g
        .pending
        .range_mut(after..)
        .filter(|(eid, p)| **eid > after && p.consumer == *read.consumer)
        .take(read.count)
    {
        p.delivered_ms = now;
        p.count += 1;
        items.push(match entries.get(eid) {
            Some(fields) => entry_value(*eid, fields),
            None => Value::Array(vec![bulk(eid.bytes()), Value::Null]),
        });
    }
    items
}

pub(super) fn xpending(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
    if args.len() < 2 {
        return Err(wrong_args("XPENDING"));
    }
    let g = st
        .db
        .stream(&args[0])?
        .and_then(|s| s.groups.get(&args[1]))
        .ok_or_else(|| {
            err(format!(
                "NOGROUP No such key '{}' or consumer group '{}'",
                String::from_utf8_lossy(&args[0]),
                String::from_utf8_lossy(&args[1])
            ))
        })?;
    if args.len() == 2 {
        if g.pending.is_empty() {
            return Ok(Value::Array(vec![
                Value::Integer(0),
                Value::Null,
                Value::Null,
                Value::Null,
            ]));
        }
        let mut per: std::collections::BTreeMap<&Bytes, usize> = Default::default();
        for p in g.pending.values() {
            *per.entry(&p.consumer).or_default() += 1;
        }
        let first = g.pending.keys().next().copied().unwrap_or_default();
        let last = g.pending.keys().next_back().copied().unwrap_or_default();
        return Ok(Value::Array(vec![
            int(g.pending.len()),
            bulk(first.bytes()),
            bulk(last.bytes()),
            Value::Array(
                per.into_iter()
                    .map(|(c, n)| array([c.clone(), Bytes::from(n.to_string())]))
                    .collect(),
            ),
        ]));
    }
    let mut i = 2;
    let mut min_idle = 0;
    if upper(&args[i]) == "IDLE" {
        min_idle = parse_i64(args.get(i + 1).ok_or_else(syntax)?)?;
        i += 2;
    }
    let start = stream_id_arg(args.get(i).ok_or_else(syntax)?, 0)?;
    let end = stream_id_arg(args.get(i + 1).ok_or_else(syntax)?, u64::MAX)?;
    let count = parse_usize(args.get(i + 2).ok_or_else(syntax)?)?;
    let consumer = args.get(i + 3);
    if start > end {
        return Ok(Value::Array(Vec::new()));
    }
    Ok(Value::Array(
        g.pending
            .range(start..=end)
            .filter(|(_, p)| consumer.is_none_or(|c| p.consumer == *c))
            .filter(|(_, p)| idle(now, p) >= min_idle)
            .take(count)
            .map(|(id, p)| {
                Value::Array(vec![
                    bulk(id.bytes()),
                    bulk(p.consumer.clone()),
                    Value::Integer(idle(now, p)),
                    Value::Integer(i64::try_from(p.count).unwrap_or(i64::MAX)),
                ])
            })
            .collect(),
    ))
}

/// How long (ms) since `p` was last delivered.
pub(super) fn idle(now: u64, p: &Pending) -> i64 {
    i64::try_from(now.saturating_sub(p.delivered_ms)).unwrap_or(i64::MAX)
}

/// `XINFO GROUPS key`, each group as Redis 7.0 gives it in RESP2: `name`, `consumers`,
/// `pending`, `last-delivered-id`, `entries-read`, `lag`. The model counts the last two from the
/// entries there now (Redis keeps a counter, and answers a nil `lag` when entries were deleted
/// in the range it would count).
pub(super) fn xinfo(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
    let sub = upper(args.first().ok_or_else(|| wrong_args("XINFO"))?);
    if sub == "CONSUMERS" {
        return xinfo_consumers(st, now, args);
    }
    if sub != "GROUPS" {
        return Err(unknown(&format!("XINFO {sub}")));
    }
    let key = args.get(1).ok_or_else(|| wrong_args("XINFO|GROUPS"))?;
    let s = st.db.stream(key)?.ok_or_else(|| err("ERR no such key"))?;
    let field = |name: &'static str, v: Value| [bulk(Bytes::from_static(name.as_bytes())), v];
    Ok(Value::Array(
        s.groups
            .iter()
            .map(|(name, g)| {
                let read = s.entries.range(..=g.last_delivered).count();
                Value::Array(
                    [
                        field("name", bulk(name.clone())),
                        field("consumers", int(g.consumers.len())),
                        field("pending", int(g.pending.len())),
                        field("last-delivered-id", bulk(g.last_delivered.bytes())),
                        field("entries-read", int(read)),
                        field("lag", int(s.entries.len() - read)),
                    ]
                    .into_iter()
                    .flatten()
                    .collect(),
                )
            })
            .collect(),
    ))
}

/// `XINFO CONSUMERS key group`, each consumer as Redis 7.0 gives it in RESP2: `name`,
/// `pending`, `idle` (ms since its last read or claim).
fn xinfo_consumers(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
    let (key, group) = match (args.get(1), args.get(2)) {
        (Some(k), Some(g)) => (k, g),
        _ => return Err(wrong_args("XINFO|CONSUMERS")),
    };
    let s = st.db.stream(key)?.ok_or_else(|| err("ERR no such key"))?;
    let g = s.groups.get(group).ok_or_else(|| {
        err(format!(
            "NOGROUP No such consumer group '{}' for key name '{}'",
            String::from_utf8_lossy(group),
            String::from_utf8_lossy(key)
        ))
    })?;
    let field = |name: &'static str, v: Value| [bulk(Bytes::from_static(name.as_bytes())), v];
    Ok(Value::Array(
        g.consumers
            .iter()
            .map(|(name, seen)| {
                let pending = g.pending.values().filter(|p| p.consumer == *name).count();
                Value::Array(
                    [
                        field("name", bulk(name.clone())),
                        field("pending", int(pending)),
                        field(
                            "idle",
                            int(usize::try_from(now.saturating_sub(*seen)).unwrap_or(usize::MAX)),
                        ),
                    ]
                    .into_iter()
                    .flatten()
                    .collect(),
                )
            })
            .collect(),
    ))
}
