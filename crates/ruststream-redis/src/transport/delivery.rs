//! The deliveries a reader hands the core: made of a decoded frame, of a list value (whose
//! frame may not decode), or marked unreadable for the core to dead-letter. Sends no command.

use std::sync::Arc;

use bytes::Bytes;
use ruststream_core::{Delivery, DeliveryInfo};

use super::token::Token;
use crate::frame::Frame;

/// A delivery of `frame` (a missing id is made up) from `source`; `raw` is what settling needs.
pub(crate) fn delivery(source: Arc<str>, raw: Bytes, mut frame: Frame) -> Delivery<Token> {
    if frame.id.is_empty() {
        frame.id = crate::frame::new_id();
    }
    // The snooze count and the history are the library's, not user headers: the handler reads
    // `ctx.snoozes()`, an operator the history.
    let mut headers = frame.headers.clone();
    headers.remove(crate::frame::SNOOZES_HEADER);
    headers.remove(crate::timeline::HISTORY_HEADER);
    let mut info = DeliveryInfo::new(frame.id.clone(), frame.attempt, source, headers);
    info.snoozes = frame.snoozes();
    Delivery {
        info,
        payload: frame.payload.clone(),
        token: Token {
            raw,
            frame,
            batch: None,
            claim: None,
            partition: 0,
            steps: None,
            sleeping: false,
            signal: None,
        },
        unreadable: None,
    }
}

/// A delivery of the list value `raw`: its frame, or when the frame cannot be read, a delivery
/// the core dead-letters with the reason, whose dead letter keeps all of `raw` as its payload.
pub(crate) fn list_delivery(source: Arc<str>, raw: Bytes) -> Delivery<Token> {
    match Frame::try_decode(raw.clone()) {
        Ok(frame) => delivery(source, raw, frame),
        Err(e) => {
            let whole = Frame {
                id: String::new(),
                attempt: Frame::attempt_of(&raw),
                headers: ruststream_core::Headers::new(),
                payload: raw.clone(),
            };
            unreadable(delivery(source, raw, whole), &e)
        }
    }
}

/// `d`, marked for the core to dead-letter with reason `decode: <why>`.
pub(crate) fn unreadable(mut d: Delivery<Token>, why: &impl ToString) -> Delivery<Token> {
    d.unreadable = Some(why.to_string());
    d
}
