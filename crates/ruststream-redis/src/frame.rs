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

use std::ops::{Range, RangeFrom};

use bytes::{BufMut, Bytes, BytesMut};
use ruststream_core::Headers;

/// The first bytes of every frame.
pub const MAGIC: &[u8; 4] = b"\0rs1";

/// The header a dead letter's reason is stored under.
pub const REASON_HEADER: &str = "reason";

/// The header a snoozed message's snooze count is stored under (absent: never snoozed). It rides
/// with the message through retries, delays and dead letters (a stream entry's field of the same
/// name); the handler sees it as `ctx.snoozes()`, not among the headers.
pub const SNOOZES_HEADER: &str = "rs.snoozes";

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

    /// Decodes a list value: a value with the frame's layout is a frame, anything else a raw
    /// payload (attempt 1, no id, no headers). Text that is not UTF-8 in a frame's id or headers
    /// is replaced lossily; [`try_decode`](Self::try_decode) reports it instead.
    pub fn decode(value: Bytes) -> Self {
        let Some(layout) = Layout::read(&value) else {
            return Self::raw(value);
        };
        let lossy = |r: &Range<usize>| String::from_utf8_lossy(&value[r.clone()]).into_owned();
        Self {
            id: lossy(&layout.id),
            attempt: layout.attempt,
            headers: layout
                .headers
                .iter()
                .map(|(k, v)| (lossy(k), lossy(v)))
                .collect(),
            payload: value.slice(layout.payload),
        }
    }

    /// Decodes a list value like [`decode`](Self::decode), but a frame whose id or a header is
    /// not UTF-8 is an error that names the part.
    ///
    /// # Errors
    /// [`FrameError`] when the value has the frame's layout and some of its text is not UTF-8.
    pub fn try_decode(value: Bytes) -> Result<Self, FrameError> {
        let Some(layout) = Layout::read(&value) else {
            return Ok(Self::raw(value));
        };
        let text = |r: &Range<usize>, part: FramePart| {
            std::str::from_utf8(&value[r.clone()])
                .map(str::to_owned)
                .map_err(|_| FrameError::NotUtf8(part))
        };
        let id = text(&layout.id, FramePart::Id)?;
        let mut headers = Headers::new();
        for (i, (k, v)) in layout.headers.iter().enumerate() {
            let key = text(k, FramePart::HeaderKey(i + 1))?;
            let value = text(v, FramePart::HeaderValue(key.clone()))?;
            headers.insert(key, value);
        }
        Ok(Self {
            id,
            attempt: layout.attempt,
            headers,
            payload: value.slice(layout.payload),
        })
    }

    /// A raw payload: attempt 1, no id, no headers.
    fn raw(payload: Bytes) -> Self {
        Self {
            id: String::new(),
            attempt: 1,
            headers: Headers::new(),
            payload,
        }
    }

    /// How many times the message was snoozed: its [`SNOOZES_HEADER`], 0 without one (or one
    /// that is not a number).
    pub fn snoozes(&self) -> u32 {
        self.headers
            .get(SNOOZES_HEADER)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// The attempt of a value with the frame's layout; 1 for anything else.
    pub(crate) fn attempt_of(value: &[u8]) -> u32 {
        Layout::read(value).map_or(1, |l| l.attempt)
    }
}

/// The part of a frame whose text is not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FramePart {
    /// The message id.
    Id,
    /// The key of the n-th header (from 1).
    HeaderKey(usize),
    /// The value of the header with this key.
    HeaderValue(String),
}

/// A value with the frame's layout that cannot be read as one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Text of the frame that is not UTF-8.
    #[error("frame: {} is not UTF-8", describe(.0))]
    NotUtf8(FramePart),
}

fn describe(part: &FramePart) -> String {
    match part {
        FramePart::Id => "the message id".to_owned(),
        FramePart::HeaderKey(n) => format!("the key of header #{n}"),
        FramePart::HeaderValue(key) => format!("the value of header `{key}`"),
    }
}

/// Where the parts of a frame are in a value, read by the layout alone. The one definition of
/// "is a frame": `MAGIC`, then every length fits in the value; `frame.lua`'s `frame_layout` reads
/// exactly the same.
struct Layout {
    attempt: u32,
    id: Range<usize>,
    headers: Vec<(Range<usize>, Range<usize>)>,
    payload: RangeFrom<usize>,
}

impl Layout {
    fn read(value: &[u8]) -> Option<Self> {
        if !value.starts_with(MAGIC) {
            return None;
        }
        let mut r = Reader {
            value,
            pos: MAGIC.len(),
        };
        let attempt = r.u32()?;
        let id_len = usize::from(r.u16()?);
        let id = r.take(id_len)?;
        let n = r.u16()?;
        let mut headers = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            let kl = usize::from(r.u16()?);
            let k = r.take(kl)?;
            let vl = usize::try_from(r.u32()?).ok()?;
            let v = r.take(vl)?;
            headers.push((k, v));
        }
        Some(Self {
            attempt,
            id,
            headers,
            payload: r.pos..,
        })
    }
}

/// Reads big-endian lengths and ranges off a value, `None` past its end.
struct Reader<'a> {
    value: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<Range<usize>> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.value.len())?;
        let r = self.pos..end;
        self.pos = end;
        Some(r)
    }

    fn u16(&mut self) -> Option<u16> {
        let r = self.take(2)?;
        Some(u16::from_be_bytes([
            self.value[r.start],
            self.value[r.start + 1],
        ]))
    }

    fn u32(&mut self) -> Option<u32> {
        let r = self.take(4)?;
        let b = &self.value[r];
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
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

    #[test]
    fn only_the_layout_makes_a_frame() {
        // MAGIC and 8+ bytes, but the lengths do not fit: a raw value, kept whole.
        let magic_raw = Bytes::from_static(b"\0rs1\0\0\0\x05\xff\xffpayload");
        let f = Frame::try_decode(magic_raw.clone()).unwrap();
        assert_eq!((f.attempt, f.id.as_str(), &f.payload), (1, "", &magic_raw));
        assert_eq!(Frame::attempt_of(&magic_raw), 1);
        let framed = encode_parts("m", 7, &Headers::new(), b"p");
        assert_eq!(Frame::attempt_of(&framed), 7);
    }

    #[test]
    fn text_that_is_not_utf8_is_named() {
        let mut v = BytesMut::new();
        v.put_slice(MAGIC);
        v.put_u32(2);
        v.put_u16(1);
        v.put_slice(b"m");
        v.put_u16(2);
        for (k, val) in [(&b"ok"[..], &b"fine"[..]), (&b"\xff"[..], &b"x"[..])] {
            v.put_u16(u16::try_from(k.len()).unwrap());
            v.put_slice(k);
            v.put_u32(u32::try_from(val.len()).unwrap());
            v.put_slice(val);
        }
        v.put_slice(b"{}");
        let v = v.freeze();
        let e = Frame::try_decode(v.clone()).unwrap_err();
        assert_eq!(e.to_string(), "frame: the key of header #2 is not UTF-8");
        let lossy = Frame::decode(v);
        assert_eq!((lossy.attempt, &lossy.payload[..]), (2, &b"{}"[..]));
    }
}
