//! Claims of a consumer group's pending entries by another consumer: `XCLAIM`, `XAUTOCLAIM`.

use super::groups::{idle, no_group};
use super::*;

/// The arguments of an `XCLAIM` call after its key, group and consumer.
struct Claim {
    min_idle: i64,
    ids: Vec<StreamId>,
    justid: bool,
    force: bool,
    /// The idle time (ms) a claimed entry is given: `IDLE`, or `now` less `TIME`.
    set_idle: Option<i64>,
    retrycount: Option<i64>,
}

/// Parses `min-idle id.. [IDLE ms] [TIME ms] [RETRYCOUNT n] [FORCE] [JUSTID] [LASTID id]`
/// (`args[3..]`); the ids end at the first argument that is not one.
fn parse_xclaim(now: u64, args: &[Bytes]) -> R<Claim> {
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
    Ok(Claim {
        min_idle,
        ids,
        justid,
        force,
        set_idle,
        retrycount,
    })
}

pub(super) fn xclaim(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
    if args.len() < 5 {
        return Err(wrong_args("XCLAIM"));
    }
    let (key, group, consumer) = (&args[0], &args[1], &args[2]);
    let claim = parse_xclaim(now, args)?;
    let s = st.db.stream_mut(key)?.ok_or_else(no_group)?;
    let entries = &s.entries;
    let g = s.groups.get_mut(group).ok_or_else(no_group)?;
    g.consumers.insert(consumer.clone(), now);
    let mut out = Vec::new();
    for &id in &claim.ids {
        let p = match g.pending.entry(id) {
            std::collections::btree_map::Entry::Occupied(p) => p.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                if !claim.force || !entries.contains_key(&id) {
                    continue;
                }
                v.insert(Pending {
                    consumer: consumer.clone(),
                    delivered_ms: now,
                    count: 0,
                })
            }
        };
        if idle(now, p) < claim.min_idle {
            continue;
        }
        let Some(fields) = entries.get(&id) else {
            // Deleted meanwhile: Redis drops it from the PEL.
            g.pending.remove(&id);
            continue;
        };
        p.consumer = consumer.clone();
        p.delivered_ms = now.saturating_sub(claim.set_idle.unwrap_or(0).max(0).unsigned_abs());
        if let Some(rc) = claim.retrycount {
            p.count = rc.max(0).unsigned_abs();
        } else if !claim.justid {
            p.count += 1;
        }
        out.push(if claim.justid {
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
