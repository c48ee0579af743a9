//! What a settle does with one entry, as the settle scripts take it (`list/settle.lua`,
//! `stream/settle.lua`): [`Op`], written once for both, and their reply ([`Settled`]). Sends no
//! command.

use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;

use crate::dead::DeadBound;
use crate::lua;

/// What a settle script did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// How many entries were still this worker's (-1: a list's settle token was settled already).
    pub owned: i64,
    /// How many dead letters the dead-letter list's bound trimmed.
    pub trimmed: u64,
}

impl Settled {
    /// Reads a settle script's `{owned, trimmed}`.
    pub(crate) fn parse(reply: &Value) -> Self {
        match reply {
            Value::Array(items) => Self {
                owned: items.first().map_or(0, lua::reply_i64),
                trimmed: items.get(1).map_or(0, lua::reply_u64),
            },
            _ => Self::default(),
        }
    }
}

/// What a settle does with one claimed entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Acknowledge it.
    Ack,
    /// Acknowledge it and delete its step record (`crate::steps`).
    AckSteps {
        /// The step record.
        steps: String,
    },
    /// Acknowledge it and keep its step record `keep` from now (`keep_steps`).
    AckKeep {
        /// The step record.
        steps: String,
        /// How long the record is kept.
        keep: Duration,
    },
    /// Put `frame` back onto its queue now (`back.lua`).
    Retry {
        /// The entry as it goes back (its attempt raised).
        frame: Bytes,
    },
    /// Schedule `frame` in the delayed set, due `after` from the server's now, as message `id`.
    Later {
        /// The entry as it comes back.
        frame: Bytes,
        /// How long from now.
        after: Duration,
        /// The message's id, its field in the delayed hash.
        id: String,
        /// For a message parked for a signal: its step record and the signal's field there.
        /// A signal recorded already makes the entry due now instead (`crate::steps`).
        wake: Option<(String, String)>,
    },
    /// As [`Op::Later`], for a message in a durable sleep: also in the queue's sleeping set,
    /// which the queue gauges count (`crate::steps`).
    Sleep {
        /// The entry as it comes back.
        frame: Bytes,
        /// How long from now.
        after: Duration,
        /// The message's id, its field in the delayed hash.
        id: String,
    },
    /// Push `frame` onto the dead letters (with a `dead-at` header), then trim them to `bound`.
    Dead {
        /// The dead letter (with its `reason` header).
        frame: Bytes,
        /// The dead-letter list's bound.
        bound: DeadBound,
        /// Its step record, deleted with it, when it has one (`crate::steps`).
        steps: Option<String>,
    },
    /// As [`Op::Dead`], keeping its step record `keep` from now instead (`keep_steps`).
    DeadKeep {
        /// The dead letter (with its `reason` header).
        frame: Bytes,
        /// The dead-letter list's bound.
        bound: DeadBound,
        /// The step record.
        steps: String,
        /// How long the record is kept.
        keep: Duration,
    },
}

impl Op {
    /// A retry of `t` due `after` from the server's now (`snooze`: no attempt spent); a message
    /// parked for a signal carries its record's signal field, which the settle looks up.
    pub(crate) fn later(
        t: &crate::transport::Token,
        after: Duration,
        snooze: bool,
        why: &ruststream_core::Why,
    ) -> Self {
        if t.sleeping && t.steps.is_some() {
            return Self::Sleep {
                frame: t.retry_frame(snooze, why),
                after,
                id: t.frame.id.clone(),
            };
        }
        let wake = match (&t.steps, &t.signal) {
            (Some(steps), Some(field)) => Some((steps.clone(), field.clone())),
            _ => None,
        };
        Self::Later {
            frame: t.retry_frame(snooze, why),
            after,
            id: t.frame.id.clone(),
            wake,
        }
    }

    /// An ack, deleting the step record `steps` when there is one, or keeping it `keep` from
    /// now when the source keeps step records (`keep_steps`).
    pub(crate) fn ack(steps: Option<&String>, keep: Option<Duration>) -> Self {
        match (steps, keep) {
            (Some(steps), None) => Self::AckSteps {
                steps: steps.clone(),
            },
            (Some(steps), Some(keep)) => Self::AckKeep {
                steps: steps.clone(),
                keep,
            },
            (None, _) => Self::Ack,
        }
    }

    /// A dead letter of `frame`, deleting the step record `steps` when there is one, or keeping
    /// it `keep` from now when the source keeps step records (`keep_steps`).
    pub(crate) fn dead(
        frame: Bytes,
        bound: DeadBound,
        steps: Option<&String>,
        keep: Option<Duration>,
    ) -> Self {
        match (steps, keep) {
            (Some(steps), Some(keep)) => Self::DeadKeep {
                frame,
                bound,
                steps: steps.clone(),
                keep,
            },
            (steps, _) => Self::Dead {
                frame,
                bound,
                steps: steps.cloned(),
            },
        }
    }

    /// The op's code: `a`, `r`, `d` or `x`; `A` and `X` for an ack and a dead letter that also
    /// delete the message's step record, `K` and `Y` for those that keep it a while; `w` for a
    /// retry later of a message parked for a signal; `s` for one in a durable sleep.
    pub(crate) fn code(&self) -> u8 {
        match self {
            Self::Ack => b'a',
            Self::AckSteps { .. } => b'A',
            Self::AckKeep { .. } => b'K',
            Self::Retry { .. } => b'r',
            Self::Later { wake: None, .. } => b'd',
            Self::Later { wake: Some(_), .. } => b'w',
            Self::Sleep { .. } => b's',
            Self::Dead { steps: None, .. } => b'x',
            Self::Dead { steps: Some(_), .. } => b'X',
            Self::DeadKeep { .. } => b'Y',
        }
    }

    /// Appends what the op sends after its entry's claim to a settle script's ARGV: `new` and
    /// `arg` for the ops that use them, nothing for an ack.
    pub(crate) fn push_rest(&self, args: &mut Vec<Value>) {
        match self {
            Self::Ack => {}
            Self::AckSteps { steps } => args.push(Value::from(steps.as_str())),
            Self::AckKeep { steps, keep } => {
                args.extend([Value::from(steps.as_str()), keep_arg(*keep)]);
            }
            Self::Retry { frame } => args.push(Value::Bytes(frame.clone())),
            Self::Later {
                frame,
                after,
                id,
                wake,
            } => {
                args.extend([
                    Value::Bytes(frame.clone()),
                    crate::delayed::retry_arg(*after, id),
                ]);
                if let Some((steps, field)) = wake {
                    args.extend([Value::from(steps.as_str()), Value::from(field.as_str())]);
                }
            }
            Self::Sleep { frame, after, id } => args.extend([
                Value::Bytes(frame.clone()),
                crate::delayed::retry_arg(*after, id),
            ]),
            Self::Dead {
                frame,
                bound,
                steps,
            } => {
                args.extend([Value::Bytes(frame.clone()), bound.arg()]);
                if let Some(steps) = steps {
                    args.push(Value::from(steps.as_str()));
                }
            }
            Self::DeadKeep {
                frame,
                bound,
                steps,
                keep,
            } => args.extend([
                Value::Bytes(frame.clone()),
                bound.arg(),
                Value::from(steps.as_str()),
                keep_arg(*keep),
            ]),
        }
    }

    /// Appends the op as one argument, then what it sends after it (`push_rest`).
    pub(crate) fn push(&self, args: &mut Vec<Value>) {
        args.push(Value::Bytes(Bytes::from(vec![self.code()])));
        self.push_rest(args);
    }
}

/// How long a kept step record lives, as the settle scripts take it: ms, at least 1.
fn keep_arg(keep: Duration) -> Value {
    Value::Integer(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX).max(1))
}
