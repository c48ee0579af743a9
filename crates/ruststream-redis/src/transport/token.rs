//! [`Token`], what a settle needs of one delivered entry, and the frames a settle writes of it
//! (a dead letter's, a retry's). Sends no command.

use bytes::Bytes;

use crate::frame::{Frame, SNOOZES_HEADER, encode_parts};

/// What a settle needs of one delivered entry.
#[derive(Debug, Clone)]
pub struct Token {
    /// The list value as claimed (for `LREM`), the stream entry id, or the Pub/Sub message.
    pub(crate) raw: Bytes,
    /// The decoded entry, its id filled in.
    pub(crate) frame: Frame,
    /// The claim's member in the recovery set, when there is one.
    pub(crate) member: Option<Bytes>,
    /// The claim's sequence number of its reader, when it has a recovery-set member.
    pub(crate) claim: Option<u64>,
    /// The partition it was read from, on a source with partitions (`crate::partition`).
    pub(crate) partition: usize,
}

impl Token {
    /// The frame to store as a dead letter: the entry with a `reason` header.
    pub(crate) fn dead_frame(&self, reason: &str) -> Bytes {
        let mut headers = self.frame.headers.clone();
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
    pub(crate) fn retry_frame(&self, snooze: bool) -> Bytes {
        if !snooze {
            return encode_parts(
                &self.frame.id,
                self.frame.attempt.saturating_add(1),
                &self.frame.headers,
                &self.frame.payload,
            );
        }
        let mut headers = self.frame.headers.clone();
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
