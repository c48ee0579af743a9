//! A flow's record read back: its key ([`record_key`]) and its state ([`read`], one `HGETALL`),
//! for `ctx.children()` and the operator's `flow show`.

use std::collections::HashMap;

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::Result;
use ruststream_core::flow::{ChildFailure, ChildOutcome, FlowChild, FlowState};

use crate::error::core;
use crate::keys::KeySpace;

/// The record of flow `id` whose parent goes to the full key `base` (the parent's queue, or its
/// partition): `<base>.flow:<id>`, in `base`'s slot.
pub(crate) fn record_key(keys: &KeySpace, base: &str, id: &str) -> String {
    keys.derived(base, &format!(".flow:{id}"))
}

/// The state a record's fields describe.
fn parse(fields: &HashMap<String, Bytes>) -> FlowState {
    let text = |name: &str| {
        fields
            .get(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    let policy = match text("policy").as_str() {
        "continue" => ChildFailure::Continue,
        _ => ChildFailure::FailParent,
    };
    let ids = text("ids");
    let children = ids
        .split('\n')
        .filter(|id| !id.is_empty())
        .map(|id| {
            let value = fields.get(&format!("r:{id}")).cloned();
            let outcome = match text(&format!("c:{id}")).as_str() {
                "a" => ChildOutcome::Acked,
                "x" => ChildOutcome::Dead {
                    reason: value
                        .as_ref()
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default(),
                },
                "d" => ChildOutcome::Dropped,
                _ => ChildOutcome::Pending,
            };
            let result = match outcome {
                ChildOutcome::Acked => value,
                _ => None,
            };
            FlowChild::new(id.to_owned(), outcome, result)
        })
        .collect();
    FlowState::new(text("id"), text("state"), policy, children)
}

/// The state of the flow whose record is `record` (a full key); `None` when it is gone.
pub(crate) async fn read(client: &Client, record: &str) -> Result<Option<FlowState>> {
    let fields: HashMap<String, Bytes> = client.hgetall(record).await.map_err(core)?;
    if fields.is_empty() {
        return Ok(None);
    }
    Ok(Some(parse(&fields)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_as_its_children_in_order() {
        let fields: HashMap<String, Bytes> = [
            ("id", "f"),
            ("state", "pending"),
            ("policy", "continue"),
            ("ids", "f.0\nf.1\nf.2"),
            ("c:f.0", "a"),
            ("r:f.0", "7"),
            ("c:f.1", "x"),
            ("r:f.1", "max-attempts"),
            ("c:f.2", "p"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Bytes::from(v)))
        .collect();
        let state = parse(&fields);
        assert_eq!(state.on_child_failure, ChildFailure::Continue);
        assert_eq!(
            state.children,
            [
                FlowChild::new("f.0".into(), ChildOutcome::Acked, Some("7".into())),
                FlowChild::new(
                    "f.1".into(),
                    ChildOutcome::Dead {
                        reason: "max-attempts".into()
                    },
                    None
                ),
                FlowChild::new("f.2".into(), ChildOutcome::Pending, None),
            ]
        );
        assert_eq!(
            record_key(&KeySpace::new(String::new(), true), "q", "f"),
            "{q}.flow:f"
        );
    }
}
