//! What a test asserts on: the handler calls an app made ([`Calls`]) and the messages published
//! to a key ([`Published`]), recorded while a `TestApp` runs.
//!
//! Assertions panic (that is how a test fails) with `#[track_caller]`, so the failure points at
//! the test's line, and their message lists what was seen instead.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use ruststream_core::observe::{Call as ObservedCall, Observer};
use ruststream_core::{HandlerOutcome, Headers, MessageType, Settlement};

/// One delivery handed to a handler, and what became of it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Call {
    /// The subscription's name: its source key (`key#2` for a second subscriber of the key).
    pub subscription: String,
    /// The key the message was read from, without the broker's prefix.
    pub source: String,
    /// The message id.
    pub message_id: String,
    /// 1 on the first delivery, 2 on the next, ...
    pub attempt: u32,
    /// The headers the publisher set.
    pub headers: Headers,
    /// The encoded payload.
    pub payload: Bytes,
    /// `false` when the message had no attempts left and went to the dead letters unhandled.
    pub ran: bool,
    /// What the handler decided (`Some(None)`: it did not decide, e.g. a panic or an
    /// undecodable payload); `None` while the handler is still running.
    pub outcome: Option<Option<HandlerOutcome>>,
    /// What the broker was told to do; `None` while the handler is still running.
    pub settlement: Option<Settlement>,
}

impl Call {
    /// Decodes the payload.
    ///
    /// # Errors
    /// When the payload is not a `T`.
    pub fn decode<T: MessageType>(&self) -> ruststream_core::Result<T> {
        T::decode(&self.payload)
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` attempt {} id {} payload {}",
            self.subscription,
            self.attempt,
            self.message_id,
            text(&self.payload)
        )?;
        match (&self.outcome, &self.settlement) {
            _ if !self.ran => write!(f, " -> not run (no attempts left)")?,
            (None, _) | (_, None) => write!(f, " -> still running")?,
            (Some(Some(o)), Some(s)) => write!(f, " -> handler: {o}, settled: {}", settlement(s))?,
            (Some(None), Some(s)) => {
                write!(f, " -> handler did not decide, settled: {}", settlement(s))?;
            }
        }
        Ok(())
    }
}

fn settlement(s: &Settlement) -> String {
    match s {
        Settlement::Ack => "ack".to_owned(),
        Settlement::Retry {
            delay: None,
            snooze: false,
            ..
        } => "retry".to_owned(),
        Settlement::Retry {
            delay: Some(d),
            snooze: false,
            ..
        } => format!("retry after {d:?}"),
        Settlement::Retry {
            delay,
            snooze: true,
            ..
        } => format!("snooze for {:?}", delay.unwrap_or_default()),
        Settlement::Dead { reason } => format!("dead ({reason})"),
        Settlement::Cancelled => "cancelled".to_owned(),
    }
}

/// A payload as text for messages: UTF-8 if it is, else its bytes.
pub(crate) fn text(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) => format!("{b:?}"),
    }
}

/// Records every call of an app; the `TestApp`'s observer.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    calls: Mutex<Vec<Call>>,
    events: AtomicU64,
}

impl Recorder {
    pub(crate) fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    pub(crate) fn calls(&self, name: &str) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|c| c.subscription == name || c.source == name)
            .cloned()
            .collect()
    }

    pub(crate) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|c| c.subscription.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

impl Observer for Recorder {
    fn called(&self, call: &ObservedCall<'_>) {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(new_call(call, true));
        self.events.fetch_add(1, Ordering::Relaxed);
    }

    fn settled(&self, call: &ObservedCall<'_>, outcome: Option<HandlerOutcome>, s: &Settlement) {
        let mut calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        let open = calls.iter_mut().rev().find(|c| {
            c.settlement.is_none()
                && c.subscription == call.subscription
                && c.message_id == call.info.message_id
                && c.attempt == call.info.attempt
        });
        match open {
            Some(c) => {
                c.outcome = Some(outcome);
                c.settlement = Some(s.clone());
            }
            None => {
                let mut c = new_call(call, false);
                c.outcome = Some(outcome);
                c.settlement = Some(s.clone());
                calls.push(c);
            }
        }
        self.events.fetch_add(1, Ordering::Relaxed);
    }
}

fn new_call(call: &ObservedCall<'_>, ran: bool) -> Call {
    Call {
        subscription: call.subscription.to_owned(),
        source: call.info.source.to_string(),
        message_id: call.info.message_id.clone(),
        attempt: call.info.attempt,
        headers: call.info.headers.clone(),
        payload: call.payload.clone(),
        ran,
        outcome: None,
        settlement: None,
    }
}

/// What [`Calls::settled`] compares with: the handler's decision, or the broker's settlement.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// What the handler returned (`Ok` counts as [`HandlerOutcome::ack`]).
    Outcome(HandlerOutcome),
    /// What the broker was told, after the retry policy and the attempt limit.
    Settlement(Settlement),
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Outcome(o) => write!(f, "handler outcome {o}"),
            Self::Settlement(s) => write!(f, "settlement {}", settlement(s)),
        }
    }
}

impl From<HandlerOutcome> for Expected {
    fn from(o: HandlerOutcome) -> Self {
        Self::Outcome(o)
    }
}

impl From<Settlement> for Expected {
    fn from(s: Settlement) -> Self {
        Self::Settlement(s)
    }
}

/// The calls of one subscriber so far: `tb.broker::<RedisBroker>().subscriber("key")`.
///
/// A snapshot: take a new one after publishing or advancing the clock.
#[derive(Debug, Clone)]
#[must_use = "a snapshot asserts nothing until one of its assert_ methods is called"]
pub struct Calls {
    name: String,
    calls: Vec<Call>,
    known: Vec<String>,
}

impl Calls {
    pub(crate) fn new(name: &str, calls: Vec<Call>, known: Vec<String>) -> Self {
        Self {
            name: name.to_owned(),
            calls,
            known,
        }
    }

    /// Every call, oldest first (deliveries that were not run included, see [`Call::ran`]).
    pub fn calls(&self) -> &[Call] {
        &self.calls
    }

    /// The handler calls, oldest first.
    pub fn ran(&self) -> impl Iterator<Item = &Call> {
        self.calls.iter().filter(|c| c.ran)
    }

    /// The most recent handler call.
    pub fn last(&self) -> Option<&Call> {
        self.ran().last()
    }

    fn seen(&self) -> String {
        let mut out = String::new();
        if self.calls.is_empty() {
            let _ = write!(out, "no calls of `{}`", self.name);
            if !self.known.is_empty() {
                let _ = write!(out, "; subscriptions called: {}", self.known.join(", "));
            }
        } else {
            let _ = write!(out, "calls of `{}`:", self.name);
            for (i, c) in self.calls.iter().enumerate() {
                let _ = write!(out, "\n  #{} {c}", i + 1);
            }
        }
        out
    }

    /// Asserts the handler ran exactly once.
    ///
    /// # Panics
    /// When it ran another number of times; the message lists the calls seen.
    #[track_caller]
    pub fn assert_called_once(&self) -> &Self {
        self.assert_called(1)
    }

    /// Asserts the handler ran exactly `n` times.
    ///
    /// # Panics
    /// When it ran another number of times; the message lists the calls seen.
    #[track_caller]
    pub fn assert_called(&self, n: usize) -> &Self {
        let ran = self.ran().count();
        assert!(
            ran == n,
            "expected `{}` to be called {n} time(s), it was called {ran} time(s); {}",
            self.name,
            self.seen()
        );
        self
    }

    /// Asserts the handler never ran.
    ///
    /// # Panics
    /// When it ran; the message lists the calls seen.
    #[track_caller]
    pub fn assert_not_called(&self) -> &Self {
        self.assert_called(0)
    }

    /// Asserts the most recent call's payload decodes to `expected`.
    ///
    /// # Panics
    /// When there was no call, or its payload is something else.
    #[track_caller]
    pub fn with<T: MessageType + PartialEq + fmt::Debug>(&self, expected: &T) -> &Self {
        let Some(last) = self.last() else {
            panic!(
                "expected `{}` to be called with {expected:?}; {}",
                self.name,
                self.seen()
            );
        };
        match last.decode::<T>() {
            Ok(got) if got == *expected => self,
            Ok(got) => panic!(
                "expected the last call of `{}` to be with {expected:?}, it was with {got:?}; {}",
                self.name,
                self.seen()
            ),
            Err(e) => panic!(
                "expected the last call of `{}` to be with {expected:?}, its payload does not decode as {}: {e}; {}",
                self.name,
                std::any::type_name::<T>(),
                self.seen()
            ),
        }
    }

    /// Asserts how the most recent call was settled: give a [`HandlerOutcome`] to compare with
    /// what the handler decided, or a [`Settlement`] to compare with what the broker was told.
    ///
    /// # Panics
    /// When there was no call, it is still running, or it was settled otherwise.
    #[track_caller]
    pub fn settled(&self, expected: impl Into<Expected>) -> &Self {
        let expected = expected.into();
        let Some(last) = self.last() else {
            panic!(
                "expected `{}` to be settled with {expected}; {}",
                self.name,
                self.seen()
            );
        };
        let ok = match (&expected, &last.outcome, &last.settlement) {
            (Expected::Outcome(o), Some(Some(got)), Some(_)) => got == o,
            (Expected::Settlement(s), _, Some(got)) => got == s,
            _ => false,
        };
        assert!(
            ok,
            "expected the last call of `{}` to be settled with {expected}; {}",
            self.name,
            self.seen()
        );
        self
    }
}

/// A shared recorder, for the app's observer slot.
pub(crate) fn observer(r: &Arc<Recorder>) -> Arc<dyn Observer> {
    r.clone()
}
