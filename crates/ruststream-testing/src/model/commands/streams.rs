//! Stream commands, but for consumer groups (see `groups`) and trimming (see `trims`).

use super::trims::Trim;
use super::*;

/// Runs the command `name` (upper case) of this module.
pub(super) fn execute(st: &mut State, now: u64, name: &str, args: &[Bytes]) -> R<Value> {
    let n = args.len();
    let need = |k: usize| if n < k { Err(wrong_args(name)) } else { Ok(()) };
    match name {
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
        "XTRIM" => super::trims::xtrim(st, args),
        "XREAD" => xread(st, args),
        "XACK" => {
            need(3)?;
            let mut acked = 0;
            for a in &args[2..] {
                acked += usize::from(st.db.xack(&args[0], &args[1], stream_id_arg(a, 0)?)?);
            }
            Ok(int(acked))
        }
        _ => Err(unknown(name)),
    }
}

/// `XREAD [COUNT n] [BLOCK ms] STREAMS key.. id..`: the entries after each id, without waiting
/// (the blocking wait is the server's `ready`); `$` is the stream's last id, so nothing.
fn xread(st: &State, args: &[Bytes]) -> R<Value> {
    let StreamsRead {
        count, keys, ids, ..
    } = parse_read(args, "xread", "'$'")?;
    check_slot(st, &keys.iter().map(|k| &k[..]).collect::<Vec<_>>())?;
    let mut out = Vec::new();
    for (key, id) in keys.iter().zip(ids) {
        let Some(s) = st.db.stream(key)? else {
            continue;
        };
        let after = match &id[..] {
            b"$" => StreamId::MAX,
            other => stream_id_arg(other, 0)?,
        };
        let Some(from) = after.next() else {
            continue;
        };
        let items: Vec<Value> = s
            .entries
            .range(from..)
            .take(count)
            .map(|(id, f)| entry_value(*id, f))
            .collect();
        if !items.is_empty() {
            out.push(Value::Array(vec![bulk(key.clone()), Value::Array(items)]));
        }
    }
    Ok(if out.is_empty() {
        Value::Null
    } else {
        Value::Array(out)
    })
}

fn xadd(st: &mut State, now: u64, args: &[Bytes]) -> R<Value> {
    if args.len() < 4 {
        return Err(wrong_args("XADD"));
    }
    let key = &args[0];
    let mut i = 1;
    let mut nomkstream = false;
    let mut trim: Option<Trim> = None;
    loop {
        match upper(args.get(i).ok_or_else(syntax)?).as_str() {
            "NOMKSTREAM" => {
                nomkstream = true;
                i += 1;
            }
            "MAXLEN" | "MINID" => trim = Some(Trim::parse(args, &mut i)?),
            _ => break,
        }
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
    if let Some(trim) = trim
        && let Some(s) = st.db.stream_mut(key)?
    {
        trim.apply(s);
    }
    st.journal.push(Change::Stream {
        key: key.clone(),
        fields: pairs,
    });
    Ok(bulk(id.bytes()))
}
