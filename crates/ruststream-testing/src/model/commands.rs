//! The commands the model understands: argument parsing and replies shaped as Redis (RESP2)
//! shapes them, over the keyspace operations of `data`.
//!
//! Blocking commands (`BRPOP`, `BLMOVE`, `XREADGROUP .. BLOCK`) answer at once, as if their
//! timeout had passed; the reader awaits the model's readiness first (see
//! `ruststream_redis::memory`). A command the model does not know is an error that names it.

use bytes::Bytes;
use fred::types::Value;

use super::State;
use super::data::{Bound, Pending, R, StreamId, err, glob, rank_range};
use super::publishes::Change;

/// A reply of simple-string `OK`.
fn ok() -> Value {
    Value::String("OK".into())
}

fn int(n: usize) -> Value {
    Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

fn bulk(b: Bytes) -> Value {
    Value::Bytes(b)
}

fn opt_bulk(b: Option<Bytes>) -> Value {
    b.map_or(Value::Null, Value::Bytes)
}

fn array(items: impl IntoIterator<Item = Bytes>) -> Value {
    Value::Array(items.into_iter().map(Value::Bytes).collect())
}

/// Formats a score as Redis does (`%.17g`: integers without a fraction).
pub(crate) fn fmt_score(s: f64) -> Bytes {
    if s.is_infinite() {
        return Bytes::from_static(if s > 0.0 { b"inf" } else { b"-inf" });
    }
    #[allow(clippy::cast_possible_truncation)]
    if s.fract() == 0.0 && s.abs() < 1e17 {
        return Bytes::from((s as i64).to_string());
    }
    Bytes::from(format!("{s}"))
}

fn syntax() -> fred::error::Error {
    err("ERR syntax error")
}

fn wrong_args(cmd: &str) -> fred::error::Error {
    err(format!(
        "ERR wrong number of arguments for '{}' command",
        cmd.to_ascii_lowercase()
    ))
}

/// An integer argument, read as strictly as Redis reads one: an optional `-`, then `0` or digits
/// without a leading zero (`+1`, `01`, `-0` and ` 1` are not integers).
pub(crate) fn parse_i64(b: &[u8]) -> R<i64> {
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    let canonical = match digits {
        [b'0'] => digits.len() == b.len(),
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    canonical
        .then(|| std::str::from_utf8(b).ok()?.parse().ok())
        .flatten()
        .ok_or_else(|| err("ERR value is not an integer or out of range"))
}

fn parse_usize(b: &[u8]) -> R<usize> {
    usize::try_from(parse_i64(b)?).map_err(|_| err("ERR value is out of range, must be positive"))
}

pub(crate) fn parse_f64(b: &[u8]) -> R<f64> {
    let s = std::str::from_utf8(b).map_err(|_| err("ERR value is not a valid float"))?;
    match s.to_ascii_lowercase().as_str() {
        "inf" | "+inf" => Ok(f64::INFINITY),
        "-inf" => Ok(f64::NEG_INFINITY),
        other => other
            .parse::<f64>()
            .ok()
            .filter(|f| !f.is_nan())
            .ok_or_else(|| err("ERR value is not a valid float")),
    }
}

fn parse_bound(b: &[u8]) -> R<Bound> {
    match b.split_first() {
        Some((b'(', rest)) => Ok(Bound {
            value: parse_f64(rest).map_err(|_| err("ERR min or max is not a float"))?,
            exclusive: true,
        }),
        _ => Ok(Bound {
            value: parse_f64(b).map_err(|_| err("ERR min or max is not a float"))?,
            exclusive: false,
        }),
    }
}

fn upper(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_uppercase()
}

fn direction(b: &[u8]) -> R<bool> {
    match upper(b).as_str() {
        "LEFT" => Ok(true),
        "RIGHT" => Ok(false),
        _ => Err(syntax()),
    }
}

fn stream_id_arg(b: &[u8], default_seq: u64) -> R<StreamId> {
    match b {
        b"-" => Ok(StreamId::default()),
        b"+" => Ok(StreamId::MAX),
        _ => StreamId::parse(b, default_seq)
            .ok_or_else(|| err("ERR Invalid stream ID specified as stream command argument")),
    }
}

/// Keys of one command in a cluster must share a slot.
pub(crate) fn check_slot(st: &State, keys: &[&[u8]]) -> R<()> {
    if !st.cluster {
        return Ok(());
    }
    let mut slots = keys.iter().map(|k| fred::util::redis_keyslot(k));
    if let Some(first) = slots.next()
        && slots.any(|s| s != first)
    {
        return Err(err("CROSSSLOT Keys in request don't hash to the same slot"));
    }
    Ok(())
}

fn entry_value(id: StreamId, fields: &[(Bytes, Bytes)]) -> Value {
    Value::Array(vec![
        bulk(id.bytes()),
        array(fields.iter().flat_map(|(k, v)| [k.clone(), v.clone()])),
    ])
}

/// Runs one command. `name` is upper case; a subcommand, when fred split one off, leads `args`.
#[allow(clippy::too_many_lines)]
pub(crate) fn execute(st: &mut State, now: u64, name: &str, args: &[Bytes]) -> R<Value> {
    let n = args.len();
    let need = |k: usize| if n < k { Err(wrong_args(name)) } else { Ok(()) };
    match name {
        // ---- connection and server ----
        "PING" => Ok(match args.first() {
            Some(m) => bulk(m.clone()),
            None => Value::String("PONG".into()),
        }),
        "ECHO" => {
            need(1)?;
            Ok(bulk(args[0].clone()))
        }
        "QUIT" | "SELECT" | "READONLY" | "READWRITE" | "ASKING" | "RESET" | "AUTH" => Ok(ok()),
        "TIME" => Ok(array([
            Bytes::from((now / 1000).to_string()),
            Bytes::from(((now % 1000) * 1000).to_string()),
        ])),
        "DBSIZE" => Ok(int(st.db.keys.len())),
        "FLUSHALL" | "FLUSHDB" => {
            st.db.keys.clear();
            Ok(ok())
        }
        "INFO" => Ok(bulk(Bytes::from_static(
            b"# Server\r\nredis_version:7.2.0\r\nredis_mode:standalone\r\nruststream_model:1\r\n",
        ))),
        "WAIT" => Ok(Value::Integer(0)),
        "CLIENT" => {
            need(1)?;
            match upper(&args[0]).as_str() {
                "ID" => {
                    st.next_client_id += 1;
                    Ok(Value::Integer(st.next_client_id))
                }
                "UNBLOCK" => Ok(Value::Integer(0)),
                "GETNAME" => Ok(Value::Null),
                "LIST" | "INFO" => Ok(bulk(Bytes::new())),
                _ => Ok(ok()),
            }
        }
        "SCRIPT" | "EVAL" | "EVALSHA" => super::lua::command(st, now, name, args),
        "PUBLISH" => {
            need(2)?;
            st.journal.push(Change::Channel {
                channel: args[0].clone(),
                message: args[1].clone(),
            });
            Ok(int(st.publish(&args[0], &args[1])))
        }
        "PUBSUB" => {
            need(1)?;
            match upper(&args[0]).as_str() {
                "NUMSUB" => Ok(Value::Array(
                    args[1..]
                        .iter()
                        .flat_map(|c| {
                            let n = st.channels.get(c).map_or(0, |tx| tx.receiver_count());
                            [bulk(c.clone()), int(n)]
                        })
                        .collect(),
                )),
                "NUMPAT" => Ok(int(st
                    .patterns
                    .iter()
                    .filter(|(_, tx)| tx.receiver_count() > 0)
                    .count())),
                "CHANNELS" => Ok(array(
                    st.channels
                        .iter()
                        .filter(|(c, tx)| {
                            tx.receiver_count() > 0 && args.get(1).is_none_or(|p| glob(p, c))
                        })
                        .map(|(c, _)| c.clone())
                        .collect::<Vec<_>>(),
                )),
                other => Err(err(format!(
                    "ERR the in-memory model does not implement 'PUBSUB {other}'"
                ))),
            }
        }

        // ---- keys ----
        "DEL" | "UNLINK" => {
            need(1)?;
            check_slot(st, &args.iter().map(|k| &k[..]).collect::<Vec<_>>())?;
            Ok(int(args.iter().filter(|k| st.db.remove(k)).count()))
        }
        "EXISTS" => {
            need(1)?;
            check_slot(st, &args.iter().map(|k| &k[..]).collect::<Vec<_>>())?;
            Ok(int(args.iter().filter(|k| st.db.get(k).is_some()).count()))
        }
        "TYPE" => {
            need(1)?;
            let t = st.db.get(&args[0]).map_or("none", |e| e.val.type_name());
            Ok(Value::String(t.into()))
        }
        "KEYS" => {
            need(1)?;
            let mut keys: Vec<Bytes> = st
                .db
                .keys
                .keys()
                .filter(|k| glob(&args[0], k))
                .cloned()
                .collect();
            keys.sort();
            Ok(array(keys))
        }
        "PEXPIRE" | "EXPIRE" => {
            need(2)?;
            let mut ttl = parse_i64(&args[1])?;
            if name == "EXPIRE" {
                ttl = ttl.saturating_mul(1000);
            }
            Ok(Value::Integer(i64::from(st.db.pexpire(&args[0], ttl, now))))
        }
        "PERSIST" => {
            need(1)?;
            Ok(Value::Integer(match st.db.keys.get_mut(&args[0]) {
                Some(e) if e.expires.is_some() => {
                    e.expires = None;
                    1
                }
                _ => 0,
            }))
        }
        "PTTL" | "TTL" => {
            need(1)?;
            Ok(Value::Integer(match st.db.get(&args[0]) {
                None => -2,
                Some(e) => match e.expires {
                    None => -1,
                    Some(t) => {
                        let ms = i64::try_from(t.saturating_sub(now)).unwrap_or(i64::MAX);
                        if name == "TTL" { (ms + 500) / 1000 } else { ms }
                    }
                },
            }))
        }

        // ---- strings ----
        "GET" => {
            need(1)?;
            match st.db.get(&args[0]).map(|e| &e.val) {
                None => Ok(Value::Null),
                Some(super::data::Val::Str(s)) => Ok(bulk(s.clone())),
                Some(_) => Err(super::data::wrongtype()),
            }
        }
        "SET" => {
            need(2)?;
            let mut expires = None;
            let (mut nx, mut xx) = (false, false);
            let mut i = 2;
            while i < n {
                match upper(&args[i]).as_str() {
                    "NX" => nx = true,
                    "XX" => xx = true,
                    "PX" | "EX" => {
                        let v = parse_i64(args.get(i + 1).ok_or_else(syntax)?)?;
                        let ms = if upper(&args[i]) == "EX" { v * 1000 } else { v };
                        expires = Some(now.saturating_add(ms.unsigned_abs()));
                        i += 1;
                    }
                    _ => return Err(syntax()),
                }
                i += 1;
            }
            let exists = st.db.get(&args[0]).is_some();
            if (nx && exists) || (xx && !exists) {
                return Ok(Value::Null);
            }
            st.db.keys.insert(
                args[0].clone(),
                super::data::Entry {
                    val: super::data::Val::Str(args[1].clone()),
                    expires,
                },
            );
            Ok(ok())
        }
        "INCR" | "INCRBY" | "DECR" | "DECRBY" => {
            need(1)?;
            let by = match name {
                "INCR" => 1,
                "DECR" => -1,
                "INCRBY" => parse_i64(args.get(1).ok_or_else(|| wrong_args(name))?)?,
                _ => -parse_i64(args.get(1).ok_or_else(|| wrong_args(name))?)?,
            };
            let cur = match st.db.get(&args[0]).map(|e| &e.val) {
                None => 0,
                Some(super::data::Val::Str(s)) => parse_i64(s)?,
                Some(_) => return Err(super::data::wrongtype()),
            };
            let new = cur
                .checked_add(by)
                .ok_or_else(|| err("ERR increment or decrement would overflow"))?;
            let expires = st.db.get(&args[0]).and_then(|e| e.expires);
            st.db.keys.insert(
                args[0].clone(),
                super::data::Entry {
                    val: super::data::Val::Str(Bytes::from(new.to_string())),
                    expires,
                },
            );
            Ok(Value::Integer(new))
        }

        // ---- lists ----
        "LPUSH" | "RPUSH" => {
            need(2)?;
            let len = st.db.push(&args[0], &args[1..], name == "LPUSH")?;
            st.journal.push(Change::List {
                key: args[0].clone(),
                values: args[1..].to_vec(),
            });
            Ok(int(len))
        }
        "LPOP" | "RPOP" => {
            need(1)?;
            let left = name == "LPOP";
            match args.get(1) {
                None => Ok(opt_bulk(st.db.pop(&args[0], 1, left)?.pop())),
                Some(c) => {
                    let popped = st.db.pop(&args[0], parse_usize(c)?, left)?;
                    Ok(if popped.is_empty() {
                        Value::Null
                    } else {
                        array(popped)
                    })
                }
            }
        }
        "BRPOP" | "BLPOP" => {
            need(2)?;
            let keys = &args[..n - 1];
            check_slot(st, &keys.iter().map(|k| &k[..]).collect::<Vec<_>>())?;
            for k in keys {
                if let Some(v) = st.db.pop(k, 1, name == "BLPOP")?.pop() {
                    return Ok(array([k.clone(), v]));
                }
            }
            Ok(Value::Null)
        }
        "LMOVE" | "BLMOVE" => {
            need(4)?;
            check_slot(st, &[&args[0], &args[1]])?;
            let from_left = direction(&args[2])?;
            let to_left = direction(&args[3])?;
            Ok(opt_bulk(
                st.db.lmove(&args[0], &args[1], from_left, to_left)?,
            ))
        }
        "RPOPLPUSH" | "BRPOPLPUSH" => {
            need(2)?;
            check_slot(st, &[&args[0], &args[1]])?;
            Ok(opt_bulk(st.db.lmove(&args[0], &args[1], false, true)?))
        }
        "LREM" => {
            need(3)?;
            Ok(int(st.db.lrem(&args[0], parse_i64(&args[1])?, &args[2])?))
        }
        "LTRIM" => {
            need(3)?;
            st.db
                .ltrim(&args[0], parse_i64(&args[1])?, parse_i64(&args[2])?)?;
            Ok(ok())
        }
        "LLEN" => {
            need(1)?;
            Ok(int(st.db.list(&args[0])?.map_or(0, |l| l.len())))
        }
        "LRANGE" => {
            need(3)?;
            let (start, stop) = (parse_i64(&args[1])?, parse_i64(&args[2])?);
            let Some(list) = st.db.list(&args[0])? else {
                return Ok(Value::Array(Vec::new()));
            };
            Ok(match rank_range(list.len(), start, stop) {
                Some((a, b)) => array(list.range(a..=b).cloned()),
                None => Value::Array(Vec::new()),
            })
        }
        "LINDEX" => {
            need(2)?;
            let i = parse_i64(&args[1])?;
            let Some(list) = st.db.list(&args[0])? else {
                return Ok(Value::Null);
            };
            let len = i64::try_from(list.len()).unwrap_or(i64::MAX);
            let i = if i < 0 { len + i } else { i };
            Ok(opt_bulk(
                usize::try_from(i).ok().and_then(|i| list.get(i)).cloned(),
            ))
        }

        // ---- hashes ----
        "HSET" | "HMSET" => {
            if n < 3 || !(n - 1).is_multiple_of(2) {
                return Err(wrong_args(name));
            }
            let mut added = 0;
            for pair in args[1..].chunks_exact(2) {
                added += usize::from(st.db.hset(&args[0], &pair[0], &pair[1])?);
                st.journal.push(Change::HashField {
                    field: pair[0].clone(),
                    value: pair[1].clone(),
                });
            }
            Ok(if name == "HMSET" { ok() } else { int(added) })
        }
        "HSETNX" => {
            need(3)?;
            let set = st.db.hsetnx(&args[0], &args[1], &args[2])?;
            if set {
                st.journal.push(Change::HashField {
                    field: args[1].clone(),
                    value: args[2].clone(),
                });
            }
            Ok(Value::Integer(i64::from(set)))
        }
        "HGET" => {
            need(2)?;
            Ok(opt_bulk(st.db.hget(&args[0], &args[1])?))
        }
        "HMGET" => {
            need(2)?;
            let mut out = Vec::new();
            for f in &args[1..] {
                out.push(opt_bulk(st.db.hget(&args[0], f)?));
            }
            Ok(Value::Array(out))
        }
        "HDEL" => {
            need(2)?;
            let mut removed = 0;
            for f in &args[1..] {
                removed += usize::from(st.db.hdel(&args[0], f)?);
            }
            Ok(int(removed))
        }
        "HLEN" => {
            need(1)?;
            Ok(int(st.db.hash(&args[0])?.map_or(0, |h| h.len())))
        }
        "HEXISTS" => {
            need(2)?;
            Ok(Value::Integer(i64::from(
                st.db.hget(&args[0], &args[1])?.is_some(),
            )))
        }
        "HGETALL" | "HKEYS" | "HVALS" => {
            need(1)?;
            let mut pairs: Vec<(Bytes, Bytes)> = st
                .db
                .hash(&args[0])?
                .map(|h| h.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            pairs.sort();
            Ok(array(pairs.into_iter().flat_map(|(k, v)| match name {
                "HKEYS" => vec![k],
                "HVALS" => vec![v],
                _ => vec![k, v],
            })))
        }

        // ---- sorted sets ----
        "ZADD" => zadd(st, args),
        "ZREM" => {
            need(2)?;
            let mut removed = 0;
            for m in &args[1..] {
                removed += usize::from(st.db.zrem(&args[0], m)?);
            }
            Ok(int(removed))
        }
        "ZCARD" => {
            need(1)?;
            Ok(int(st.db.zset(&args[0])?.map_or(0, |z| z.by_member.len())))
        }
        "ZSCORE" => {
            need(2)?;
            Ok(opt_bulk(
                st.db
                    .zset(&args[0])?
                    .and_then(|z| z.by_member.get(&args[1]))
                    .map(|s| fmt_score(*s)),
            ))
        }
        "ZCOUNT" => {
            need(3)?;
            let (min, max) = (parse_bound(&args[1])?, parse_bound(&args[2])?);
            Ok(int(st.db.zrangebyscore(&args[0], min, max, 0, -1)?.len()))
        }
        "ZRANGEBYSCORE" => {
            need(3)?;
            let (min, max) = (parse_bound(&args[1])?, parse_bound(&args[2])?);
            let (scores, offset, count) = range_options(&args[3..])?;
            let found = st.db.zrangebyscore(&args[0], min, max, offset, count)?;
            Ok(scored(found, scores))
        }
        "ZRANGE" => {
            need(3)?;
            let by_score = args[3..].iter().any(|a| upper(a) == "BYSCORE");
            let rest: Vec<Bytes> = args[3..]
                .iter()
                .filter(|a| upper(a) != "BYSCORE")
                .cloned()
                .collect();
            let (scores, offset, count) = range_options(&rest)?;
            let found = if by_score {
                let (min, max) = (parse_bound(&args[1])?, parse_bound(&args[2])?);
                st.db.zrangebyscore(&args[0], min, max, offset, count)?
            } else {
                st.db
                    .zrange(&args[0], parse_i64(&args[1])?, parse_i64(&args[2])?)?
            };
            Ok(scored(found, scores))
        }
        "ZREMRANGEBYSCORE" => {
            need(3)?;
            let (min, max) = (parse_bound(&args[1])?, parse_bound(&args[2])?);
            let found = st.db.zrangebyscore(&args[0], min, max, 0, -1)?;
            for (m, _) in &found {
                st.db.zrem(&args[0], m)?;
            }
            Ok(int(found.len()))
        }

        // ---- streams ----
        "XADD" => xadd(st, now, args),
        "XLEN" => {
            need(1)?;
            Ok(int(st.db.stream(&args[0])?.map_or(0, |s| s.entries.len())))
        }
        "XRANGE" | "XREVRANGE" => {
            need(3)?;
            let (a, b) = if name == "XRANGE" {
                (&args[1], &args[2])
            } else {
                (&args[2], &args[1])
            };
            let (start, end) = (stream_id_arg(a, 0)?, stream_id_arg(b, u64::MAX)?);
            let count = match args.get(3) {
                Some(c) if upper(c) == "COUNT" => parse_usize(args.get(4).ok_or_else(syntax)?)?,
                Some(_) => return Err(syntax()),
                None => usize::MAX,
            };
            let Some(s) = st.db.stream(&args[0])? else {
                return Ok(Value::Array(Vec::new()));
            };
            if start > end {
                return Ok(Value::Array(Vec::new()));
            }
            let range = s.entries.range(start..=end);
            let items: Vec<Value> = if name == "XRANGE" {
                range
                    .take(count)
                    .map(|(id, f)| entry_value(*id, f))
                    .collect()
            } else {
                range
                    .rev()
                    .take(count)
                    .map(|(id, f)| entry_value(*id, f))
                    .collect()
            };
            Ok(Value::Array(items))
        }
        "XDEL" => {
            need(2)?;
            let Some(s) = st.db.stream_mut(&args[0])? else {
                return Ok(Value::Integer(0));
            };
            let mut removed = 0;
            for a in &args[1..] {
                removed += usize::from(s.entries.remove(&stream_id_arg(a, 0)?).is_some());
            }
            Ok(int(removed))
        }
        "XGROUP" => xgroup(st, now, args),
        "XREADGROUP" => xreadgroup(st, now, args),
        "XACK" => {
            need(3)?;
            let mut acked = 0;
            for a in &args[2..] {
                acked += usize::from(st.db.xack(&args[0], &args[1], stream_id_arg(a, 0)?)?);
            }
            Ok(int(acked))
        }
        "XPENDING" => xpending(st, now, args),
        "XCLAIM" => xclaim(st, now, args),
        "XAUTOCLAIM" => xautoclaim(st, now, args),

        _ => Err(err(format!(
            "ERR unknown command '{name}': the in-memory Redis model of ruststream-testing does not implement it"
        ))),
    }
}

/// `WITHSCORES` and `LIMIT offset count` of a range command.
fn range_options(opts: &[Bytes]) -> R<(bool, usize, i64)> {
    let (mut scores, mut offset, mut count) = (false, 0, -1);
    let mut i = 0;
    while i < opts.len() {
        match upper(&opts[i]).as_str() {
            "WITHSCORES" => scores = true,
            "LIMIT" => {
                offset = parse_usize(opts.get(i + 1).ok_or_else(syntax)?)?;
                count = parse_i64(opts.get(i + 2).ok_or_else(syntax)?)?;
                i += 2;
            }
            _ => return Err(syntax()),
        }
        i += 1;
    }
    Ok((scores, offset, count))
}

fn scored(found: Vec<(Bytes, f64)>, scores: bool) -> Value {
    array(found.into_iter().flat_map(|(m, s)| {
        if scores {
            vec![m, fmt_score(s)]
        } else {
            vec![m]
        }
    }))
}

fn zadd(st: &mut State, args: &[Bytes]) -> R<Value> {
    if args.len() < 3 {
        return Err(wrong_args("ZADD"));
    }
    let (mut nx, mut xx, mut gt, mut lt, mut ch) = (false, false, false, false, false);
    let mut i = 1;
    while i < args.len() {
        match upper(&args[i]).as_str() {
            "NX" => nx = true,
            "XX" => xx = true,
            "GT" => gt = true,
            "LT" => lt = true,
            "CH" => ch = true,
            _ => break,
        }
        i += 1;
    }
    let pairs = &args[i..];
    if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
        return Err(syntax());
    }
    let mut parsed = Vec::new();
    for p in pairs.chunks_exact(2) {
        parsed.push((parse_f64(&p[0])?, p[1].clone()));
    }
    let mut changed = 0;
    for (score, member) in parsed {
        let old = st
            .db
            .zset(&args[0])?
            .and_then(|z| z.by_member.get(&member).copied());
        let skip = match old {
            Some(o) => nx || (gt && score <= o) || (lt && score >= o),
            None => xx,
        };
        if skip {
            continue;
        }
        let new = st.db.zadd(&args[0], score, &member)?;
        if new || (ch && old != Some(score)) {
            changed += 1;
        }
        st.journal.push(Change::Scored {
            key: args[0].clone(),
            member,
        });
    }
    Ok(int(changed))
}

fn xadd(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
    if args.len() < 4 {
        return Err(wrong_args("XADD"));
    }
    let key = &args[0];
    let mut i = 1;
    let mut nomkstream = false;
    let mut maxlen: Option<usize> = None;
    loop {
        match upper(args.get(i).ok_or_else(syntax)?).as_str() {
            "NOMKSTREAM" => nomkstream = true,
            "MAXLEN" => {
                let mut v = args.get(i + 1).ok_or_else(syntax)?;
                if &v[..] == b"~" || &v[..] == b"=" {
                    i += 1;
                    v = args.get(i + 1).ok_or_else(syntax)?;
                }
                maxlen = Some(parse_usize(v)?);
                i += 1;
            }
            _ => break,
        }
        i += 1;
    }
    let id = match &args[i][..] {
        b"*" => None,
        other => Some(stream_id_arg(other, 0)?),
    };
    let fields = &args[i + 1..];
    if fields.is_empty() || !fields.len().is_multiple_of(2) {
        return Err(wrong_args("XADD"));
    }
    if nomkstream && st.db.stream(key)?.is_none() {
        return Ok(Value::Null);
    }
    let pairs: Vec<(Bytes, Bytes)> = fields
        .chunks_exact(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    let id = st.db.xadd(key, id, now, pairs.clone())?;
    if let Some(max) = maxlen
        && let Some(s) = st.db.stream_mut(key)?
    {
        while s.entries.len() > max {
            s.entries.pop_first();
        }
    }
    st.journal.push(Change::Stream {
        key: key.clone(),
        fields: pairs,
    });
    Ok(bulk(id.bytes()))
}

fn xgroup(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
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

fn xreadgroup(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
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

fn xpending(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
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

fn xclaim(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
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

fn xautoclaim(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
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
