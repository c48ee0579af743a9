//! String commands.

use super::*;

/// Runs the command `name` (upper case) of this module.
pub(super) fn execute(st: &mut State, now: u64, name: &str, args: &[Bytes]) -> R<Value> {
    let n = args.len();
    let need = |k: usize| if n < k { Err(wrong_args(name)) } else { Ok(()) };
    match name {
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
        _ => Err(unknown(name)),
    }
}
