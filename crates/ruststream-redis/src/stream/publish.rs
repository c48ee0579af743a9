//! Publishing to a stream: `XADD key [MAXLEN ~ n | MINID ~ id] * payload .. rs.id ..
//! [rs.attempt ..] <headers>`, a batch as one fred pipeline. [`fields`] is the one place an entry's fields are built, for publishes and
//! for retries alike.

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::{Headers, Result};

use super::entries::{ATTEMPT_FIELD, ID_FIELD, PAYLOAD_FIELD};
use crate::error::core;
use crate::policy::StreamPublish;

/// The fields of an entry: `payload`, `rs.id`, `rs.attempt` when past the first delivery, then
/// the headers, except those named like a reserved field.
pub(crate) fn fields(id: &str, attempt: u32, headers: &Headers, payload: Bytes) -> Vec<Value> {
    let mut f = Vec::with_capacity(6 + 2 * headers.len());
    f.extend([
        Value::from_static_str(PAYLOAD_FIELD),
        Value::Bytes(payload),
        Value::from_static_str(ID_FIELD),
        Value::from(id),
    ]);
    if attempt > 1 {
        f.extend([
            Value::from_static_str(ATTEMPT_FIELD),
            Value::from(attempt.to_string()),
        ]);
    }
    for (k, v) in headers {
        if k == PAYLOAD_FIELD || k == ID_FIELD || k == ATTEMPT_FIELD {
            continue;
        }
        f.push(Value::from(k.as_str()));
        f.push(Value::from(v.as_str()));
    }
    f
}

/// `XADD`s each entry's fields to the full key `key`, in one pipeline, trimmed as `policy` says;
/// a `minid` age is counted back from `now_ms`, the publisher's clock (a plain `XADD` has no
/// server time to read; a script per batch would put Lua on the publish path), which is the
/// model's clock under `TestApp`.
pub(crate) async fn add(
    client: &Client,
    key: &str,
    policy: StreamPublish,
    now_ms: u64,
    entries: Vec<Vec<Value>>,
) -> Result<()> {
    // One pipeline rather than a future per entry: a future per entry spends a third of the
    // fill's profile in task switches (docs/decisions.md, "A stream publish batch is one fred
    // pipeline").
    let pipeline = client.pipeline();
    for args in xadds(key, policy, now_ms, entries) {
        let () = pipeline
            .custom(fred::cmd!("XADD"), args)
            .await
            .map_err(core)?;
    }
    let _: Vec<Value> = pipeline.all().await.map_err(core)?;
    Ok(())
}

/// The arguments of each entry's `XADD` to the full key `key`, trimmed as `policy` says.
pub(crate) fn xadds(
    key: &str,
    policy: StreamPublish,
    now_ms: u64,
    entries: Vec<Vec<Value>>,
) -> impl Iterator<Item = Vec<Value>> {
    let trim = policy.xadd_args(now_ms);
    let key = Value::from(key);
    entries.into_iter().map(move |fields| {
        let mut args = Vec::with_capacity(fields.len() + 5);
        args.push(key.clone());
        if let Some(trim) = &trim {
            args.extend(trim.iter().map(|a| Value::from(a.as_str())));
        }
        args.push(Value::from_static_str("*"));
        args.extend(fields);
        args
    })
}
