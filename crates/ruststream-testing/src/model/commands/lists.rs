//! List commands (blocking ones answer at once: see the module above).

use super::*;

/// Runs the command `name` (upper case) of this module.
pub(super) fn execute(st: &mut State, name: &str, args: &[Bytes]) -> R<Value> {
    // Arity first, as Redis checks it before a command runs; an unknown name has none.
    let least = match name {
        "LPOP" | "RPOP" | "LLEN" => 1,
        "LPUSH" | "RPUSH" | "BRPOP" | "BLPOP" | "RPOPLPUSH" | "BRPOPLPUSH" | "LINDEX" => 2,
        "LREM" | "LTRIM" | "LRANGE" => 3,
        "LMOVE" | "BLMOVE" => 4,
        _ => return Err(unknown(name)),
    };
    if args.len() < least {
        return Err(wrong_args(name));
    }
    match name {
        "LPUSH" | "RPUSH" => push(st, args, name == "LPUSH"),
        "LPOP" | "RPOP" => pop(st, args, name == "LPOP"),
        "BRPOP" | "BLPOP" => blocking_pop(st, args, name == "BLPOP"),
        "LMOVE" | "BLMOVE" => {
            check_slot(st, &[&args[0], &args[1]])?;
            let from_left = direction(&args[2])?;
            let to_left = direction(&args[3])?;
            Ok(opt_bulk(
                st.db.lmove(&args[0], &args[1], from_left, to_left)?,
            ))
        }
        "RPOPLPUSH" | "BRPOPLPUSH" => {
            check_slot(st, &[&args[0], &args[1]])?;
            Ok(opt_bulk(st.db.lmove(&args[0], &args[1], false, true)?))
        }
        "LREM" => Ok(int(st.db.lrem(&args[0], parse_i64(&args[1])?, &args[2])?)),
        "LTRIM" => {
            st.db
                .ltrim(&args[0], parse_i64(&args[1])?, parse_i64(&args[2])?)?;
            Ok(ok())
        }
        "LLEN" => Ok(int(st.db.list(&args[0])?.map_or(0, |l| l.len()))),
        "LRANGE" => lrange(st, args),
        "LINDEX" => lindex(st, args),
        _ => Err(unknown(name)),
    }
}

/// `LPUSH`/`RPUSH key value..`: the list's new length; journaled for the model's observers.
fn push(st: &mut State, args: &[Bytes], left: bool) -> R<Value> {
    let len = st.db.push(&args[0], &args[1..], left)?;
    st.journal.push(Change::List {
        key: args[0].clone(),
        values: args[1..].to_vec(),
    });
    Ok(int(len))
}

/// `LPOP`/`RPOP key [count]`: one value without a count, an array (nil when none) with one.
fn pop(st: &mut State, args: &[Bytes], left: bool) -> R<Value> {
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

/// `BLPOP`/`BRPOP key.. timeout`: the first key with a value and that value, or nil at once.
fn blocking_pop(st: &mut State, args: &[Bytes], left: bool) -> R<Value> {
    let keys = &args[..args.len() - 1];
    check_slot(st, &keys.iter().map(|k| &k[..]).collect::<Vec<_>>())?;
    for k in keys {
        if let Some(v) = st.db.pop(k, 1, left)?.pop() {
            return Ok(array([k.clone(), v]));
        }
    }
    Ok(Value::Null)
}

/// `LRANGE key start stop`, indices as Redis reads them (negative from the tail).
fn lrange(st: &State, args: &[Bytes]) -> R<Value> {
    let (start, stop) = (parse_i64(&args[1])?, parse_i64(&args[2])?);
    let Some(list) = st.db.list(&args[0])? else {
        return Ok(Value::Array(Vec::new()));
    };
    Ok(match rank_range(list.len(), start, stop) {
        Some((a, b)) => array(list.range(a..=b).cloned()),
        None => Value::Array(Vec::new()),
    })
}

/// `LINDEX key index` (negative from the tail): the value, or nil out of range.
fn lindex(st: &State, args: &[Bytes]) -> R<Value> {
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
