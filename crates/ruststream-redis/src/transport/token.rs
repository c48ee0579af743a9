//! [`Token`], what a settle needs of one delivered entry, and the frames a settle writes of it
//! (a dead letter's, a retry's). Sends no command.

use bytes::Bytes;

use ruststream_core::Why;

use crate::frame::{Frame, SNOOZES_HEADER, encode_parts};
use crate::timeline::with_event;

/// What a settle needs of one delivered entry.
#[derive(Debug, Clone)]
pub struct Token {
    /// The list value as claimed (for `LREM`), the stream entry id, or the Pub/Sub message.
    pub(crate) raw: Bytes,
    /// The decoded entry, its id filled in.
    pub(crate) frame: Frame,
    /// The claim's batch in the recovery set, when there is one.
    pub(crate) batch: Option<InBatch>,
    /// The claim's sequence number of its reader, when it has a recovery-set member.
    pub(crate) claim: Option<u64>,
    /// The partition it was read from, on a source with partitions (`crate::partition`).
    pub(crate) partition: usize,
    /// The message's step record, when it has one (`crate::steps`): removed by the settle
    /// that acknowledges or dead-letters it.
    pub(crate) steps: Option<String>,
    /// The field of the signal the message parks for (`signal:<name>`, `crate::steps`): a
    /// park that finds it recorded makes the message due at once.
    pub(crate) signal: Option<String>,
    /// Whether the handler began a durable sleep: its retry later goes into the queue's
    /// sleeping set too (`crate::settle::Op::Sleep`).
    pub(crate) sleeping: bool,
}

/// A claim's place in a reliable list's recovery record (`list/claim.lua`): its batch's member
/// in the recovery set, and its index in the batch list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InBatch {
    /// The batch's member in the recovery set.
    pub member: Bytes,
    /// The claim's index in the batch list, from 0.
    pub index: usize,
}

impl Token {
    /// The frame to store as a dead letter: the entry with a `reason` header, and the dead
    /// letter in its history (`crate::timeline`), which a requeue keeps.
    pub(crate) fn dead_frame(&self, reason: &str) -> Bytes {
        let why = Why {
            kind: "dead",
            reason: reason.to_owned(),
        };
        let mut headers = with_event(&self.frame.headers, &why, self.frame.attempt);
        headers.insert(crate::frame::REASON_HEADER.to_owned(), reason.to_owned());
        encode_parts(
            &self.frame.id,
            self.frame.attempt,
            &headers,
            &self.frame.payload,
        )
    }

    /// The frame of the entry's next delivery: its attempt raised by one, or for a snooze, its
    /// attempt unchanged and its snooze count ([`SNOOZES_HEADER`]) raised by one.
    /// Either way `why` joins its history (`crate::timeline`), on the attempt that ended.
    pub(crate) fn retry_frame(&self, snooze: bool, why: &Why) -> Bytes {
        let mut headers = with_event(&self.frame.headers, why, self.frame.attempt);
        if !snooze {
            return encode_parts(
                &self.frame.id,
                self.frame.attempt.saturating_add(1),
                &headers,
                &self.frame.payload,
            );
        }
        let snoozes = self.frame.snoozes().saturating_add(1);
        headers.insert(SNOOZES_HEADER.to_owned(), snoozes.to_string());
        encode_parts(
            &self.frame.id,
            self.frame.attempt,
            &headers,
            &self.frame.payload,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::delivery::delivery;

    fn token(attempt: u32, snoozes: Option<&str>) -> Token {
        let mut headers = ruststream_core::Headers::new();
        headers.insert("tenant".into(), "acme".into());
        if let Some(n) = snoozes {
            headers.insert(SNOOZES_HEADER.into(), n.into());
        }
        let frame = Frame {
            id: "m".into(),
            attempt,
            headers,
            payload: Bytes::from_static(b"{}"),
        };
        delivery("jobs".into(), frame.encode(), frame).token
    }

    #[test]
    fn a_snooze_keeps_the_attempt_and_counts_one_more() {
        let snoozed = Frame::decode(token(3, Some("4")).retry_frame(true, &Why::snooze("")));
        assert_eq!((snoozed.attempt, snoozed.snoozes()), (3, 5));
        assert_eq!(
            snoozed.headers.get("tenant").map(String::as_str),
            Some("acme")
        );
        let first = Frame::decode(token(1, None).retry_frame(true, &Why::snooze("")));
        assert_eq!((first.attempt, first.snoozes()), (1, 1));
        let retried = Frame::decode(token(3, Some("4")).retry_frame(false, &Why::retry("boom")));
        assert_eq!(
            (retried.attempt, retried.snoozes()),
            (4, 4),
            "a retry keeps the count"
        );
        let garbled = Frame::decode(token(2, Some("many")).retry_frame(true, &Why::snooze("")));
        assert_eq!(
            garbled.snoozes(),
            1,
            "a count that is not a number counts as 0"
        );
    }

    #[test]
    fn a_retry_and_a_dead_letter_join_the_history() {
        let retried = Frame::decode(token(2, None).retry_frame(false, &Why::retry("boom")));
        let t = Token {
            frame: retried,
            ..token(3, None)
        };
        let dead = Frame::decode(t.dead_frame("max-attempts"));
        let history = crate::timeline::events(&dead.headers[crate::timeline::HISTORY_HEADER]);
        let seen: Vec<_> = history
            .iter()
            .map(|e| (e.kind.as_str(), e.attempt, e.detail.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                ("retry", Some(2), "boom"),
                ("dead", Some(3), "max-attempts")
            ]
        );
    }

    #[test]
    fn the_count_is_the_deliverys_not_a_user_header() {
        let mut headers = ruststream_core::Headers::new();
        headers.insert(SNOOZES_HEADER.into(), "2".into());
        headers.insert(crate::timeline::HISTORY_HEADER.into(), "1 retry 1 x".into());
        let frame = Frame {
            id: "m".into(),
            attempt: 1,
            headers,
            payload: Bytes::new(),
        };
        let d = delivery("jobs".into(), frame.encode(), frame);
        assert_eq!(d.info.snoozes, 2);
        assert!(d.info.headers.is_empty(), "{:?}", d.info.headers);
        assert_eq!(
            d.token.frame.snoozes(),
            2,
            "the token keeps it for the next frame"
        );
    }
}
