//! The AsyncAPI 3.0 document of an application: one channel per subscription and per reply
//! destination, one `receive` operation per subscriber (with its reply), payload schemas from
//! [`MessageType`](crate::MessageType).
//!
//! Payload schemas come from `schemars` in draft-07 (see
//! [`schema_for`](crate::message::schema_for)); their `definitions` are lifted into
//! `components/schemas` so every `$ref` resolves inside the document.
//!
//! Braces in an address are declared as channel parameters: a hash tag (`{thumbnails}`) as a
//! parameter whose only value is itself, a name template's `{field}` as read from the payload.

use serde_json::{Map, Value, json};

use crate::{AppInfo, ChannelDoc, MessageDoc, RustStream};

/// One subscriber as the document shows it.
#[derive(Debug, Clone)]
pub struct OperationDoc {
    /// The channel it reads.
    pub channel: ChannelDoc,
    /// What it reads.
    pub input: MessageDoc,
    /// Where it replies (`None` inside: the reply type's own name) and with what.
    pub reply: Option<(Option<String>, MessageDoc)>,
    /// The reply's transport when the broker knows it (see `Broker::reply_transport`).
    pub reply_transport: Option<&'static str>,
}

/// A periodic job as the document shows it: a `send` operation on its destination.
#[derive(Debug, Clone)]
pub(crate) struct SendDoc {
    /// The job's name.
    pub(crate) name: String,
    /// Its schedule, in words (`0 */5 * * * * (UTC)`).
    pub(crate) schedule: String,
    /// `.to(..)`, else `None`: the message type's own name.
    pub(crate) to: Option<String>,
    /// What it sends.
    pub(crate) message: MessageDoc,
    /// The destination's transport when the broker knows it.
    pub(crate) transport: Option<&'static str>,
}

/// Builds the AsyncAPI 3.0.0 document of an application, as mounted (before it starts; a running
/// app's document of what runs now is [`RunningApp::asyncapi`](crate::RunningApp::asyncapi)).
pub fn document(app: &RustStream) -> Value {
    let ops: Vec<OperationDoc> = app.mounted().flat_map(|b| b.docs()).collect();
    let sends: Vec<SendDoc> = app.mounted().flat_map(|b| b.sends()).collect();
    build_with(app_info(app), &ops, &sends)
}

fn app_info(app: &RustStream) -> &AppInfo {
    crate::App::info(app)
}

/// The document of `info` with the operations `ops`.
pub(crate) fn build(info: &AppInfo, ops: &[OperationDoc]) -> Value {
    build_with(info, ops, &[])
}

/// The document of `info` with the operations `ops` and the periodic jobs' `sends`.
fn build_with(info: &AppInfo, ops: &[OperationDoc], sends: &[SendDoc]) -> Value {
    let mut doc = Doc::default();
    let mut operations = Map::new();
    for op in ops {
        let ch = doc.channel(
            &op.channel.address,
            Address::Key,
            op.channel.transport,
            Some(&op.channel.bindings),
        );
        let msg = doc.message(&ch, &op.input);
        let mut operation = json!({
            "action": "receive",
            "channel": { "$ref": format!("#/channels/{ch}") },
            "messages": [ { "$ref": msg } ],
        });
        if let Some((to, out)) = &op.reply {
            let reply_ch = doc.outgoing(to.as_ref(), out, op.reply_transport, ops);
            let reply_msg = doc.message(&reply_ch, out);
            operation["reply"] = json!({
                "channel": { "$ref": format!("#/channels/{reply_ch}") },
                "messages": [ { "$ref": reply_msg } ],
            });
        }
        let mut name = sanitize(&format!("receive_{}", op.channel.address));
        while operations.contains_key(&name) {
            name.push('_');
        }
        operations.insert(name, operation);
    }
    for send in sends {
        let ch = doc.outgoing(send.to.as_ref(), &send.message, send.transport, ops);
        let msg = doc.message(&ch, &send.message);
        let mut name = sanitize(&format!("send_periodic_{}", send.name));
        while operations.contains_key(&name) {
            name.push('_');
        }
        operations.insert(
            name,
            json!({
                "action": "send",
                "channel": { "$ref": format!("#/channels/{ch}") },
                "messages": [ { "$ref": msg } ],
                "description": format!("periodic job `{}`: {}", send.name, send.schedule),
            }),
        );
    }
    let mut info_obj = json!({ "title": info.title, "version": info.version });
    if let Some(d) = &info.description {
        info_obj["description"] = json!(d);
    }
    json!({
        "asyncapi": "3.0.0",
        "info": info_obj,
        "defaultContentType": "application/json",
        "channels": doc.channels,
        "operations": operations,
        "components": { "messages": doc.messages, "schemas": doc.schemas },
    })
}

#[derive(Default)]
struct Doc {
    channels: Map<String, Value>,
    messages: Map<String, Value>,
    schemas: Map<String, Value>,
}

impl Doc {
    /// The id of the channel a message `out` is published to: `to` as written, else the type's
    /// name template; on `transport` when the broker knows it, else on the transport of a
    /// subscription reading that address, else a list.
    fn outgoing(
        &mut self,
        to: Option<&String>,
        out: &MessageDoc,
        transport: Option<&'static str>,
        ops: &[OperationDoc],
    ) -> String {
        let (address, kind) = match (to, out.name) {
            (Some(to), _) => (to.clone(), Address::Key),
            (None, Some(name)) => (name.to_owned(), Address::Template),
            (None, None) => (String::new(), Address::Key),
        };
        let transport = transport
            .or_else(|| {
                ops.iter()
                    .find(|o| o.channel.address == address)
                    .map(|o| o.channel.transport)
            })
            .unwrap_or("list");
        self.channel(&address, kind, transport, None)
    }

    /// The id of the channel for `address`, added when new.
    fn channel(
        &mut self,
        address: &str,
        kind: Address,
        transport: &str,
        bindings: Option<&Value>,
    ) -> String {
        let id = sanitize(address);
        let entry = self.channels.entry(id.clone()).or_insert_with(|| {
            let mut channel = json!({
                "address": address,
                "messages": {},
                "x-redis-transport": transport,
            });
            if let Some(params) = parameters(address, kind) {
                channel["parameters"] = params;
            }
            channel
        });
        if let Some(b) = bindings {
            entry["x-redis"] = b.clone();
        }
        id
    }

    /// Adds `msg` to a channel (and to components); returns the channel-local `$ref`.
    fn message(&mut self, channel: &str, msg: &MessageDoc) -> String {
        let name = sanitize(msg.short_name());
        if !self.messages.contains_key(&name) {
            let schema = self.lift((msg.schema)().to_value());
            self.messages.insert(
                name.clone(),
                json!({ "name": name, "contentType": msg.content_type, "payload": schema }),
            );
        }
        self.channels[channel]["messages"][&name] =
            json!({ "$ref": format!("#/components/messages/{name}") });
        format!("#/channels/{channel}/messages/{name}")
    }

    /// Moves `$defs` / `definitions` into `components/schemas` and rewrites the refs to them.
    fn lift(&mut self, mut schema: Value) -> Value {
        if let Some(obj) = schema.as_object_mut() {
            obj.remove("$schema");
            for key in ["$defs", "definitions"] {
                if let Some(Value::Object(defs)) = obj.remove(key) {
                    for (k, mut v) in defs {
                        rewrite_refs(&mut v);
                        self.schemas.insert(k, v);
                    }
                }
            }
        }
        rewrite_refs(&mut schema);
        schema
    }
}

/// Where a channel address comes from, which decides what its braces mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Address {
    /// A key as written (a source, `.to(..)`): braces are a Redis hash tag, part of the key.
    Key,
    /// A type's outgoing name: braces are placeholders for fields of the message.
    Template,
}

/// The channel's `parameters`: AsyncAPI reads every `{name}` in an address as a parameter, so
/// each one is declared. A hash tag is a parameter whose only value is itself (the address then
/// reads literally); a name template's placeholder is located in the payload.
fn parameters(address: &str, kind: Address) -> Option<Value> {
    let mut params = Map::new();
    let mut rest = address;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else { break };
        let name = &after[..close];
        let param = match kind {
            Address::Key => json!({
                "description": format!(
                    "Not a variable: `{{{name}}}` is a Redis hash tag, written literally in the key."
                ),
                "enum": [format!("{{{name}}}")],
                "default": format!("{{{name}}}"),
            }),
            Address::Template => json!({
                "description": format!("The message's `{name}` field."),
                "location": format!(
                    "$message.payload#/{}",
                    name.replace('~', "~0").replace('/', "~1")
                ),
            }),
        };
        params.insert(name.to_owned(), param);
        rest = &after[close + 1..];
    }
    (!params.is_empty()).then_some(Value::Object(params))
}

fn rewrite_refs(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                if k == "$ref"
                    && let Value::String(s) = child
                    && let Some(rest) = s
                        .strip_prefix("#/$defs/")
                        .or_else(|| s.strip_prefix("#/definitions/"))
                {
                    *s = format!("#/components/schemas/{rest}");
                } else {
                    rewrite_refs(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

/// AsyncAPI component keys must match `^[\w\d\.\-_]+$`.
fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() { "_".into() } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_become_parameters() {
        assert_eq!(parameters("cache.warmups", Address::Key), None);
        let tag = parameters("{thumbnails}.processing", Address::Key).unwrap();
        assert_eq!(tag["thumbnails"]["enum"], json!(["{thumbnails}"]));
        let template = parameters("orders.{tenant}", Address::Template).unwrap();
        assert_eq!(template["tenant"]["location"], "$message.payload#/tenant");
    }
}
