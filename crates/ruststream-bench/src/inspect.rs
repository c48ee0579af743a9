//! What the parent reads off Redis around a scenario: the commands run per message
//! (`INFO commandstats`), a published list read back, what a run left under its prefix, and the
//! deletion of its keys (`SCAN`, `TYPE`, `LLEN`/`ZCARD`/`HLEN`/`SCARD`/`XLEN`/`XPENDING`, `UNLINK`).

use std::collections::HashMap;
use std::fmt::Write as _;

use fred::prelude::*;
use ruststream::redis::frame::Frame;

use crate::common::Msg;
use crate::{BoxError, Ctx, GROUP, raw};

/// `(calls, usec)` per command from `INFO commandstats` (commands run inside scripts included).
pub(crate) async fn command_calls(raw: &Client) -> Result<HashMap<String, (u64, u64)>, BoxError> {
    let info: String = raw.info(Some(fred::types::InfoKind::CommandStats)).await?;
    Ok(info
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |f: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
            };
            Some((name.to_owned(), (field("calls")?, field("usec")?)))
        })
        .collect())
}

/// The commands Redis ran per message between two `command_calls` readings, most first, with
/// the server time of one call: `evalsha:0.0078x95us,lmove:1.0000x1us,...` (on a shared server,
/// other clients' commands count too).
pub(crate) fn calls_per_msg(
    before: &HashMap<String, (u64, u64)>,
    after: &HashMap<String, (u64, u64)>,
    n: u64,
) -> String {
    let mut v: Vec<(&String, u64, u64)> = after
        .iter()
        .map(|(k, (calls, usec))| {
            let (c0, u0) = before.get(k).copied().unwrap_or((0, 0));
            (k, calls.saturating_sub(c0), usec.saturating_sub(u0))
        })
        .filter(|(k, d, _)| *d > 0 && !matches!(k.as_str(), "info" | "scan" | "type"))
        .collect();
    v.sort_by_key(|x| std::cmp::Reverse(x.1));
    #[allow(clippy::cast_precision_loss)]
    let per = |d: u64, by: u64| d as f64 / by.max(1) as f64;
    v.iter()
        .take(8)
        .map(|(k, d, us)| format!("{k}:{:.4}x{:.1}us", per(*d, n), per(*us, *d)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads a published list back, counts ids missing and repeated, and deletes it.
pub(crate) async fn read_back(raw: &Client, key: &str, n: u64) -> Result<(u64, u64), BoxError> {
    let mut seen = vec![0u32; usize::try_from(n)?];
    let mut dup = 0;
    let mut start = 0i64;
    loop {
        let page: Vec<Value> = raw.lrange(key, start, start + 9_999).await?;
        if page.is_empty() {
            break;
        }
        start += i64::try_from(page.len())?;
        for v in page {
            let Some(b) = raw::bytes_of(v) else { continue };
            let frame = Frame::decode(b);
            let m: Msg = serde_json::from_slice(&frame.payload)?;
            match usize::try_from(m.id).ok().and_then(|i| seen.get_mut(i)) {
                Some(slot) => {
                    *slot += 1;
                    if *slot > 1 {
                        dup += 1;
                    }
                }
                None => dup += 1,
            }
        }
    }
    let _: i64 = raw.del(key).await?;
    Ok((seen.iter().filter(|&&c| c == 0).count() as u64, dup))
}

/// Keys under `prefix`, raw baseline keys excluded.
pub(crate) async fn keys(raw: &Client, prefix: &str) -> Result<Vec<String>, BoxError> {
    let mut out = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let reply: Value = raw
            .custom(
                raw::cmd("SCAN"),
                vec![
                    cursor.clone(),
                    "MATCH".into(),
                    format!("{prefix}*"),
                    "COUNT".into(),
                    "1000".into(),
                ],
            )
            .await?;
        let Value::Array(mut parts) = reply else {
            return Err("SCAN replied with no array".into());
        };
        let batch = parts.pop().map(Value::into_array).unwrap_or_default();
        out.extend(batch.into_iter().filter_map(|v| v.into_string()));
        cursor = parts
            .pop()
            .and_then(Value::into_string)
            .unwrap_or_else(|| "0".to_owned());
        if cursor == "0" {
            break;
        }
    }
    out.retain(|k| !k.starts_with(&format!("{prefix}raw:")));
    Ok(out)
}

/// What a run left under `prefix`: entries of lists, sets and hashes, and pending stream entries
/// (a stream keeps acknowledged entries; their count is reported as `stream_len`).
pub(crate) async fn leftovers(raw: &Client, prefix: &str) -> Result<String, BoxError> {
    let mut left = 0u64;
    let mut what = Vec::new();
    let mut stream_len = None;
    // The subscriptions' history is bookkeeping that expires on its own, not messages left.
    let kept = keys(raw, prefix).await?;
    for key in kept.into_iter().filter(|k| !k.contains(".history.")) {
        let kind: String = raw.custom(raw::cmd("TYPE"), vec![key.as_str()]).await?;
        let count: u64 = match kind.as_str() {
            "list" => raw.llen(&key).await?,
            "zset" => raw.zcard(&key).await?,
            "hash" => raw.hlen(&key).await?,
            "set" => raw.scard(&key).await?,
            "stream" => {
                stream_len = Some(raw.xlen::<u64, _>(&key).await?);
                let pending: Value = raw
                    .custom(raw::cmd("XPENDING"), vec![key.as_str(), GROUP])
                    .await?;
                match pending {
                    Value::Array(mut v) if !v.is_empty() => v.swap_remove(0).as_u64().unwrap_or(0),
                    _ => 0,
                }
            }
            _ => 1,
        };
        if count > 0 {
            left += count;
            what.push(format!("{}:{count}", key.trim_start_matches(prefix)));
        }
    }
    let mut s = left.to_string();
    if !what.is_empty() {
        let _ = write!(s, "({})", what.join(","));
    }
    if let Some(len) = stream_len {
        let _ = write!(s, " stream_len={len}");
    }
    Ok(s)
}

/// Deletes every key under `prefix` (baseline keys included), on every primary of a cluster;
/// one key per `UNLINK`, since a cluster refuses one across slots.
pub(crate) async fn cleanup(ctx: &Ctx<'_>, prefix: &str) -> Result<(), BoxError> {
    let clients: Vec<&Client> = match &ctx.nodes {
        Some(nodes) => nodes.primaries().map(|n| &n.client).collect(),
        None => vec![&ctx.raw],
    };
    for raw in clients {
        let mut all = keys(raw, prefix).await?;
        all.extend(keys(raw, &format!("{prefix}raw:")).await?);
        for key in all {
            let _: i64 = raw.custom(raw::cmd("UNLINK"), vec![key]).await?;
        }
    }
    Ok(())
}
