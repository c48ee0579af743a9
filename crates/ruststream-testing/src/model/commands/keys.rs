//! Key commands: existence, type, listing, expiry.

use super::*;

/// Runs the command `name` (upper case) of this module.
pub(super) fn execute(st: &mut State, now: u64, name: &str, args: &[Bytes]) -> R<Value> {
    let n = args.len();
    let need = |k: usize| if n < k { Err(wrong_args(name)) } else { Ok(()) };
    match name {
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
        _ => Err(unknown(name)),
    }
}
