//! List commands (blocking ones answer at once: see the module above).

use super::*;

/// Runs the command `name` (upper case) of this module.
pub(super) fn execute(st: &mut State, name: &str, args: &[Bytes]) -> R<Value> {
    let n = args.len();
    let need = |k: usize| if n < k { Err(wrong_args(name)) } else { Ok(()) };
    match name {
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
        _ => Err(unknown(name)),
    }
}
