//! OpenTelemetry traces (feature `otel`): one trace from a producer, through its consumer, to
//! whatever that consumer publishes.
//!
//! - **Publish** ([`Publisher::send`](crate::Publisher::send), and a reply with an
//!   `.out_reply(..)` policy): a `Producer` span `publish <destination>` per publish call, whose
//!   context goes into every message's headers as a W3C `traceparent` (and `tracestate` when the
//!   span has one). A delayed message carries the headers it was published with, so its consumer
//!   continues the publisher's trace however late it runs; so does a retried message.
//! - **Handle** (the dispatch loop): a `Consumer` span `process <subscription>` whose parent is the
//!   message's `traceparent`, current (as the OpenTelemetry [`Context`]) while the handler runs,
//!   so a publish inside the handler, and its reply, are children of it. The span records the
//!   settlement (`ruststream.outcome`: `ack`, `retry`, `dead`, `ignored`) and has an error status
//!   when the handler failed, panicked or the message could not be read.
//!
//! Spans are made by the global tracer provider ([`opentelemetry::global`]): the application
//! installs its provider and exporter; without one, spans cost little and record nothing, and a
//! message's incoming trace context is still passed on to what its handler publishes.
//!
//! The headers are read and written here, in W3C Trace Context's format, not through the global
//! text-map propagator: trace context then crosses services with no propagator to configure
//! (`docs/decisions.md`, "OpenTelemetry: the API crate and our own W3C headers", says why).

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::LazyLock;

use opentelemetry::trace::{
    SpanBuilder, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue, global};

use crate::{DeliveryInfo, Headers, OutMessage, Retries, Settlement};

/// The header that carries the span context (W3C Trace Context).
pub const TRACEPARENT: &str = "traceparent";
/// The header that carries vendor trace state (W3C Trace Context), when there is any.
pub const TRACESTATE: &str = "tracestate";

/// Who makes the spans: this crate, with its version.
static SCOPE: LazyLock<InstrumentationScope> = LazyLock::new(|| {
    InstrumentationScope::builder("ruststream")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
});

fn tracer() -> global::BoxedTracer {
    global::tracer_with_scope(SCOPE.clone())
}

/// The producer span of one publish call; end it with [`Producer::end`].
pub(crate) struct Producer(Context);

impl Producer {
    /// Starts the span, a child of the current context, and writes its context into every
    /// message's headers (a `traceparent` the publisher set is replaced).
    pub(crate) fn start(mut messages: Vec<OutMessage>) -> (Vec<OutMessage>, Self) {
        let parent = Context::current();
        let first = messages.first().map_or("", |m| m.destination.as_str());
        let one_destination = messages.iter().all(|m| m.destination == first);
        let mut attributes = vec![
            KeyValue::new("messaging.system", "redis"),
            KeyValue::new("messaging.operation.name", "publish"),
            KeyValue::new("messaging.operation.type", "send"),
        ];
        let name = if one_destination {
            attributes.push(KeyValue::new(
                "messaging.destination.name",
                first.to_owned(),
            ));
            Cow::Owned(format!("publish {first}"))
        } else {
            Cow::Borrowed("publish")
        };
        match messages.as_slice() {
            [one] => {
                if let Some(id) = &one.id {
                    attributes.push(KeyValue::new("messaging.message.id", id.clone()));
                }
            }
            many => attributes.push(KeyValue::new(
                "messaging.batch.message_count",
                i64::try_from(many.len()).unwrap_or(i64::MAX),
            )),
        }
        let builder = SpanBuilder::from_name(name)
            .with_kind(SpanKind::Producer)
            .with_attributes(attributes);
        let cx = parent.with_span(tracer().build_with_context(builder, &parent));
        if let Some((traceparent, tracestate)) = header_values(cx.span().span_context()) {
            for m in &mut messages {
                m.headers
                    .insert(TRACEPARENT.to_owned(), traceparent.clone());
                match &tracestate {
                    Some(state) => m.headers.insert(TRACESTATE.to_owned(), state.clone()),
                    None => m.headers.remove(TRACESTATE),
                };
            }
        }
        (messages, Self(cx))
    }

    /// Ends the span, with an error status when the publish failed.
    pub(crate) fn end<T>(self, result: &crate::Result<T>) {
        let span = self.0.span();
        if let Err(e) = result {
            span.set_status(Status::error(e.to_string()));
        }
        span.end();
    }
}

/// The consumer span of one delivery: current while its handler runs.
pub(crate) struct Consumer(Context);

impl Consumer {
    /// Starts the span, a child of the message's `traceparent` (a root span without one).
    pub(crate) fn start(subscription: &str, info: &DeliveryInfo) -> Self {
        let parent = match extract(&info.headers) {
            Some(remote) => Context::new().with_remote_span_context(remote),
            None => Context::new(),
        };
        let builder = SpanBuilder::from_name(format!("process {subscription}"))
            .with_kind(SpanKind::Consumer)
            .with_attributes([
                KeyValue::new("messaging.system", "redis"),
                KeyValue::new("messaging.operation.name", "process"),
                KeyValue::new("messaging.operation.type", "process"),
                // The source is shared (`Arc<str>`): no copy per message.
                KeyValue::new("messaging.destination.name", info.source.clone()),
                KeyValue::new(
                    "messaging.destination.subscription.name",
                    subscription.to_owned(),
                ),
                KeyValue::new("messaging.message.id", info.message_id.clone()),
                KeyValue::new("ruststream.attempt", i64::from(info.attempt)),
            ]);
        let span = tracer().build_with_context(builder, &parent);
        Self(parent.with_span(span))
    }

    /// The context the handler runs in.
    pub(crate) fn context(&self) -> Context {
        self.0.clone()
    }

    /// Records what becomes of the message and ends the span.
    pub(crate) fn end(self, settlement: &Settlement, retries: Retries) {
        let span = self.0.span();
        let outcome = match settlement {
            Settlement::Ack => "ack",
            Settlement::Retry { .. } if retries == Retries::Ignored => "ignored",
            Settlement::Retry { .. } => "retry",
            Settlement::Cancelled => "cancelled",
            Settlement::Dead { reason } => {
                span.set_attribute(KeyValue::new(
                    "ruststream.dead_letter.reason",
                    reason.clone(),
                ));
                "dead"
            }
        };
        span.set_attribute(KeyValue::new("ruststream.outcome", outcome));
        span.end();
    }
}

/// Marks the span of the message being handled (the current one) as failed, saying why.
pub(crate) fn failed(why: impl FnOnce() -> String) {
    let cx = Context::current();
    let span = cx.span();
    if span.is_recording() {
        span.set_status(Status::error(why()));
    }
}

/// The `traceparent` and `tracestate` values of a span context; `None` when it is not valid
/// (no provider, no parent: nothing to continue).
fn header_values(sc: &SpanContext) -> Option<(String, Option<String>)> {
    if !sc.is_valid() {
        return None;
    }
    let flags = sc.trace_flags() & TraceFlags::SAMPLED;
    let traceparent = format!(
        "00-{:032x}-{:016x}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        flags.to_u8()
    );
    let state = sc.trace_state().header();
    Some((traceparent, (!state.is_empty()).then_some(state)))
}

/// The remote span context of a message's headers; `None` when it has no `traceparent` or an
/// invalid one (an invalid `tracestate` is dropped, as W3C Trace Context says).
fn extract(headers: &Headers) -> Option<SpanContext> {
    let mut parts = headers.get(TRACEPARENT)?.trim().split('-');
    let (version, trace_id, span_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    // Version 00 has exactly four fields; a later version may append more, which we ignore.
    let valid_version = is_hex(version, 2) && version != "ff";
    if !valid_version || (version == "00" && parts.next().is_some()) {
        return None;
    }
    if !(is_hex(trace_id, 32) && is_hex(span_id, 16) && is_hex(flags, 2)) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?) & TraceFlags::SAMPLED;
    let state = headers
        .get(TRACESTATE)
        .and_then(|s| TraceState::from_str(s).ok())
        .unwrap_or_default();
    let sc = SpanContext::new(trace_id, span_id, flags, true, state);
    sc.is_valid().then_some(sc)
}

/// Whether `s` is exactly `len` lowercase hexadecimal digits.
fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(traceparent: &str) -> Headers {
        Headers::from([(TRACEPARENT.to_owned(), traceparent.to_owned())])
    }

    #[test]
    fn a_written_context_reads_back() {
        let state = TraceState::from_key_value([("vendor", "x1")]).expect("a valid trace state");
        let sc = SpanContext::new(
            TraceId::from(0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c),
            SpanId::from(0xb7ad_6b71_6920_3331),
            TraceFlags::SAMPLED,
            true,
            state,
        );
        let (traceparent, tracestate) = header_values(&sc).expect("a valid context");
        assert_eq!(
            traceparent,
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
        assert_eq!(tracestate.as_deref(), Some("vendor=x1"));
        let mut h = headers(&traceparent);
        h.insert(TRACESTATE.to_owned(), "vendor=x1".to_owned());
        assert_eq!(extract(&h), Some(sc));
    }

    #[test]
    fn without_a_provider_or_a_parent_nothing_is_written() {
        // No tracer provider is installed in this test binary: spans are no-ops.
        let (messages, span) = Producer::start(vec![OutMessage::new("jobs", "{}".into())]);
        span.end(&Ok(()));
        assert!(messages[0].headers.is_empty());
    }

    #[test]
    fn without_a_provider_an_incoming_context_is_passed_on() {
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let info = DeliveryInfo::new("1".into(), 1, "jobs".into(), headers(traceparent));
        let consumer = Consumer::start("jobs", &info);
        let _in_handler = consumer.context().attach();
        let (messages, span) = Producer::start(vec![OutMessage::new("out", "{}".into())]);
        span.end(&Ok(()));
        assert_eq!(
            messages[0].headers.get(TRACEPARENT).map(String::as_str),
            Some(traceparent)
        );
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-+af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333é-01",
        ] {
            assert_eq!(extract(&headers(bad)), None, "{bad:?}");
        }
        // A later version may carry more fields.
        let later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-more";
        assert!(extract(&headers(later)).is_some());
    }
}
