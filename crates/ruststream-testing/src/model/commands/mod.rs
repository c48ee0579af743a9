//! The commands the model understands: argument parsing and replies shaped as Redis (RESP2)
//! shapes them, over the keyspace operations of `data`.
//!
//! Blocking commands (`BRPOP`, `BLMOVE`, `XREADGROUP .. BLOCK`) answer at once, as if their
//! timeout had passed; the reader awaits the model's readiness first (see
//! `ruststream_redis::memory`). A command the model does not know is an error that names it.

mod claims;
mod groups;
mod hashes;
mod keys;
mod lists;
mod server;
mod streams;
mod strings;
mod trims;
mod zsets;

use bytes::Bytes;
use fred::types::Value;

use super::data::{Bound, Pending, R, StreamId, err, glob, rank_range};
use super::publishes::Change;
use super::{State, data, lua};

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

/// The options and streams of `XREAD` / `XREADGROUP` after `GROUP g c`:
/// `[COUNT n] [BLOCK ms] [NOACK] STREAMS key.. id..`.
struct StreamsRead<'a> {
    count: usize,
    noack: bool,
    keys: &'a [Bytes],
    ids: &'a [Bytes],
}

/// Parses [`StreamsRead`]; `cmd` and `id` name the command and its id form in the error of an
/// unbalanced list. `BLOCK` is read and ignored: the model answers at once.
fn parse_read<'a>(args: &'a [Bytes], cmd: &str, id: &str) -> R<StreamsRead<'a>> {
    let mut count = usize::MAX;
    let mut noack = false;
    let mut i = 0;
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
    // No STREAMS (the loop ran off the end): Redis's syntax error, not a slice past the end.
    let rest = args.get(i + 1..).ok_or_else(syntax)?;
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return Err(err(format!(
            "ERR Unbalanced '{cmd}' list of streams: for each stream key an ID or {id} must be specified."
        )));
    }
    let (keys, ids) = rest.split_at(rest.len() / 2);
    Ok(StreamsRead {
        count,
        noack,
        keys,
        ids,
    })
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

/// The error of a command the model does not implement.
fn unknown(name: &str) -> fred::error::Error {
    err(format!(
        "ERR unknown command '{name}': the in-memory Redis model of ruststream-testing does not implement it"
    ))
}

/// Runs one command. `name` is upper case; a subcommand, when fred split one off, leads `args`.
pub(crate) fn execute(st: &mut State, now: u64, name: &str, args: &[Bytes]) -> R<Value> {
    match name {
        "PING" | "ECHO" | "QUIT" | "SELECT" | "READONLY" | "READWRITE" | "ASKING" | "RESET"
        | "AUTH" | "TIME" | "DBSIZE" | "FLUSHALL" | "FLUSHDB" | "INFO" | "WAIT" | "CLIENT"
        | "SCRIPT" | "EVAL" | "EVALSHA" | "PUBLISH" | "SPUBLISH" | "PUBSUB" => {
            server::execute(st, now, name, args)
        }
        "DEL" | "UNLINK" | "EXISTS" | "TYPE" | "KEYS" | "PEXPIRE" | "EXPIRE" | "PERSIST"
        | "PTTL" | "TTL" => keys::execute(st, now, name, args),
        "GET" | "SET" | "INCR" | "INCRBY" | "DECR" | "DECRBY" => {
            strings::execute(st, now, name, args)
        }
        "LPUSH" | "RPUSH" | "LPOP" | "RPOP" | "BRPOP" | "BLPOP" | "LMOVE" | "BLMOVE"
        | "RPOPLPUSH" | "BRPOPLPUSH" | "LREM" | "LTRIM" | "LLEN" | "LRANGE" | "LINDEX" => {
            lists::execute(st, name, args)
        }
        "HSET" | "HMSET" | "HSETNX" | "HGET" | "HMGET" | "HDEL" | "HLEN" | "HEXISTS"
        | "HGETALL" | "HKEYS" | "HVALS" => hashes::execute(st, name, args),
        "ZADD" | "ZREM" | "ZCARD" | "ZSCORE" | "ZCOUNT" | "ZRANGEBYSCORE" | "ZRANGE"
        | "ZREMRANGEBYSCORE" => zsets::execute(st, name, args),
        "XADD" | "XLEN" | "XRANGE" | "XREVRANGE" | "XDEL" | "XACK" | "XTRIM" | "XREAD" => {
            streams::execute(st, now, name, args)
        }
        "XGROUP" => groups::xgroup(st, now, args),
        "XREADGROUP" => groups::xreadgroup(st, now, args),
        "XPENDING" => groups::xpending(st, now, args),
        "XINFO" => groups::xinfo(st, now, args),
        "XCLAIM" => claims::xclaim(st, now, args),
        "XAUTOCLAIM" => claims::xautoclaim(st, now, args),
        _ => Err(unknown(name)),
    }
}
