//! A flow's plan: what `flow/start.lua` stores in the record (field `plan`) so that a reader can
//! publish the flow's children without its publisher (`repair.rs`): the flow as
//! `publish_flow` got it (its parent with the enclosing flow's headers; each child, a nested flow
//! whole) and the publish policy the publisher's routes gave each of its destinations. JSON,
//! payloads in base64, a version number first. Sends no command.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use ruststream_core::flow::{ChildFailure, OutChild, OutFlow};
use ruststream_core::{Due, Durability, Error, Headers, OutMessage, Result};
use serde::{Deserialize, Serialize};

use crate::policy::{PublishPolicy, Routes};

/// The plan format's version: a reader refuses (and reports) any other.
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Plan {
    v: u32,
    flow: Flow,
    /// Each destination of the flow that the publisher had a route for.
    routes: BTreeMap<String, PublishPolicy>,
}

#[derive(Serialize, Deserialize)]
struct Flow {
    parent: Message,
    fail_parent: bool,
    max_age: Duration,
    children: Vec<Child>,
}

#[derive(Serialize, Deserialize)]
enum Child {
    Message(Message),
    Flow(Flow),
}

#[derive(Serialize, Deserialize)]
struct Message {
    destination: String,
    payload: String,
    headers: Headers,
    id: Option<String>,
    /// When it is due: a delay is made a time on the publisher's clock, so a repair does not
    /// delay it again.
    due: Option<SystemTime>,
    partition_key: Option<String>,
    unique_for: Option<Duration>,
    priority: u8,
    durable: Option<Durability>,
}

/// The plan of `flow`, published with `routes`.
pub(crate) fn encode(flow: &OutFlow, routes: &Routes) -> Result<Bytes> {
    let mut used = BTreeMap::new();
    let flow = flow_of(flow, routes, &mut used);
    let plan = Plan {
        v: VERSION,
        flow,
        routes: used,
    };
    serde_json::to_vec(&plan)
        .map(Bytes::from)
        .map_err(|e| Error::Encode(format!("flow: its plan cannot be encoded: {e}")))
}

/// The flow a plan holds, and routes holding its policies.
///
/// # Errors
/// [`Error::Decode`] when `plan` is not a plan of this version.
pub(crate) fn decode(plan: &[u8]) -> Result<(OutFlow, Routes)> {
    let plan: Plan = serde_json::from_slice(plan).map_err(|e| Error::Decode(e.to_string()))?;
    if plan.v != VERSION {
        return Err(Error::Decode(format!(
            "plan version {}, this reader knows {VERSION}",
            plan.v
        )));
    }
    let routes = Routes::default();
    for (destination, policy) in plan.routes {
        routes.set(destination, policy);
    }
    Ok((out_flow(plan.flow)?, routes))
}

fn flow_of(flow: &OutFlow, routes: &Routes, used: &mut BTreeMap<String, PublishPolicy>) -> Flow {
    Flow {
        parent: message_of(&flow.parent, routes, used),
        fail_parent: flow.on_child_failure == ChildFailure::FailParent,
        max_age: flow.max_age,
        children: flow
            .children
            .iter()
            .filter_map(|c| match c {
                OutChild::Message(m) => Some(Child::Message(message_of(m, routes, used))),
                OutChild::Flow(f) => Some(Child::Flow(flow_of(f, routes, used))),
                _ => None,
            })
            .collect(),
    }
}

fn message_of(
    m: &OutMessage,
    routes: &Routes,
    used: &mut BTreeMap<String, PublishPolicy>,
) -> Message {
    if let Some(policy) = routes.get(&m.destination) {
        used.insert(m.destination.clone(), policy);
    }
    Message {
        destination: m.destination.clone(),
        payload: STANDARD.encode(&m.payload),
        headers: m.headers.clone(),
        id: m.id.clone(),
        due: m.due.map(|due| match due {
            Due::In(d) => SystemTime::now() + d,
            Due::At(t) => t,
        }),
        partition_key: m.partition_key.clone(),
        unique_for: m.unique_for,
        priority: m.priority,
        durable: m.durable,
    }
}

fn out_flow(flow: Flow) -> Result<OutFlow> {
    let children = flow
        .children
        .into_iter()
        .map(|c| match c {
            Child::Message(m) => out_message(m).map(OutChild::Message),
            Child::Flow(f) => out_flow(f).map(|f| OutChild::Flow(Box::new(f))),
        })
        .collect::<Result<_>>()?;
    let policy = if flow.fail_parent {
        ChildFailure::FailParent
    } else {
        ChildFailure::Continue
    };
    Ok(OutFlow::new(
        out_message(flow.parent)?,
        children,
        policy,
        flow.max_age,
    ))
}

fn out_message(m: Message) -> Result<OutMessage> {
    let payload = STANDARD
        .decode(&m.payload)
        .map_err(|e| Error::Decode(format!("a payload of the plan: {e}")))?;
    let mut out = OutMessage::new(m.destination, payload.into());
    out.headers = m.headers;
    out.id = m.id;
    out.due = m.due.map(Due::At);
    out.partition_key = m.partition_key;
    out.unique_for = m.unique_for;
    out.priority = m.priority;
    out.durable = m.durable;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ListPublish;

    #[test]
    fn a_plan_gives_back_its_flow_and_routes() {
        let mut child = OutMessage::new("parts", Bytes::from_static(b"\x00\xff binary"));
        child.id = Some("f.0".into());
        child.due = Some(Due::In(Duration::from_secs(60)));
        child.priority = 2;
        child.headers.insert("h".into(), "v".into());
        let mut inner = OutMessage::new("sub", Bytes::from_static(b"{}"));
        inner.id = Some("f.1".into());
        let nested = OutFlow::new(
            inner,
            vec![OutChild::Message(OutMessage::new("parts", Bytes::new()))],
            ChildFailure::Continue,
            Duration::from_secs(5),
        );
        let flow = OutFlow::new(
            OutMessage::new("reports", Bytes::from_static(b"p")),
            vec![OutChild::Message(child), OutChild::Flow(Box::new(nested))],
            ChildFailure::FailParent,
            Duration::from_secs(60),
        );
        let routes = Routes::default();
        let levels = PublishPolicy::List(ListPublish::new().priorities(3));
        routes.set("parts".into(), levels);
        routes.set("unused".into(), PublishPolicy::default());
        let before = SystemTime::now();
        let (back, back_routes) = decode(&encode(&flow, &routes).unwrap()).unwrap();
        assert_eq!(back_routes.get("parts"), Some(levels));
        assert_eq!(back_routes.get("unused"), None);
        assert_eq!(back.parent.payload, flow.parent.payload);
        assert_eq!(back.on_child_failure, ChildFailure::FailParent);
        let OutChild::Message(m) = &back.children[0] else {
            panic!("a message")
        };
        assert_eq!(&m.payload[..], b"\x00\xff binary");
        assert_eq!((m.priority, m.id.as_deref()), (2, Some("f.0")));
        assert_eq!(m.headers.get("h").map(String::as_str), Some("v"));
        let Some(Due::At(at)) = m.due else {
            panic!("a time")
        };
        assert!(at >= before + Duration::from_secs(60));
        let OutChild::Flow(sub) = &back.children[1] else {
            panic!("a flow")
        };
        assert_eq!(sub.on_child_failure, ChildFailure::Continue);
        assert_eq!(sub.max_age, Duration::from_secs(5));
        assert_eq!(sub.children.len(), 1);
        assert!(decode(b"{\"v\":2}").is_err());
        assert!(decode(b"not json").is_err());
    }
}
