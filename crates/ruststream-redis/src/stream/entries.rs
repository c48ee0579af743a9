//! A stream entry as the transport reads it: the reserved fields, and the replies of
//! `XREADGROUP` (through `read.lua`) and `XCLAIM` read into `(entry id, frame)`, with the first
//! part that is not UTF-8. Sends no command.

use bytes::Bytes;
use ruststream_core::Headers;

use crate::frame::{Frame, FrameError, FramePart};
use crate::reply::{Reply, frame_bytes, frame_items};

/// The field that holds an entry's payload.
pub const PAYLOAD_FIELD: &str = "payload";
/// The field that holds the message id set by a RustStream publisher.
pub const ID_FIELD: &str = "rs.id";
/// The field that holds the delivery attempt of a retried entry.
pub const ATTEMPT_FIELD: &str = "rs.attempt";

/// One entry read: its id and frame (with the first unreadable part, if any).
pub(crate) type StreamEntry = (Bytes, (Frame, Option<FrameError>));

/// Reads an `XREADGROUP` reply (RESP2 arrays or RESP3 maps), as fred received it, into
/// `(entry id, frame)` in one pass.
pub(crate) fn entries(reply: Reply) -> Vec<StreamEntry> {
    let streams: Vec<Reply> = match reply {
        Reply::Map { data, .. } => data.into_values().collect(),
        other => frame_items(other)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|s| frame_items(s).filter(|kv| kv.len() == 2)?.pop())
            .collect(),
    };
    let mut out = Vec::new();
    for list in streams {
        push_entries(list, &mut out);
    }
    out
}

/// Reads a list of entries as fred received it (`[[id, [field, value, ..]], ..]`, as `XCLAIM`
/// replies) into `(entry id, frame)`, in one pass.
pub(crate) fn entry_frames(list: Reply) -> Vec<StreamEntry> {
    let mut out = Vec::new();
    push_entries(list, &mut out);
    out
}

/// Appends the entries of `list` (`[[id, [field, value, ..]], ..]`) to `out`.
fn push_entries(list: Reply, out: &mut Vec<StreamEntry>) {
    let Some(list) = frame_items(list) else {
        return;
    };
    out.reserve(list.len());
    for entry in list {
        let Some(mut parts) = frame_items(entry).map(Vec::into_iter) else {
            continue;
        };
        let Some(id) = parts.next().and_then(frame_bytes) else {
            continue;
        };
        // An entry deleted while pending has no fields: it is still delivered, with an empty
        // payload, so that it is settled (dead-lettered as undecodable) and not stuck.
        let fields = parts.next().and_then(frame_items).unwrap_or_default();
        out.push((id, frame(fields.into_iter().filter_map(frame_bytes))));
    }
}

/// The frame of a stream entry's fields: `payload`, `rs.id`, `rs.attempt`, the rest headers.
/// Text that is not UTF-8 is read lossily, and the first such part is returned with the frame.
fn frame(mut fields: impl Iterator<Item = Bytes>) -> (Frame, Option<FrameError>) {
    let mut frame = Frame {
        id: String::new(),
        attempt: 1,
        headers: Headers::new(),
        payload: Bytes::new(),
    };
    let mut error = None;
    let mut text = |b: &[u8], part: FramePart| match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            error.get_or_insert(FrameError::NotUtf8(part));
            String::from_utf8_lossy(b).into_owned()
        }
    };
    let mut n = 0;
    while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
        match &k[..] {
            f if f == PAYLOAD_FIELD.as_bytes() => frame.payload = v,
            f if f == ID_FIELD.as_bytes() => frame.id = text(&v, FramePart::Id),
            f if f == ATTEMPT_FIELD.as_bytes() => {
                frame.attempt = std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(1);
            }
            _ => {
                n += 1;
                let key = text(&k, FramePart::HeaderKey(n));
                let value = text(&v, FramePart::HeaderValue(key.clone()));
                frame.headers.insert(key, value);
            }
        }
    }
    (frame, error)
}

#[cfg(feature = "testing")]
impl crate::claim::StreamClaimed {
    /// The entries read: each one's id and frame (text that is not UTF-8 read lossily). For the
    /// script tests: the reader parses the reply itself.
    pub fn entries(self) -> Vec<(Bytes, crate::frame::Frame)> {
        entries(self.reply)
            .into_iter()
            .map(|(id, (frame, _))| (id, frame))
            .collect()
    }
}
