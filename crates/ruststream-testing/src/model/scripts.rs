//! Rust versions of the broker's Lua scripts (`ruststream_redis::scripts`), run when `EVALSHA`
//! names their SHA-1.
//!
//! Each function follows its script line by line, calling the keyspace operations the way the
//! Lua calls `redis.call`; the conformance suite (`crates/ruststream/tests/conformance.rs`) runs
//! the same scenarios on this model and on a real Redis so the two cannot drift apart.
//!
//! **When a script changes**, its SHA-1 changes: [`PINNED`] records the SHA-1 of the Lua each
//! function was written against, and the model refuses (with an error naming the script) to run
//! a script whose Lua is no longer the pinned one, rather than run stale semantics. Update the
//! function here, its entry in [`PINNED`], and add a conformance scenario for the new behaviour.

use bytes::{BufMut, Bytes, BytesMut};
use fred::types::Value;
use ruststream_redis::frame::MAGIC;
use ruststream_redis::scripts;

use super::commands::{fmt_score, parse_f64, parse_i64};
use super::data::{Bound, R, StreamId, err};
use super::{Pushed, State};

/// A script's Rust version.
type ScriptFn = fn(&mut State, u64, &[Bytes], &[Bytes]) -> R<Value>;

/// `(name, SHA-1 of the Lua the Rust version follows, the Rust version, the script)`.
type Pin = (
    &'static str,
    &'static str,
    ScriptFn,
    &'static std::sync::LazyLock<fred::types::scripts::Script>,
);

/// Every script the model runs, with the SHA-1 of the Lua its Rust version was written against.
pub const PINNED: &[(&str, &str)] = &[
    ("CLAIM", "71220df9a4d9e3bdf50dde9b0eaabbb11d8d47fb"),
    ("SETTLE_LIST", "19c0a7e0c95e0316dd4d6cf387ec2122654b97fd"),
    ("MOVE_DUE", "e749a24aa7ec6e9e499d23292f885f68f9be1a73"),
    ("SCHEDULE", "0e6e55d565e3c994df3db8610485aa377e46919d"),
    ("PUSH_TTL", "44f19be3f3f334de949ac03b946bb1cf7bb4931c"),
    ("SETTLE_STREAM", "2277d08833541fa120f331494c7fd14b3cd3c808"),
];

fn table() -> [Pin; 6] {
    [
        ("CLAIM", PINNED[0].1, claim, &scripts::CLAIM),
        (
            "SETTLE_LIST",
            PINNED[1].1,
            settle_list,
            &scripts::SETTLE_LIST,
        ),
        ("MOVE_DUE", PINNED[2].1, move_due, &scripts::MOVE_DUE),
        ("SCHEDULE", PINNED[3].1, schedule, &scripts::SCHEDULE),
        ("PUSH_TTL", PINNED[4].1, push_ttl, &scripts::PUSH_TTL),
        (
            "SETTLE_STREAM",
            PINNED[5].1,
            settle_stream,
            &scripts::SETTLE_STREAM,
        ),
    ]
}

/// The scripts whose Lua differs from the version their Rust versions follow: `(name, sha1)`.
pub fn drifted() -> Vec<(&'static str, String)> {
    table()
        .into_iter()
        .filter(|(_, pinned, _, script)| &**script.sha1() != *pinned)
        .map(|(name, _, _, script)| (name, script.sha1().to_string()))
        .collect()
}

/// Runs the script with SHA-1 `sha`.
pub(crate) fn run(st: &mut State, now: u64, sha: &str, keys: &[Bytes], argv: &[Bytes]) -> R<Value> {
    for (name, pinned, f, script) in table() {
        if &**script.sha1() == sha {
            if sha != pinned {
                return Err(err(format!(
                    "ERR the in-memory Redis model runs the {name} script as it was when pinned (sha1 {pinned}); its Lua changed (sha1 {sha}): update ruststream-testing/src/model/scripts.rs and its conformance scenarios"
                )));
            }
            return f(st, now, keys, argv);
        }
    }
    Err(err(format!(
        "ERR the in-memory Redis model does not know the script with sha1 {sha}: only the broker's own scripts run on it"
    )))
}

fn key(keys: &[Bytes], i: usize) -> R<&Bytes> {
    keys.get(i)
        .ok_or_else(|| err("ERR Lua redis() command arguments must be strings or integers"))
}

fn arg(argv: &[Bytes], i: usize) -> R<&Bytes> {
    argv.get(i)
        .ok_or_else(|| err("ERR Lua redis() command arguments must be strings or integers"))
}

fn num(b: &[u8]) -> R<f64> {
    parse_f64(b)
}

#[allow(clippy::cast_precision_loss)]
fn ms_f(now: u64) -> f64 {
    now as f64
}

/// A Lua number as `..` or `tostring` prints it (integers without a fraction).
#[allow(clippy::cast_possible_truncation)]
fn lua_num(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e14 {
        (n as i64).to_string()
    } else {
        format!("{n}")
    }
}

/// A Lua number returned to the client: truncated to an integer.
#[allow(clippy::cast_possible_truncation)]
fn lua_int(n: f64) -> Value {
    Value::Integer(n as i64)
}

fn inf(exclusive: bool, value: f64) -> Bound {
    Bound { value, exclusive }
}

/// `bump` of CLAIM: the frame's attempt + 1; a raw value becomes a frame with attempt 2.
fn bump(v: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(v.len() + 8);
    if v.starts_with(MAGIC) && v.len() >= 8 {
        let a = u32::from_be_bytes([v[4], v[5], v[6], v[7]]);
        b.put_slice(&v[..4]);
        b.put_u32(a.wrapping_add(1));
        b.put_slice(&v[8..]);
    } else {
        b.put_slice(MAGIC);
        b.put_u32(2);
        b.put_u16(0);
        b.put_u16(0);
        b.put_slice(v);
    }
    b.freeze()
}

/// CLAIM: sweep stale claims back to the queue, then `LMOVE` up to `ARGV[1]` entries.
fn claim(st: &mut State, now: u64, keys: &[Bytes], argv: &[Bytes]) -> R<Value> {
    let (q, p) = (key(keys, 0)?, key(keys, 1)?);
    let mut recovered = 0i64;
    let mut out = Vec::new();
    let rid = arg(argv, 1)?.clone();
    if !rid.is_empty() {
        let z = key(keys, 2)?;
        let max = ms_f(now) - num(arg(argv, 3)?)?;
        let limit = parse_i64(arg(argv, 5)?)?;
        let stale =
            st.db
                .zrangebyscore(z, inf(false, f64::NEG_INFINITY), inf(false, max), 0, limit)?;
        for (m, _) in stale {
            st.db.zrem(z, &m)?;
            let v = member_value(&m)?;
            if st.db.lrem(p, -1, &v)? > 0 {
                st.db.push(q, &[bump(&v)], true)?;
                recovered += 1;
            }
        }
    }
    // Read only with recovery: without it, ARGV stops at the reader id.
    let seq = if rid.is_empty() {
        0.0
    } else {
        num(arg(argv, 2)?)?
    };
    let max = parse_i64(arg(argv, 0)?)?;
    let mut i = 1;
    while i <= max {
        let Some(v) = st.db.lmove(q, p, false, true)? else {
            break;
        };
        if !rid.is_empty() {
            #[allow(clippy::cast_precision_loss)]
            let n = seq + (i - 1) as f64;
            let mut member = BytesMut::new();
            member.put_slice(&rid);
            member.put_slice(format!(":{}:", lua_num(n)).as_bytes());
            member.put_slice(&v);
            st.db.zadd(key(keys, 2)?, ms_f(now), &member.freeze())?;
        }
        out.push(Value::Bytes(v));
        i += 1;
    }
    if !rid.is_empty() && !out.is_empty() && num(arg(argv, 4)?)? > 0.0 {
        let ttl = parse_i64(arg(argv, 4)?)?;
        st.db.pexpire(key(keys, 2)?, ttl, now);
    }
    let mut reply = vec![Value::Integer(recovered)];
    reply.extend(out);
    Ok(Value::Array(reply))
}

/// The value part of a recovery-set member `<reader>:<seq>:<value>`.
fn member_value(m: &[u8]) -> R<Bytes> {
    let p = m
        .iter()
        .position(|b| *b == b':')
        .ok_or_else(|| err("ERR user_script: malformed claim member"))?;
    let q = m[p + 1..]
        .iter()
        .position(|b| *b == b':')
        .ok_or_else(|| err("ERR user_script: malformed claim member"))?;
    Ok(Bytes::copy_from_slice(&m[p + 1 + q + 1..]))
}

/// `delay_ms:id` of a delayed settle: `(delay, id)`.
fn delay_and_id(a: &[u8]) -> R<(f64, Bytes)> {
    let sep = a
        .iter()
        .position(|b| *b == b':')
        .ok_or_else(|| err("ERR user_script: malformed delay argument"))?;
    Ok((num(&a[..sep])?, Bytes::copy_from_slice(&a[sep + 1..])))
}

/// SETTLE_LIST: groups of `op claimed new arg member`.
fn settle_list(st: &mut State, now: u64, keys: &[Bytes], argv: &[Bytes]) -> R<Value> {
    let mut found = 0;
    for g in argv.chunks(5) {
        let [op, claimed, new, a, member] = g else {
            return Err(err("ERR user_script: incomplete settle group"));
        };
        let owned = if member.is_empty() {
            st.db.lrem(key(keys, 1)?, -1, claimed)? > 0
        } else {
            st.db.zrem(key(keys, 5)?, member)? && st.db.lrem(key(keys, 1)?, -1, claimed)? > 0
        };
        if !owned {
            continue;
        }
        found += 1;
        match &op[..] {
            b"r" => {
                st.db.push(key(keys, 0)?, std::slice::from_ref(new), true)?;
            }
            b"x" => {
                st.db.push(key(keys, 2)?, std::slice::from_ref(new), true)?;
            }
            b"d" => {
                let (delay, id) = delay_and_id(a)?;
                st.db.zadd(key(keys, 3)?, ms_f(now) + delay, &id)?;
                st.db.hset(key(keys, 4)?, &id, new)?;
            }
            _ => {}
        }
    }
    Ok(Value::Integer(found))
}

/// `frame_fields` of MOVE_DUE: a list frame as stream fields.
fn frame_fields(v: &Bytes) -> R<Vec<(Bytes, Bytes)>> {
    if !v.starts_with(MAGIC) || v.len() < 12 {
        return Ok(vec![(Bytes::from_static(b"payload"), v.clone())]);
    }
    let short = || err("ERR user_script: data string too short");
    // Lua's string.sub: clamps to the string.
    let sub = |from: usize, len: usize| v.slice(from.min(v.len())..(from + len).min(v.len()));
    let u16_at = |pos: usize| -> R<usize> {
        v.get(pos..pos + 2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
            .ok_or_else(short)
    };
    let u32_at = |pos: usize| -> R<u32> {
        v.get(pos..pos + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(short)
    };
    let attempt = u32_at(4)?;
    let mut pos = 8;
    let len = u16_at(pos)?;
    pos += 2;
    let mut f = vec![
        (Bytes::from_static(b"rs.id"), sub(pos, len)),
        (
            Bytes::from_static(b"rs.attempt"),
            Bytes::from(attempt.to_string()),
        ),
    ];
    pos += len;
    let n = u16_at(pos)?;
    pos += 2;
    for _ in 0..n {
        let kl = u16_at(pos)?;
        pos += 2;
        let k = sub(pos, kl);
        pos += kl;
        let vl = usize::try_from(u32_at(pos)?).unwrap_or(usize::MAX);
        pos += 4;
        let val = sub(pos, vl);
        pos = pos.saturating_add(vl);
        f.push((k, val));
    }
    f.push((Bytes::from_static(b"payload"), v.slice(pos.min(v.len())..)));
    Ok(f)
}

/// MOVE_DUE: due entries of a delayed set to their list (`RPUSH`, latest first) or stream.
fn move_due(st: &mut State, now: u64, keys: &[Bytes], argv: &[Bytes]) -> R<Value> {
    let (delayed, payloads, dest) = (key(keys, 0)?, key(keys, 1)?, key(keys, 2)?);
    let limit = parse_i64(arg(argv, 0)?)?;
    let stream = argv.get(1).is_some_and(|k| &k[..] == b"stream");
    let due = st.db.zrangebyscore(
        delayed,
        inf(false, f64::NEG_INFINITY),
        inf(false, ms_f(now)),
        0,
        limit,
    )?;
    let mut moved = 0;
    let mut lateness = Vec::new();
    let order: Vec<&(Bytes, f64)> = if stream {
        due.iter().collect()
    } else {
        due.iter().rev().collect()
    };
    for (id, score) in order {
        if let Some(v) = st.db.hget(payloads, id)? {
            if stream {
                let fields = frame_fields(&v)?;
                st.db.xadd(dest, None, now, fields)?;
            } else {
                st.db.push(dest, &[v], false)?;
            }
            st.db.hdel(payloads, id)?;
            moved += 1;
            // The score as ZRANGEBYSCORE .. WITHSCORES prints it, read back by tonumber.
            lateness.push(lua_int(ms_f(now) - num(&fmt_score(*score))?));
        }
        st.db.zrem(delayed, id)?;
    }
    let next = st
        .db
        .zrange(delayed, 0, 0)?
        .first()
        .map_or(Value::Integer(-1), |(_, s)| lua_int(*s));
    let mut out = vec![Value::Integer(moved), lua_int(ms_f(now)), next];
    out.extend(lateness);
    Ok(Value::Array(out))
}

/// SCHEDULE: groups of `kind ms id value`; an id already waiting keeps its schedule.
fn schedule(st: &mut State, now: u64, keys: &[Bytes], argv: &[Bytes]) -> R<Value> {
    let (delayed, payloads) = (key(keys, 0)?, key(keys, 1)?);
    let mut earliest = st.db.zrange(delayed, 0, 0)?.first().map(|(_, s)| *s);
    let mut wake = false;
    let mut added = 0;
    for g in argv.chunks(4) {
        let [kind, ms, id, value] = g else {
            return Err(err("ERR user_script: incomplete schedule group"));
        };
        let mut due = num(ms)?;
        if &kind[..] == b"in" {
            due += ms_f(now);
        }
        if st.db.hsetnx(payloads, id, value)? {
            st.db.zadd(delayed, due, id)?;
            added += 1;
            st.record(delayed, Pushed::Scheduled(value.clone()));
            if earliest.is_none_or(|e| due < e) {
                earliest = Some(due);
                wake = true;
            }
        }
    }
    if wake {
        st.publish(delayed, b"");
    }
    Ok(Value::Integer(added))
}

/// PUSH_TTL: `LPUSH` the values, then `PEXPIRE` the list.
fn push_ttl(st: &mut State, now: u64, keys: &[Bytes], argv: &[Bytes]) -> R<Value> {
    let list = key(keys, 0)?;
    let ttl = parse_i64(arg(argv, 0)?)?;
    let values = &argv[1..];
    let mut n = 0;
    for chunk in values.chunks(1000) {
        n = st.db.push(list, chunk, true)?;
    }
    st.record_list_push(list, values);
    st.db.pexpire(list, ttl, now);
    Ok(Value::Integer(i64::try_from(n).unwrap_or(i64::MAX)))
}

/// SETTLE_STREAM: `group`, then per entry `op entry_id n v1..vn`.
fn settle_stream(st: &mut State, now: u64, keys: &[Bytes], argv: &[Bytes]) -> R<Value> {
    let (stream, dead) = (key(keys, 0)?, key(keys, 1)?);
    let group = arg(argv, 0)?;
    let mut found = 0;
    let mut i = 1;
    while i < argv.len() {
        let op = arg(argv, i)?;
        let id = StreamId::parse(arg(argv, i + 1)?, 0)
            .ok_or_else(|| err("ERR Invalid stream ID specified as stream command argument"))?;
        let n = usize::try_from(parse_i64(arg(argv, i + 2)?)?).unwrap_or(0);
        let vals = argv
            .get(i + 3..i + 3 + n)
            .ok_or_else(|| err("ERR user_script: incomplete settle group"))?;
        if st.db.xack(stream, group, id)? {
            found += 1;
            match &op[..] {
                b"r" => {
                    let fields = vals
                        .chunks_exact(2)
                        .map(|p| (p[0].clone(), p[1].clone()))
                        .collect();
                    st.db.xadd(stream, None, now, fields)?;
                }
                b"x" => {
                    st.db.push(dead, &vals[..1.min(vals.len())], true)?;
                }
                b"d" => {
                    let (delay, mid) = delay_and_id(arg(vals, 0)?)?;
                    st.db.zadd(key(keys, 2)?, ms_f(now) + delay, &mid)?;
                    st.db.hset(key(keys, 3)?, &mid, arg(vals, 1)?)?;
                }
                _ => {}
            }
        }
        i += 3 + n;
    }
    Ok(Value::Integer(found))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_is_the_pinned_version() {
        let drifted = drifted();
        assert!(
            drifted.is_empty(),
            "scripts changed since the in-memory model was written: {drifted:?}; update ruststream-testing/src/model/scripts.rs (and PINNED) to the new Lua, then run the conformance suite on both backends"
        );
    }

    #[test]
    fn bump_raises_the_attempt_or_frames_a_raw_value() {
        let framed = ruststream_redis::frame::encode_parts("m", 3, &Default::default(), b"p");
        let bumped = ruststream_redis::frame::Frame::decode(bump(&framed));
        assert_eq!((bumped.attempt, bumped.id.as_str()), (4, "m"));
        let raw = ruststream_redis::frame::Frame::decode(bump(b"{\"a\":1}"));
        assert_eq!((raw.attempt, &raw.payload[..]), (2, &b"{\"a\":1}"[..]));
    }

    #[test]
    fn frame_fields_match_the_frame() {
        let mut headers = ruststream_core::Headers::new();
        headers.insert("tenant".into(), "acme".into());
        let framed = ruststream_redis::frame::encode_parts("m-1", 2, &headers, b"{}");
        let f = frame_fields(&framed).unwrap();
        let names: Vec<&[u8]> = f.iter().map(|(k, _)| &k[..]).collect();
        assert_eq!(names, [&b"rs.id"[..], b"rs.attempt", b"tenant", b"payload"]);
        assert_eq!(&f[1].1[..], b"2");
        assert_eq!(&f[3].1[..], b"{}");
        assert_eq!(frame_fields(&Bytes::from_static(b"raw")).unwrap().len(), 1);
    }
}
