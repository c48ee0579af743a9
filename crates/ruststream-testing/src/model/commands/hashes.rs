//! Hash commands.

use super::*;

/// Runs the command `name` (upper case) of this module.
pub(super) fn execute(st: &mut State, name: &str, args: &[Bytes]) -> R<Value> {
    let n = args.len();
    let need = |k: usize| if n < k { Err(wrong_args(name)) } else { Ok(()) };
    match name {
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
        _ => Err(unknown(name)),
    }
}
