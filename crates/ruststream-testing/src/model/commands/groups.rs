//! Consumer-group commands of streams: `XGROUP`, `XREADGROUP`, `XPENDING`, `XCLAIM`,
//! `XAUTOCLAIM`.

use super::*;

pub(super) fn xgroup(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
    let sub = upper(args.first().ok_or_else(|| wrong_args("XGROUP"))?);
    let key = args.get(1).ok_or_else(|| wrong_args("XGROUP"))?;
    match sub.as_str() {
        "CREATE" => {
            let group = args.get(2).ok_or_else(|| wrong_args("XGROUP"))?;
            let id = args.get(3).ok_or_else(|| wrong_args("XGROUP"))?;
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
            let last = if &id[..] == b"$" {
                s.last_id
            } else {
                stream_id_arg(id, 0)?
            };
            s.groups.insert(
                group.clone(),
                super::data::Group {
                    last_delivered: last,
                    ..Default::default()
                },
            );
            Ok(ok())
        }
        "DESTROY" => {
            let group = args.get(2).ok_or_else(|| wrong_args("XGROUP"))?;
            Ok(Value::Integer(i64::from(
                st.db
                    .stream_mut(key)?
                    .is_some_and(|s| s.groups.remove(group).is_some()),
            )))
        }
        "SETID" => {
            let group = args.get(2).ok_or_else(|| wrong_args("XGROUP"))?;
            let id = args.get(3).ok_or_else(|| wrong_args("XGROUP"))?;
            let s = st.db.stream_mut(key)?.ok_or_else(no_group)?;
            let last = if &id[..] == b"$" {
                s.last_id
            } else {
                stream_id_arg(id, 0)?
            };
            s.groups.get_mut(group).ok_or_else(no_group)?.last_delivered = last;
            Ok(ok())
        }
        "CREATECONSUMER" => {
            let (group, consumer) = (
                args.get(2).ok_or_else(|| wrong_args("XGROUP"))?,
                args.get(3).ok_or_else(|| wrong_args("XGROUP"))?,
            );
            let g = st
                .db
                .stream_mut(key)?
                .and_then(|s| s.groups.get_mut(group))
                .ok_or_else(no_group)?;
            Ok(Value::Integer(i64::from(
                g.consumers.insert(consumer.clone(), now).is_none(),
            )))
        }
        "DELCONSUMER" => {
            let (group, consumer) = (
                args.get(2).ok_or_else(|| wrong_args("XGROUP"))?,
                args.get(3).ok_or_else(|| wrong_args("XGROUP"))?,
            );
            let g = st
                .db
                .stream_mut(key)?
                .and_then(|s| s.groups.get_mut(group))
                .ok_or_else(no_group)?;
            g.consumers.remove(&consumer[..]);
            let before = g.pending.len();
            g.pending.retain(|_, p| p.consumer != consumer);
            Ok(int(before - g.pending.len()))
        }
        other => Err(err(format!("ERR unknown subcommand 'XGROUP {other}'"))),
    }
}

fn no_group() -> fred::error::Error {
    err("NOGROUP No such key or consumer group")
}

pub(super) fn xreadgroup(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
    if args.len() < 6 || upper(&args[0]) != "GROUP" {
        return Err(syntax());
    }
    let (group, consumer) = (&args[1], &args[2]);
    let mut count = usize::MAX;
    let mut noack = false;
    let mut i = 3;
    while i < args.len() {
        match upper(&args[i]).as_str() {
            "COUNT" => {
                count = parse_usize(args.get(i + 1).ok_or_else(syntax)?)?;
                i += 1;
            }
            "BLOCK" => i += 1,
            "NOACK" => noack = true,
            "STREAMS" => break,
            _ => return Err(syntax()),
        }
        i += 1;
    }
    let rest = &args[i + 1..];
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return Err(err(
            "ERR Unbalanced 'xreadgroup' list of streams: for each stream key an ID or '>' must be specified.",
        ));
    }
    let (keys, ids) = rest.split_at(rest.len() / 2);
    check_slot(st, &keys.iter().map(|k| &k[..]).collect::<Vec<_>>())?;
    let mut out = Vec::new();
    for (key, id) in keys.iter().zip(ids) {
        let stream = st
            .db
            .stream_mut(key)?
            .filter(|s| s.groups.contains_key(group));
        let Some(stream) = stream else {
            return Err(err(format!(
                "NOGROUP No such key '{}' or consumer group '{}' in XREADGROUP with GROUP option",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(group)
            )));
        };
        let entries = &stream.entries;
        let Some(g) = stream.groups.get_mut(group) else {
            continue;
        };
        g.consumers.insert(consumer.clone(), now);
        let mut items = Vec::new();
        if &id[..] == b">" {
            let new: Vec<(StreamId, Vec<(Bytes, Bytes)>)> = entries
                .range(g.last_delivered..)
                .filter(|(eid, _)| **eid > g.last_delivered)
                .take(count)
                .map(|(eid, f)| (*eid, f.clone()))
                .collect();
            for (eid, fields) in new {
                g.last_delivered = eid;
                if !noack {
                    g.pending.insert(
                        eid,
                        Pending {
                            consumer: consumer.clone(),
                            delivered_ms: now,
                            count: 1,
                        },
                    );
                }
                items.push(entry_value(eid, &fields));
            }
            if items.is_empty() {
                continue;
            }
        } else {
            // History: this consumer's pending entries after `id`; each read counts a delivery.
            let after = stream_id_arg(id, 0)?;
            for (eid, p) in g
                .pending
                .range_mut(after..)
                .filter(|(eid, p)| **eid > after && p.consumer == *consumer)
                .take(count)
            {
                p.delivered_ms = now;
                p.count += 1;
                items.push(match entries.get(eid) {
                    Some(fields) => entry_value(*eid, fields),
                    None => Value::Array(vec![bulk(eid.bytes()), Value::Null]),
                });
            }
        }
        out.push(Value::Array(vec![bulk(key.clone()), Value::Array(items)]));
    }
    Ok(if out.is_empty() {
        Value::Null
    } else {
        Value::Array(out)
    })
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

fn idle(now: u64, p: &Pending) -> i64 {
    i64::try_from(now.saturating_sub(p.delivered_ms)).unwrap_or(i64::MAX)
}

pub(super) fn xclaim(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
    if args.len() < 5 {
        return Err(wrong_args("XCLAIM"));
    }
    let (key, group, consumer) = (&args[0], &args[1], &args[2]);
    let min_idle = parse_i64(&args[3])?;
    let mut ids = Vec::new();
    let mut i = 4;
    while i < args.len() {
        match StreamId::parse(&args[i], 0) {
            Some(id) => ids.push(id),
            None => break,
        }
        i += 1;
    }
    let (mut justid, mut force) = (false, false);
    let (mut set_idle, mut retrycount) = (None, None);
    while i < args.len() {
        match upper(&args[i]).as_str() {
            "JUSTID" => justid = true,
            "FORCE" => force = true,
            "IDLE" => {
                set_idle = Some(parse_i64(args.get(i + 1).ok_or_else(syntax)?)?);
                i += 1;
            }
            "TIME" => {
                let at = parse_i64(args.get(i + 1).ok_or_else(syntax)?)?;
                set_idle = Some(i64::try_from(now).unwrap_or(i64::MAX) - at);
                i += 1;
            }
            "RETRYCOUNT" => {
                retrycount = Some(parse_i64(args.get(i + 1).ok_or_else(syntax)?)?);
                i += 1;
            }
            "LASTID" => i += 1,
            _ => return Err(syntax()),
        }
        i += 1;
    }
    let s = st.db.stream_mut(key)?.ok_or_else(no_group)?;
    let entries = &s.entries;
    let g = s.groups.get_mut(group).ok_or_else(no_group)?;
    g.consumers.insert(consumer.clone(), now);
    let mut out = Vec::new();
    for id in ids {
        let p = match g.pending.entry(id) {
            std::collections::btree_map::Entry::Occupied(p) => p.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                if !force || !entries.contains_key(&id) {
                    continue;
                }
                v.insert(Pending {
                    consumer: consumer.clone(),
                    delivered_ms: now,
                    count: 0,
                })
            }
        };
        if idle(now, p) < min_idle {
            continue;
        }
        let Some(fields) = entries.get(&id) else {
            // Deleted meanwhile: Redis drops it from the PEL.
            g.pending.remove(&id);
            continue;
        };
        p.consumer = consumer.clone();
        p.delivered_ms = now.saturating_sub(set_idle.unwrap_or(0).max(0).unsigned_abs());
        if let Some(rc) = retrycount {
            p.count = rc.max(0).unsigned_abs();
        } else if !justid {
            p.count += 1;
        }
        out.push(if justid {
            bulk(id.bytes())
        } else {
            entry_value(id, fields)
        });
    }
    Ok(Value::Array(out))
}

pub(super) fn xautoclaim(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
    if args.len() < 5 {
        return Err(wrong_args("XAUTOCLAIM"));
    }
    let (key, group, consumer) = (&args[0], &args[1], &args[2]);
    let min_idle = parse_i64(&args[3])?;
    let start = stream_id_arg(&args[4], 0)?;
    let (mut count, mut justid) = (100usize, false);
    let mut i = 5;
    while i < args.len() {
        match upper(&args[i]).as_str() {
            "COUNT" => {
                count = parse_usize(args.get(i + 1).ok_or_else(syntax)?)?;
                i += 1;
            }
            "JUSTID" => justid = true,
            _ => return Err(syntax()),
        }
        i += 1;
    }
    let s = st.db.stream_mut(key)?.ok_or_else(no_group)?;
    let entries = &s.entries;
    let g = s.groups.get_mut(group).ok_or_else(no_group)?;
    g.consumers.insert(consumer.clone(), now);
    let ids: Vec<StreamId> = g.pending.range(start..).map(|(id, _)| *id).collect();
    let (mut claimed, mut deleted) = (Vec::new(), Vec::new());
    let mut next = StreamId::default();
    // Redis scans at most count * 10 entries of the PEL per call.
    for (scanned, id) in ids.into_iter().enumerate() {
        if claimed.len() >= count || scanned >= count.saturating_mul(10) {
            next = id;
            break;
        }
        let Some(p) = g.pending.get_mut(&id) else {
            continue;
        };
        if idle(now, p) < min_idle {
            continue;
        }
        let Some(fields) = entries.get(&id) else {
            g.pending.remove(&id);
            deleted.push(bulk(id.bytes()));
            continue;
        };
        p.consumer = consumer.clone();
        p.delivered_ms = now;
        if !justid {
            p.count += 1;
        }
        claimed.push(if justid {
            bulk(id.bytes())
        } else {
            entry_value(id, fields)
        });
    }
    Ok(Value::Array(vec![
        bulk(next.bytes()),
        Value::Array(claimed),
        Value::Array(deleted),
    ]))
}
