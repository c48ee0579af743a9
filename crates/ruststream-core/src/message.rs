//! Message types: how a Rust value becomes bytes on the wire, where it is published, and its schema.
//!
//! [`MessageType`] is implemented by `#[derive(Outgoing)]` or `outgoing!(T, "name")` for serde types
//! (JSON on the wire), and here for `Vec<u8>` and [`Bytes`] (raw payloads, no codec).

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{ConfigError, Error};

/// String headers carried with a message: the event context of the message. Set at publish with
/// `.header(k, v)`, read in a handler with [`Context::header`](crate::Context::header).
pub type Headers = BTreeMap<String, String>;

/// A type that can travel as a message: encoded, decoded, named and described.
///
/// Do not implement it by hand for serde types: use `#[derive(Outgoing)]` (which also derives the
/// JSON schema) or `outgoing!(T)` / `outgoing!(T, "name")` (for a type that derives `JsonSchema`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a RustStream message type",
    label = "not a message type",
    note = "add `#[derive(Outgoing)]` to `{Self}`, or `outgoing!({Self});` next to a type that derives `Serialize`, `Deserialize` and `JsonSchema`"
)]
pub trait MessageType: Sized + Send + Sync + 'static {
    /// The name template this type is published to by default (`"orders.{tenant}"` reads the
    /// `tenant` field), or `None` when the mount site or the publisher names the destination.
    const NAME: Option<&'static str> = None;

    /// The destination of this value: [`NAME`](Self::NAME) with its `{field}` placeholders filled.
    fn destination(&self) -> Result<Option<Cow<'static, str>>, Error>;

    /// The JSON schema of the payload, for the AsyncAPI document.
    fn schema() -> schemars::Schema;

    /// The payload's content type (`application/json` for serde types).
    fn content_type() -> &'static str {
        "application/json"
    }

    /// Encodes the value into the bytes that go on the wire.
    fn encode(&self) -> Result<Bytes, Error>;

    /// Decodes a payload into a value.
    fn decode(payload: &[u8]) -> Result<Self, Error>;
}

/// JSON encoding used by `#[derive(Outgoing)]` and `outgoing!`.
pub fn json_encode<T: Serialize>(value: &T) -> Result<Bytes, Error> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| Error::Encode(e.to_string()))
}

/// JSON decoding used by `#[derive(Outgoing)]` and `outgoing!`.
pub fn json_decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(payload).map_err(|e| Error::Decode(e.to_string()))
}

/// The JSON schema of `T` as AsyncAPI 3.0 payloads expect it: JSON Schema draft-07 (the dialect
/// the AsyncAPI Schema Object extends), with shared definitions under `definitions`.
pub fn schema_for<T: schemars::JsonSchema>() -> schemars::Schema {
    schemars::generate::SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<T>()
}

/// Fills the `{field}` placeholders of a name template from the value's top-level fields.
///
/// A template without braces is returned as is, without serializing the value.
pub fn fill_template<T: Serialize>(
    template: &'static str,
    value: &T,
) -> Result<Cow<'static, str>, Error> {
    if !template.contains('{') {
        return Ok(Cow::Borrowed(template));
    }
    let fields = serde_json::to_value(value).map_err(|e| Error::Encode(e.to_string()))?;
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or_else(|| {
            ConfigError::new(
                "#[outgoing(name)]",
                "the name template has an unclosed `{`",
                "close each `{field` with `}`",
            )
            .on(template)
        })?;
        let field = &after[..close];
        match fields.get(field) {
            Some(serde_json::Value::String(s)) => out.push_str(s),
            Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                out.push_str(&v.to_string());
            }
            _ => {
                return Err(Error::Encode(format!(
                    "name template `{template}` reads field `{field}`, which the value does not have as a string, number or bool"
                )));
            }
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(Cow::Owned(out))
}

fn binary_schema() -> schemars::Schema {
    schemars::json_schema!({ "type": "string", "format": "binary" })
}

impl MessageType for Vec<u8> {
    fn destination(&self) -> Result<Option<Cow<'static, str>>, Error> {
        Ok(None)
    }
    fn schema() -> schemars::Schema {
        binary_schema()
    }
    fn content_type() -> &'static str {
        "application/octet-stream"
    }
    fn encode(&self) -> Result<Bytes, Error> {
        Ok(Bytes::copy_from_slice(self))
    }
    fn decode(payload: &[u8]) -> Result<Self, Error> {
        Ok(payload.to_vec())
    }
}

impl MessageType for Bytes {
    fn destination(&self) -> Result<Option<Cow<'static, str>>, Error> {
        Ok(None)
    }
    fn schema() -> schemars::Schema {
        binary_schema()
    }
    fn content_type() -> &'static str {
        "application/octet-stream"
    }
    fn encode(&self) -> Result<Bytes, Error> {
        Ok(self.clone())
    }
    fn decode(payload: &[u8]) -> Result<Self, Error> {
        Ok(Bytes::copy_from_slice(payload))
    }
}

/// Implements [`MessageType`] for a serde type that also derives `schemars::JsonSchema`, with JSON
/// on the wire: `outgoing!(Upload, "uploads")` names its default destination, `outgoing!(Job)`
/// leaves it to the mount site or the publisher.
#[macro_export]
macro_rules! outgoing {
    ($ty:ty) => {
        $crate::outgoing!(@impl $ty, ::core::option::Option::None);
    };
    ($ty:ty, $name:expr) => {
        $crate::outgoing!(@impl $ty, ::core::option::Option::Some($name));
    };
    (@impl $ty:ty, $name:expr) => {
        impl $crate::MessageType for $ty {
            const NAME: ::core::option::Option<&'static str> = $name;
            fn destination(
                &self,
            ) -> ::core::result::Result<
                ::core::option::Option<::std::borrow::Cow<'static, str>>,
                $crate::Error,
            > {
                match <Self as $crate::MessageType>::NAME {
                    ::core::option::Option::Some(t) => {
                        $crate::message::fill_template(t, self).map(::core::option::Option::Some)
                    }
                    ::core::option::Option::None => ::core::result::Result::Ok(::core::option::Option::None),
                }
            }
            fn schema() -> $crate::__private::schemars::Schema {
                $crate::message::schema_for::<$ty>()
            }
            fn encode(&self) -> ::core::result::Result<$crate::__private::Bytes, $crate::Error> {
                $crate::message::json_encode(self)
            }
            fn decode(payload: &[u8]) -> ::core::result::Result<Self, $crate::Error> {
                $crate::message::json_decode(payload)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Order {
        tenant: String,
        n: u32,
    }

    #[test]
    fn template_reads_fields() {
        let o = Order {
            tenant: "acme".into(),
            n: 7,
        };
        assert_eq!(
            fill_template("orders.{tenant}.{n}", &o).unwrap(),
            "orders.acme.7"
        );
        assert_eq!(fill_template("plain", &o).unwrap(), "plain");
        assert!(fill_template("orders.{missing}", &o).is_err());
        assert!(fill_template("orders.{tenant", &o).is_err());
    }
}
