//! `flow show ID`'s output: a flow's state and each child's, as text or JSON.

use ruststream_core::{ChildOutcome, FlowState};

/// A flow as `flow show --json` prints it.
#[derive(Debug, serde::Serialize)]
pub(super) struct FlowView<'a> {
    id: &'a str,
    /// The subscription its parent goes to.
    queue: &'a str,
    state: &'a str,
    on_child_failure: &'static str,
    children: Vec<ChildView<'a>>,
}

/// One child in [`FlowView`].
#[derive(Debug, serde::Serialize)]
struct ChildView<'a> {
    id: &'a str,
    outcome: &'static str,
    /// The dead letter's reason, for a dead child.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    /// The result its handler set (JSON text), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<String>,
}

/// A child's outcome in one word, and a dead child's reason.
pub(crate) fn outcome(o: &ChildOutcome) -> (&'static str, Option<&str>) {
    match o {
        ChildOutcome::Acked => ("acked", None),
        ChildOutcome::Dead { reason } => ("dead", Some(reason)),
        ChildOutcome::Dropped => ("dropped", None),
        _ => ("pending", None),
    }
}

impl<'a> FlowView<'a> {
    pub(super) fn of(state: &'a FlowState, queue: &'a str) -> Self {
        Self {
            id: &state.id,
            queue,
            state: &state.state,
            on_child_failure: state.on_child_failure.as_str(),
            children: state
                .children
                .iter()
                .map(|c| {
                    let (outcome, reason) = outcome(&c.outcome);
                    ChildView {
                        id: &c.id,
                        outcome,
                        reason,
                        result: c
                            .result
                            .as_ref()
                            .map(|r| String::from_utf8_lossy(r).into_owned()),
                    }
                })
                .collect(),
        }
    }
}

/// `flow show`'s text: the flow's line, then one line a child.
pub(super) fn flow_text(state: &FlowState, queue: &str) -> String {
    let view = FlowView::of(state, queue);
    let done = view
        .children
        .iter()
        .filter(|c| c.outcome != "pending")
        .count();
    let mut out = format!(
        "flow {} on {}  {}  on child failure: {}  children done: {done}/{}\n",
        view.id,
        view.queue,
        view.state,
        view.on_child_failure,
        view.children.len()
    );
    for c in &view.children {
        out.push_str(&format!("  {}  {}", c.id, c.outcome));
        if let Some(r) = c.reason {
            out.push_str(&format!("  reason: {r}"));
        }
        if let Some(r) = &c.result {
            out.push_str(&format!("  result: {r}"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use ruststream_core::{ChildFailure, FlowChild};

    use super::*;

    #[test]
    fn a_flow_prints_a_line_a_child() {
        let state = FlowState::new(
            "w".into(),
            "pending".into(),
            ChildFailure::Continue,
            vec![
                FlowChild::new("w.0".into(), ChildOutcome::Acked, Some("120".into())),
                FlowChild::new(
                    "w.1".into(),
                    ChildOutcome::Dead {
                        reason: "dropped".into(),
                    },
                    None,
                ),
                FlowChild::new("w.2".into(), ChildOutcome::Pending, None),
            ],
        );
        assert_eq!(
            flow_text(&state, "{jobs}"),
            "flow w on {jobs}  pending  on child failure: continue  children done: 2/3\n  w.0  acked  result: 120\n  w.1  dead  reason: dropped\n  w.2  pending\n"
        );
        let json = serde_json::to_value(FlowView::of(&state, "{jobs}")).expect("json");
        assert_eq!(json["queue"], "{jobs}");
        assert_eq!(json["children"][1]["reason"], "dropped");
        assert_eq!(json["children"][0]["result"], "120");
    }
}
