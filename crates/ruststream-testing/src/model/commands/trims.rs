//! Trimming a stream: `XTRIM`, and the same options of `XADD` (`MAXLEN`/`MINID`, `=` or `~`,
//! `LIMIT`).
//!
//! The model trims `~` exactly as `=` does: Redis's approximate trim drops whole macro nodes
//! only, so it keeps at least what the exact trim keeps and up to a node more. The model does the
//! most Redis may do, so a test that finds an entry still there after a trim in the model finds
//! it in Redis too.

use super::data::Stream;
use super::*;

/// A trim's threshold: keep the newest `n` entries, or the entries at or above an id.
#[derive(Debug, Clone, Copy)]
pub(super) enum Threshold {
    MaxLen(usize),
    MinId(StreamId),
}

/// A parsed trim: its threshold and `LIMIT` (most entries dropped; unbounded without one).
#[derive(Debug, Clone, Copy)]
pub(super) struct Trim {
    threshold: Threshold,
    limit: usize,
}

impl Trim {
    /// Parses `MAXLEN|MINID [=|~] threshold [LIMIT n]` at `args[*i]` (the strategy's name),
    /// leaving `*i` after it.
    pub(super) fn parse(args: &[Bytes], i: &mut usize) -> R<Trim> {
        let strategy = upper(args.get(*i).ok_or_else(syntax)?);
        *i += 1;
        let mut approx = false;
        match args.get(*i).map(|a| &a[..]) {
            Some(b"~") => {
                approx = true;
                *i += 1;
            }
            Some(b"=") => *i += 1,
            _ => {}
        }
        let v = args.get(*i).ok_or_else(syntax)?;
        let threshold = match strategy.as_str() {
            "MAXLEN" => Threshold::MaxLen(parse_usize(v)?),
            "MINID" => Threshold::MinId(stream_id_arg(v, 0)?),
            _ => return Err(syntax()),
        };
        *i += 1;
        let mut limit = usize::MAX;
        if args.get(*i).is_some_and(|a| upper(a) == "LIMIT") {
            if !approx {
                return Err(err(
                    "ERR syntax error, LIMIT cannot be used without the special ~ option",
                ));
            }
            limit = parse_usize(args.get(*i + 1).ok_or_else(syntax)?)?;
            if limit == 0 {
                limit = usize::MAX;
            }
            *i += 2;
        }
        Ok(Trim { threshold, limit })
    }

    /// Drops the oldest entries the trim names; returns how many.
    pub(super) fn apply(self, s: &mut Stream) -> usize {
        let mut dropped = 0;
        while dropped < self.limit {
            let Some((&first, _)) = s.entries.first_key_value() else {
                break;
            };
            let drop = match self.threshold {
                Threshold::MaxLen(n) => s.entries.len() > n,
                Threshold::MinId(min) => first < min,
            };
            if !drop {
                break;
            }
            s.entries.remove(&first);
            dropped += 1;
        }
        dropped
    }
}

/// `XTRIM key MAXLEN|MINID [=|~] threshold [LIMIT n]`: how many entries it dropped.
pub(super) fn xtrim(st: &mut State, args: &[Bytes]) -> R<Value> {
    if args.len() < 3 {
        return Err(wrong_args("XTRIM"));
    }
    let mut i = 1;
    let trim = Trim::parse(args, &mut i)?;
    if i != args.len() {
        return Err(syntax());
    }
    Ok(int(st
        .db
        .stream_mut(&args[0])?
        .map_or(0, |s| trim.apply(s))))
}
