//! Sorted-set commands.

use super::*;

/// Runs the command `name` (upper case) of this module.
pub(super) fn execute(st: &mut State, name: &str, args: &[Bytes]) -> R<Value> {
    let n = args.len();
    let need = |k: usize| if n < k { Err(wrong_args(name)) } else { Ok(()) };
    match name {
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
        _ => Err(unknown(name)),
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
