//! Values crossing between the model's commands and Lua, converted the way Redis 7 converts
//! them (the "Data type conversion" rules of Redis's Lua scripting, RESP2):
//!
//! - a reply handed to the script by `redis.call`: integer → number, bulk string → string, nil
//!   bulk → `false`, array → table (nested), status → `{ok = ..}`, error → `{err = ..}`;
//! - what the script returns: number → integer (truncated), string → bulk string, table →
//!   array up to its first `nil` (nested), `{ok = ..}` → status, `{err = ..}` → error, `true`
//!   → 1, `false` and `nil` → nil;
//! - a number passed to `redis.call` → the string C's `%.17g` writes (`3`, `1.5`,
//!   `0.10000000000000001`, `1e+17`).

use bytes::Bytes;
use fred::types::Value;
use mlua::{Lua, Value as LuaValue};

/// Deepest table nesting a script's reply may have (a table holding itself has no end).
const MAX_DEPTH: usize = 256;

/// A Lua number as C's `printf("%.17g", n)` writes it.
pub(crate) fn format_number(n: f64) -> String {
    if n.is_nan() {
        return if n.is_sign_negative() { "-nan" } else { "nan" }.to_owned();
    }
    if n.is_infinite() {
        return if n > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if n == 0.0 {
        return if n.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    // 17 significant digits: one before the point, 16 after; the exponent is the rounded one.
    let scientific = format!("{n:.16e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if !(-4..17).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!(
            "{}e{sign}{:02}",
            trim_fraction(mantissa),
            exponent.unsigned_abs()
        );
    }
    let decimals = usize::try_from(16 - exponent).unwrap_or(0);
    trim_fraction(&format!("{n:.decimals$}")).to_owned()
}

/// `1.500` → `1.5`, `2.000` → `2`; a number with no point is left alone.
fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// A Lua number returned to the client, as Redis's C cast makes it an integer: truncated toward
/// zero, and `i64::MIN` when out of range or not a number (as on the x86-64 servers Redis runs
/// on).
pub(crate) fn number_to_integer(n: f64) -> i64 {
    // 2^63: the first double past i64::MAX.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if n.is_nan() || !(-LIMIT..LIMIT).contains(&n) {
        return i64::MIN;
    }
    #[allow(clippy::cast_possible_truncation)]
    let i = n as i64;
    i
}

/// A `redis.call` argument: a string as is, a number as `%.17g` writes it; `None` for any other
/// type.
pub(crate) fn argument(v: &LuaValue) -> Option<Bytes> {
    match v {
        LuaValue::String(s) => Some(Bytes::copy_from_slice(&s.as_bytes())),
        #[allow(clippy::cast_precision_loss)]
        LuaValue::Integer(i) => Some(Bytes::from(format_number(*i as f64))),
        LuaValue::Number(n) => Some(Bytes::from(format_number(*n))),
        _ => None,
    }
}

/// A command's reply as the script sees it.
pub(crate) fn reply_to_lua(lua: &Lua, reply: Value) -> mlua::Result<LuaValue> {
    Ok(match reply {
        #[allow(clippy::cast_precision_loss)]
        Value::Integer(i) => LuaValue::Number(i as f64),
        Value::Bytes(b) => LuaValue::String(lua.create_string(&b)?),
        Value::String(s) => status_table(lua, s.as_bytes())?,
        Value::Queued => status_table(lua, b"QUEUED")?,
        Value::Null => LuaValue::Boolean(false),
        Value::Boolean(b) => LuaValue::Number(if b { 1.0 } else { 0.0 }),
        Value::Double(d) => LuaValue::String(lua.create_string(format_number(d))?),
        Value::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for item in items {
                table.raw_push(reply_to_lua(lua, item)?)?;
            }
            LuaValue::Table(table)
        }
        Value::Map(map) => {
            let table = lua.create_table_with_capacity(map.len() * 2, 0)?;
            for (k, v) in map.inner() {
                table.raw_push(lua.create_string(k.as_bytes())?)?;
                table.raw_push(reply_to_lua(lua, v)?)?;
            }
            LuaValue::Table(table)
        }
    })
}

fn status_table(lua: &Lua, status: &[u8]) -> mlua::Result<LuaValue> {
    let table = lua.create_table()?;
    table.raw_set("ok", lua.create_string(status)?)?;
    Ok(LuaValue::Table(table))
}

/// A `{err = ..}` table: how `redis.call` hands an error reply to the script.
pub(crate) fn error_table(lua: &Lua, message: &str) -> mlua::Result<LuaValue> {
    let table = lua.create_table()?;
    table.raw_set("err", lua.create_string(message)?)?;
    Ok(LuaValue::Table(table))
}

/// What a script returned, as the reply to `EVAL`/`EVALSHA`; `Err` is an error reply's text
/// (an error anywhere in a nested array makes the whole reply that error).
pub(crate) fn lua_to_reply(v: &LuaValue) -> Result<Value, String> {
    to_reply(v, 0)
}

fn to_reply(v: &LuaValue, depth: usize) -> Result<Value, String> {
    Ok(match v {
        LuaValue::Boolean(true) => Value::Integer(1),
        LuaValue::Integer(i) => Value::Integer(*i),
        LuaValue::Number(n) => Value::Integer(number_to_integer(*n)),
        LuaValue::String(s) => Value::Bytes(Bytes::copy_from_slice(&s.as_bytes())),
        LuaValue::Table(t) => {
            if depth >= MAX_DEPTH {
                return Err("ERR reached lua stack limit".to_owned());
            }
            if let Ok(LuaValue::String(e)) = t.raw_get::<LuaValue>("err") {
                return Err(e.to_string_lossy());
            }
            if let Ok(LuaValue::String(s)) = t.raw_get::<LuaValue>("ok") {
                return Ok(Value::String(s.to_string_lossy().into()));
            }
            let mut items = Vec::new();
            for i in 1.. {
                match t.raw_get::<LuaValue>(i) {
                    Ok(LuaValue::Nil) | Err(_) => break,
                    Ok(item) => items.push(to_reply(&item, depth + 1)?),
                }
            }
            Value::Array(items)
        }
        _ => Value::Null,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_print_as_percent_17g() {
        for (n, text) in [
            (3.0, "3"),
            (-7.0, "-7"),
            (1.5, "1.5"),
            (0.1, "0.10000000000000001"),
            (1.0 / 3.0, "0.33333333333333331"),
            (9_007_199_254_740_992.0, "9007199254740992"),
            (1e15, "1000000000000000"),
            (1e16, "10000000000000000"),
            (1e17, "1e+17"),
            (123_456_789_012_345_678.0, "1.2345678901234568e+17"),
            (1e-5, "1.0000000000000001e-05"),
            (0.0001, "0.0001"),
            (1e300, "1.0000000000000001e+300"),
            (1_764_500_000_123.0, "1764500000123"),
            (-0.0, "-0"),
            (0.0, "0"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ] {
            assert_eq!(format_number(n), text, "{n:e}");
        }
    }

    #[test]
    fn returned_numbers_truncate_like_a_c_cast() {
        assert_eq!(number_to_integer(3.99), 3);
        assert_eq!(number_to_integer(-3.7), -3);
        assert_eq!(number_to_integer(2f64.powi(63)), i64::MIN);
        assert_eq!(number_to_integer(-(2f64.powi(63))), i64::MIN);
        assert_eq!(number_to_integer(1e300), i64::MIN);
        assert_eq!(number_to_integer(f64::NAN), i64::MIN);
    }
}
