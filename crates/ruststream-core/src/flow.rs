//! Flows: a parent message that runs once all its children are done, with their results
//! (BullMQ's `FlowProducer`, Celery's chord).
//!
//! `publisher.flow(&parent).to("reports").child(&part, "parts").publish().await?` publishes the
//! children onto their own queues and keeps the parent back; when the last child is settled
//! (acked, dead-lettered or cancelled) the parent is enqueued, once, and its handler reads the
//! children's ids, outcomes and results with [`Context::children`](crate::Context::children).
//! A child that is itself a flow ([`FlowBuilder::child_flow`]) is done, for its parent, when
//! its own parent message is settled. When a child is dead-lettered, the flow's
//! [`ChildFailure`] decides: fail the parent (it is dead-lettered with the reason
//! `child-failed: <child id>`, without running) or continue without the child.
//!
//! The core keeps nothing itself: a broker stores each flow's record and is told of each
//! child's settlement by the dispatch loop (see [`PublishBackend::flow_child`](crate::PublishBackend::flow_child)), before the
//! child is settled, so a crash between the two runs the child again, and its second report
//! changes nothing.

use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::{ConfigError, Error, Headers, MessageType, OutMessage, Publisher, Result, Settlement};

/// The header naming the flow a child message belongs to (the broker's record of it); set by
/// the broker on every child it publishes.
pub const CHILD_HEADER: &str = "rs.flow";

/// The header naming, on a parent message, the record of its flow (what
/// [`Context::children`](crate::Context::children) reads).
pub const RECORD_HEADER: &str = "rs.flow.record";

/// The header a broker sets on a parent whose flow failed (a child was dead-lettered under
/// [`ChildFailure::FailParent`]): its value is the dead-letter reason, and the dispatch loop
/// dead-letters the parent with it instead of running its handler.
pub const FAILED_HEADER: &str = "rs.flow.failed";

/// How long a flow waits for its children by default before its record expires.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a flow does when one of its children is dead-lettered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ChildFailure {
    /// Dead-letter the parent at once, with the reason `child-failed: <child id>` (the default).
    #[default]
    FailParent,
    /// Run the parent once every child is done; the dead child shows as
    /// [`ChildOutcome::Dead`] in [`Context::children`](crate::Context::children).
    Continue,
}

impl ChildFailure {
    /// The policy's name as a broker stores it (`fail`, `continue`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailParent => "fail",
            Self::Continue => "continue",
        }
    }
}

/// How a child of a flow ended, so far.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChildOutcome {
    /// Not done yet (queued, running, or being retried).
    Pending,
    /// Handled and acknowledged.
    Acked,
    /// Dead-lettered, with the dead letter's reason.
    Dead {
        /// Why (`max-attempts`, `dropped`, `decode: …`, …).
        reason: String,
    },
    /// Gone without being handled or dead-lettered: cancelled, or retried on a source that
    /// cannot redeliver.
    Dropped,
}

/// One child of a flow, as its parent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlowChild {
    /// The child's message id.
    pub id: String,
    /// How it ended.
    pub outcome: ChildOutcome,
    /// The result its handler set (`ctx.set_result`, JSON), when it set one.
    pub result: Option<Bytes>,
}

impl FlowChild {
    /// A child record.
    pub fn new(id: String, outcome: ChildOutcome, result: Option<Bytes>) -> Self {
        Self {
            id,
            outcome,
            result,
        }
    }

    /// The child's result decoded as `R`, when it set one.
    ///
    /// # Errors
    /// [`Error::Decode`] when the result is not an `R`.
    pub fn result<R: DeserializeOwned>(&self) -> Result<Option<R>> {
        self.result
            .as_deref()
            .map(|json| serde_json::from_slice(json).map_err(|e| Error::Decode(e.to_string())))
            .transpose()
    }
}

/// A flow's record, as a broker keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlowState {
    /// The flow's id (its parent's message id).
    pub id: String,
    /// `pending` (children running), `enqueued` (the parent was put on its queue) or `failed`
    /// (the parent was put on its queue to be dead-lettered: a child failed).
    pub state: String,
    /// What a dead child does to the parent.
    pub on_child_failure: ChildFailure,
    /// Each child, in the order they were added.
    pub children: Vec<FlowChild>,
}

impl FlowState {
    /// A flow's state.
    pub fn new(
        id: String,
        state: String,
        on_child_failure: ChildFailure,
        children: Vec<FlowChild>,
    ) -> Self {
        Self {
            id,
            state,
            on_child_failure,
            children,
        }
    }
}

/// One encoded flow on its way to a broker.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OutFlow {
    /// The parent message; its id is the flow's id.
    pub parent: OutMessage,
    /// The children, in order.
    pub children: Vec<OutChild>,
    /// What a dead child does to the parent.
    pub on_child_failure: ChildFailure,
    /// How long the flow may wait for its children before its record expires.
    pub max_age: Duration,
}

impl OutFlow {
    /// A flow as a broker takes it (a broker rebuilding one it stored; publishers use
    /// [`FlowBuilder`]).
    pub fn new(
        parent: OutMessage,
        children: Vec<OutChild>,
        on_child_failure: ChildFailure,
        max_age: Duration,
    ) -> Self {
        Self {
            parent,
            children,
            on_child_failure,
            max_age,
        }
    }
}

/// One child of an [`OutFlow`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum OutChild {
    /// A message.
    Message(OutMessage),
    /// A flow of its own, done when its parent is settled.
    Flow(Box<OutFlow>),
}

impl OutChild {
    /// The child's message id (a flow's: its parent's).
    pub fn id(&self) -> Option<&str> {
        match self {
            Self::Message(m) => m.id.as_deref(),
            Self::Flow(f) => f.parent.id.as_deref(),
        }
    }
}

/// A flow being built; finish it with [`publish`](Self::publish).
#[must_use = "a flow does nothing until `.publish().await`"]
#[derive(Debug)]
pub struct FlowBuilder<'a> {
    publisher: &'a Publisher,
    flow: Result<OutFlow>,
}

/// A fresh id for a flow published without one.
fn new_flow_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "flow-{nanos:x}-{:x}-{:x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// `value` encoded as a message for `destination` (its type's when `None`).
fn encode<T: MessageType>(value: &T, destination: Option<String>) -> Result<OutMessage> {
    let destination = match destination {
        Some(d) => d,
        None => value
            .destination()?
            .ok_or(Error::NoDestination {
                type_name: std::any::type_name::<T>(),
            })?
            .into_owned(),
    };
    Ok(OutMessage::new(destination, value.encode()?))
}

impl<'a> FlowBuilder<'a> {
    pub(crate) fn new<T: MessageType>(publisher: &'a Publisher, parent: &T) -> Self {
        let flow = value_or_placeholder(parent).map(|parent| OutFlow {
            parent,
            children: Vec::new(),
            on_child_failure: ChildFailure::default(),
            max_age: DEFAULT_MAX_AGE,
        });
        Self { publisher, flow }
    }

    fn edit(mut self, f: impl FnOnce(&mut OutFlow) -> Result<()>) -> Self {
        if let Ok(flow) = &mut self.flow
            && let Err(e) = f(flow)
        {
            self.flow = Err(e);
        }
        self
    }

    /// The parent's destination; without it the parent type's outgoing name is used.
    pub fn to(self, destination: impl Into<String>) -> Self {
        let destination = destination.into();
        self.edit(|f| {
            f.parent.destination = destination;
            Ok(())
        })
    }

    /// The flow's id (the parent's message id). A publish of a flow whose id exists already
    /// publishes nothing new: it only finishes what an earlier publish of it left undone.
    pub fn id(self, id: impl Into<String>) -> Self {
        let id = id.into();
        self.edit(|f| {
            f.parent.id = Some(id);
            Ok(())
        })
    }

    /// Adds a header to the parent.
    pub fn header(self, name: impl Into<String>, value: impl Into<String>) -> Self {
        let (name, value) = (name.into(), value.into());
        self.edit(|f| {
            f.parent.headers.insert(name, value);
            Ok(())
        })
    }

    /// What a dead-lettered child does to the parent ([`ChildFailure::FailParent`] unless set).
    pub fn on_child_failure(self, policy: ChildFailure) -> Self {
        self.edit(|f| {
            f.on_child_failure = policy;
            Ok(())
        })
    }

    /// How long the flow may wait for its children ([`DEFAULT_MAX_AGE`], 7 days, unless set):
    /// past it, its record expires and the parent never runs.
    pub fn max_age(self, age: Duration) -> Self {
        self.edit(|f| {
            f.max_age = age;
            Ok(())
        })
    }

    /// Adds a child: `message` published to `destination`, with an id of its own
    /// (`<flow id>.<n>`).
    pub fn child<T: MessageType>(self, message: &T, destination: impl Into<String>) -> Self {
        let m = encode(message, Some(destination.into()));
        self.edit(|f| {
            f.children.push(OutChild::Message(m?));
            Ok(())
        })
    }

    /// Adds a child already encoded, with whatever a publish can carry (priority, delay,
    /// partition key, headers, its own id).
    pub fn child_message(self, message: OutMessage) -> Self {
        self.edit(|f| {
            f.children.push(OutChild::Message(message));
            Ok(())
        })
    }

    /// Adds a child that is a flow of its own: it is done, for this flow, when its parent is.
    pub fn child_flow(self, flow: FlowBuilder<'_>) -> Self {
        let sub = flow.flow;
        self.edit(|f| {
            f.children.push(OutChild::Flow(Box::new(sub?)));
            Ok(())
        })
    }

    /// The flow as it goes to the broker: ids given to the flow and every child without one.
    ///
    /// # Errors
    /// What encoding a message failed with; a flow without children, or with an id holding a
    /// newline, is refused.
    pub fn build(self) -> Result<OutFlow> {
        let mut flow = self.flow?;
        fill_ids(&mut flow)?;
        Ok(flow)
    }

    /// Publishes the flow: its record first, then every child; returns the flow's id. Sent
    /// again with the same [`id`](Self::id) (after a lost reply, a crash), it finishes what
    /// the first left undone and duplicates nothing.
    ///
    /// # Errors
    /// A configuration error for a malformed flow, or the broker's.
    pub async fn publish(self) -> Result<String> {
        let publisher = self.publisher;
        let flow = self.build()?;
        let id = flow.parent.id.clone().unwrap_or_default();
        publisher.backend().publish_flow(flow).await?;
        Ok(id)
    }
}

/// The parent's message (its destination its type's, if any, else empty until `.to(..)`).
fn value_or_placeholder<T: MessageType>(value: &T) -> Result<OutMessage> {
    let destination = value.destination()?.map(|d| d.into_owned());
    Ok(OutMessage::new(
        destination.unwrap_or_default(),
        value.encode()?,
    ))
}

/// Gives `flow` and its children ids, and checks them.
fn fill_ids(flow: &mut OutFlow) -> Result<()> {
    if flow.children.is_empty() {
        return Err(ConfigError::new(
            ".child(..)",
            "a flow needs at least one child",
            "add `.child(&message, destination)`",
        )
        .into());
    }
    if flow.parent.destination.is_empty() {
        return Err(ConfigError::new(
            ".to(..)",
            "the flow's parent has no destination",
            "add `.to(\"queue\")`",
        )
        .into());
    }
    let id = flow.parent.id.get_or_insert_with(new_flow_id).clone();
    for (i, child) in flow.children.iter_mut().enumerate() {
        match child {
            OutChild::Message(m) => {
                m.id.get_or_insert_with(|| format!("{id}.{i}"));
            }
            OutChild::Flow(f) => {
                f.parent.id.get_or_insert_with(|| format!("{id}.{i}"));
                fill_ids(f)?;
            }
        }
    }
    let ids = flow.children.iter().filter_map(OutChild::id);
    if id.contains('\n') || ids.clone().any(|c| c.contains('\n')) {
        return Err(ConfigError::new(
            ".id(..)",
            "an id of this flow holds a newline",
            "give the flow and its children ids without newlines",
        )
        .on(id)
        .into());
    }
    let mut seen: Vec<&str> = ids.collect();
    seen.sort_unstable();
    if let Some(twice) = seen.windows(2).find(|w| w[0] == w[1]) {
        return Err(ConfigError::new(
            ".id(..)",
            "two children of a flow have this id",
            "give each child its own id",
        )
        .on(twice[0])
        .into());
    }
    Ok(())
}

/// How a child's settlement ends it for its flow; `None` when it is not over (a retry to come).
pub fn child_outcome(settlement: &Settlement, redelivers: bool) -> Option<ChildOutcome> {
    match settlement {
        Settlement::Ack => Some(ChildOutcome::Acked),
        Settlement::Dead { reason } => Some(ChildOutcome::Dead {
            reason: reason.clone(),
        }),
        Settlement::Cancelled => Some(ChildOutcome::Dropped),
        Settlement::Retry { .. } if !redelivers => Some(ChildOutcome::Dropped),
        Settlement::Retry { .. } => None,
    }
}

/// The children of the flow whose parent `info` is (its `rs.flow.record` header names the
/// record), read through the broker; `what` names the caller in the errors.
pub(crate) async fn children_of(
    publisher: &Publisher,
    info: &crate::DeliveryInfo,
    what: &str,
) -> Result<Vec<FlowChild>> {
    let Some(record) = info.headers.get(RECORD_HEADER) else {
        return Err(ConfigError::new(
            what.to_owned(),
            "this message is no flow's parent",
            "call it on a flow's parent, published with `publisher.flow(..)`",
        )
        .on(&info.message_id)
        .into());
    };
    match publisher.backend().read_flow(record).await? {
        Some(state) => Ok(state.children),
        None => Err(Error::broker(
            crate::ErrorKind::Other,
            format!(
                "{what}: the record of flow `{}` is gone (expired: older than the result ttl)",
                info.message_id
            ),
        )),
    }
}

/// The error of a broker that keeps no flows.
pub(crate) fn unsupported() -> Error {
    ConfigError::new(
        "broker",
        "this broker keeps no flows",
        "use a broker that does (RedisBroker)",
    )
    .into()
}

/// Whether `headers` are a flow child's.
pub(crate) fn is_child(headers: &Headers) -> bool {
    headers.contains_key(CHILD_HEADER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_given_and_checked() {
        let mut flow = OutFlow {
            parent: OutMessage::new("p", Bytes::new()),
            children: vec![
                OutChild::Message(OutMessage::new("c", Bytes::new())),
                OutChild::Flow(Box::new(OutFlow {
                    parent: OutMessage::new("q", Bytes::new()),
                    children: vec![OutChild::Message(OutMessage::new("c", Bytes::new()))],
                    on_child_failure: ChildFailure::Continue,
                    max_age: DEFAULT_MAX_AGE,
                })),
            ],
            on_child_failure: ChildFailure::FailParent,
            max_age: DEFAULT_MAX_AGE,
        };
        flow.parent.id = Some("f".into());
        fill_ids(&mut flow).unwrap();
        let ids: Vec<_> = flow.children.iter().filter_map(OutChild::id).collect();
        assert_eq!(ids, ["f.0", "f.1"]);
        let OutChild::Flow(sub) = &flow.children[1] else {
            panic!("a flow")
        };
        assert_eq!(sub.children[0].id(), Some("f.1.0"));
        flow.children
            .push(OutChild::Message(OutMessage::new("c", Bytes::new())));
        if let OutChild::Message(m) = &mut flow.children[2] {
            m.id = Some("f.0".into());
        }
        assert!(fill_ids(&mut flow).is_err());
        flow.children.clear();
        assert!(fill_ids(&mut flow).is_err());
    }

    #[test]
    fn a_retry_to_come_is_not_the_end_of_a_child() {
        let retry = Settlement::Retry {
            delay: None,
            snooze: false,
            why: crate::Why::retry(""),
        };
        assert_eq!(child_outcome(&retry, true), None);
        assert_eq!(child_outcome(&retry, false), Some(ChildOutcome::Dropped));
        assert_eq!(
            child_outcome(&Settlement::Ack, true),
            Some(ChildOutcome::Acked)
        );
        let child = FlowChild::new("a".into(), ChildOutcome::Acked, Some("[1,2]".into()));
        assert_eq!(child.result::<Vec<u8>>().unwrap(), Some(vec![1, 2]));
    }
}
