//! Reading the values of Redis replies. Sends no command.

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
