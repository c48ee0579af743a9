//! Reading Redis replies: fred's [`Value`]s, and the RESP frames of the replies read without
//! them ([`Reply`]). Sends no command.

use bytes::Bytes;
use fred::types::Value;

/// The bytes of a reply value, when it has some.
pub(crate) fn value_bytes(v: Value) -> Option<Bytes> {
    match v {
        Value::Bytes(b) => Some(b),
        Value::String(s) => Some(s.into_inner()),
        Value::Integer(i) => Some(Bytes::from(i.to_string())),
        Value::Double(f) => Some(Bytes::from(f.to_string())),
        _ => None,
    }
}

/// A reply as fred received it: the RESP frame, before it is read into [`Value`]s. The hot
/// reads (a list claim's entries, a stream read's) are read from it in one pass, without the
/// `Value` tree and its UTF-8 checks of every entry.
pub(crate) use fred::types::Resp3Frame as Reply;

/// The bytes of a reply frame, when it has some (as [`value_bytes`]).
pub(crate) fn frame_bytes(f: Reply) -> Option<Bytes> {
    match f {
        Reply::BlobString { data, .. }
        | Reply::SimpleString { data, .. }
        | Reply::VerbatimString { data, .. }
        | Reply::BigNumber { data, .. } => Some(data),
        Reply::Number { data, .. } => Some(Bytes::from(data.to_string())),
        Reply::Double { data, .. } => Some(Bytes::from(data.to_string())),
        _ => None,
    }
}

/// A reply frame's integer (0 for anything else, or a negative).
pub(crate) fn frame_u64(f: &Reply) -> u64 {
    match f {
        Reply::Number { data, .. } => u64::try_from(*data).unwrap_or(0),
        _ => 0,
    }
}

/// The items of an array reply (a set's or a push's too); `None` for anything else.
pub(crate) fn frame_items(f: Reply) -> Option<Vec<Reply>> {
    match f {
        Reply::Array { data, .. } | Reply::Push { data, .. } => Some(data),
        Reply::Set { data, .. } => Some(data.into_iter().collect()),
        _ => None,
    }
}

/// The frame fred would send for `v`: how a reply read as a [`Value`] (the in-memory model's,
/// a test's) is read by a parser of frames.
pub(crate) fn value_frame(v: Value) -> Reply {
    match v {
        Value::Array(items) => Reply::Array {
            data: items.into_iter().map(value_frame).collect(),
            attributes: None,
        },
        Value::Map(map) => Reply::Map {
            data: map
                .inner()
                .into_iter()
                .map(|(k, v)| (value_frame(Value::from(k)), value_frame(v)))
                .collect(),
            attributes: None,
        },
        Value::Integer(data) => Reply::Number {
            data,
            attributes: None,
        },
        Value::Double(data) => Reply::Double {
            data,
            attributes: None,
        },
        Value::Boolean(data) => Reply::Boolean {
            data,
            attributes: None,
        },
        Value::Null | Value::Queued => Reply::Null,
        other => value_bytes(other).map_or(Reply::Null, |data| Reply::BlobString {
            data,
            attributes: None,
        }),
    }
}

/// The text of an error reply (`SimpleError`, `BlobError`), if `f` is one.
pub(crate) fn frame_error(f: &Reply) -> Option<String> {
    match f {
        Reply::SimpleError { data, .. } => Some(data.to_string()),
        Reply::BlobError { data, .. } => Some(String::from_utf8_lossy(data).into_owned()),
        _ => None,
    }
}
