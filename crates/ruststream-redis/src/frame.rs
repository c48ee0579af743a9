//! The bytes of a list entry: a frame with headers, or a raw payload.
//!
//! ```text
//! frame = MAGIC(4) attempt(u32 BE) id_len(u16 BE) id  n_headers(u16 BE)
//!         { key_len(u16 BE) key  value_len(u32 BE) value }*  payload
//! ```
//! `MAGIC` starts with a NUL byte, which no JSON or text payload starts with, so a value without
//! it is a raw payload with no headers: `redis-cli LPUSH jobs '{"image":"a.png"}'` is a valid
//! producer. Frames are compared byte for byte by `LREM`, so encoding is deterministic (headers
//! are sorted).
//!
//! The scripts read frames with the Lua in `frame.lua`, which follows the same layout.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use ruststream_core::Headers;

/// The first bytes of every frame.
pub const MAGIC: &[u8; 4] = b"\0rs1";

/// The header a dead letter's reason is stored under.
pub const REASON_HEADER: &str = "reason";

/// The frame as the scripts read it (`bump`, `frame_fields`), prepended to those that need it.
pub(crate) const LUA: &str = include_str!("frame.lua");

/// A new message id: a UUIDv7, so ids sort by creation time.
pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A decoded list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The message id; empty for a raw payload.
    pub id: String,
    /// Deliveries so far, counting the one this frame is for (1 on first delivery).
    pub attempt: u32,
    /// User headers.
    pub headers: Headers,
    /// The payload.
    pub payload: Bytes,
}

impl Frame {
    /// Encodes the frame.
    pub fn encode(&self) -> Bytes {
        encode_parts(&self.id, self.attempt, &self.headers, &self.payload)
    }

    /// Decodes a list value; a value that is not a well-formed frame is a raw payload.
    pub fn decode(value: Bytes) -> Self {
        if value.starts_with(MAGIC)
            && let Some(frame) = parse(value.clone())
        {
            return frame;
        }
        Self {
            id: String::new(),
            attempt: 1,
            headers: Headers::new(),
            payload: value,
        }
    }
}

/// Encodes a frame from its parts.
pub fn encode_parts(id: &str, attempt: u32, headers: &Headers, payload: &[u8]) -> Bytes {
    let hdr_len: usize = headers.iter().map(|(k, v)| 6 + k.len() + v.len()).sum();
    let mut b = BytesMut::with_capacity(12 + id.len() + hdr_len + payload.len());
    b.put_slice(MAGIC);
    b.put_u32(attempt);
    put_short(&mut b, id.as_bytes());
    // Header keys and ids longer than u16::MAX are truncated by `put_short`; values by u32.
    b.put_u16(u16::try_from(headers.len()).unwrap_or(u16::MAX));
    for (k, v) in headers.iter().take(usize::from(u16::MAX)) {
        put_short(&mut b, k.as_bytes());
        let v = &v.as_bytes()[..v.len().min(u32::MAX as usize)];
        b.put_u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        b.put_slice(v);
    }
    b.put_slice(payload);
    b.freeze()
}

fn put_short(b: &mut BytesMut, s: &[u8]) {
    let s = &s[..s.len().min(usize::from(u16::MAX))];
    b.put_u16(u16::try_from(s.len()).unwrap_or(u16::MAX));
    b.put_slice(s);
}

fn parse(mut value: Bytes) -> Option<Frame> {
    value.advance(MAGIC.len());
    let attempt = take_u32(&mut value)?;
    let id_len = usize::from(take_u16(&mut value)?);
    let id = take_str(&mut value, id_len)?;
    let n = take_u16(&mut value)?;
    let mut headers = Headers::new();
    for _ in 0..n {
        let kl = usize::from(take_u16(&mut value)?);
        let k = take_str(&mut value, kl)?;
        let vl = usize::try_from(take_u32(&mut value)?).ok()?;
        let v = take_str(&mut value, vl)?;
        headers.insert(k, v);
    }
    Some(Frame {
        id,
        attempt,
        headers,
        payload: value,
    })
}

fn take_u16(b: &mut Bytes) -> Option<u16> {
    (b.remaining() >= 2).then(|| b.get_u16())
}

fn take_u32(b: &mut Bytes) -> Option<u32> {
    (b.remaining() >= 4).then(|| b.get_u32())
}

fn take_str(b: &mut Bytes, n: usize) -> Option<String> {
    if b.remaining() < n {
        return None;
    }
    String::from_utf8(b.split_to(n).to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut headers = Headers::new();
        headers.insert("tenant".into(), "acme".into());
        headers.insert("traceparent".into(), "00-ab-cd-01".into());
        let f = Frame {
            id: "m-1".into(),
            attempt: 3,
            headers,
            payload: Bytes::from_static(br#"{"image":"a.png"}"#),
        };
        assert_eq!(Frame::decode(f.encode()), f);
    }

    #[test]
    fn raw_and_truncated_values_are_payloads() {
        let raw = Bytes::from_static(br#"{"image":"a.png"}"#);
        let f = Frame::decode(raw.clone());
        assert_eq!((f.attempt, f.id.as_str(), f.payload), (1, "", raw));
        let broken = Bytes::from_static(b"\0rs1\0\0");
        assert_eq!(Frame::decode(broken.clone()).payload, broken);
    }
}
