//! Raw values that start like a frame: they keep their bytes and reach `max_attempts`, and on
//! thousands of them `frame.lua` and `frame.rs` agree on what a frame is.

use std::time::Duration;

use fred::bytes::Bytes;
use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::redis::frame::{Frame, MAGIC};

use crate::harness::{Env, on, stop};
use crate::reliability::common::*;

use super::{Q, k};

// Standalone only: the scripts run with EVAL on no key.
on!([standalone] lua_and_rust_read_the_same_values_as_frames);

on!([standalone, cluster] a_raw_value_that_starts_like_a_frame_keeps_its_bytes_and_reaches_max_attempts);

// The fault: a raw value of 8+ bytes starting with the frame magic `\0rs1`, taken for a frame,
// would have its bytes 5-8 rewritten (as an attempt counter) on every sweep, and never reach its
// attempt limit.
async fn a_raw_value_that_starts_like_a_frame_keeps_its_bytes_and_reaches_max_attempts(env: &Env) {
    // MAGIC, then an id length (0xffff) longer than the value: not a frame.
    let raw = Bytes::from_static(b"\0rs1\0\0\0\x05\xff\xffpayload");
    let _: i64 = env.client.lpush(env.key(Q), raw.clone()).await.unwrap();
    let source = || {
        RedisList::new(Q)
            .reliable()
            .min_idle(Duration::from_millis(200))
            .max_attempts(3)
            .block(Duration::from_millis(100))
    };
    // Each worker dies mid-handler (abandons it at shutdown); the next one sweeps it back.
    for attempt in 1..=3 {
        let h = RawHang::default();
        let hh = h.clone();
        let app = worker(env, |b| {
            b.include(subscriber(source(), hh).build());
        })
        .await;
        eventually("delivered", async || !h.seen().is_empty()).await;
        assert_eq!(
            h.seen(),
            [(raw.clone(), attempt)],
            "bytes kept, attempt counted"
        );
        stop(app).await;
    }
    let h = RawHang::default();
    let hh = h.clone();
    let app = worker(env, |b| {
        b.include(subscriber(source(), hh).build());
    })
    .await;
    eventually("dead-lettered", async || env.llen(&k(".dead")).await == 1).await;
    assert!(h.seen().is_empty(), "not run a fourth time");
    let dead = dead_frames(env, &k(".dead")).await;
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("max-attempts")
    );
    assert_eq!(dead[0].payload, raw, "the dead letter keeps the raw bytes");
    eventually("nothing claimed", async || {
        env.llen(&k(".processing")).await == 0 && env.zcard(&k(".claims")).await == 0
    })
    .await;
    stop(app).await;
}

/// Values that start with the frame magic: frames, frames cut short or with a length off by
/// one, and random bytes.
fn magic_values(rng: &mut fastrand::Rng, n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let headers: ruststream::Headers = (0..rng.usize(0..3))
            .map(|i| {
                (
                    format!("k{i}{}", "x".repeat(rng.usize(0..4))),
                    "v".repeat(rng.usize(0..5)),
                )
            })
            .collect();
        let id = "i".repeat(rng.usize(0..6));
        let payload: Vec<u8> = (0..rng.usize(0..6)).map(|_| rng.u8(..)).collect();
        let attempt = if rng.bool() {
            rng.u32(..)
        } else {
            rng.u32(0..4)
        };
        let frame =
            ruststream::redis::frame::encode_parts(&id, attempt, &headers, &payload).to_vec();
        let v = match rng.u8(0..4) {
            // A frame, whole.
            0 => frame,
            // Cut short.
            1 => frame[..rng.usize(4..=frame.len())].to_vec(),
            // One length byte off by one.
            2 => {
                let mut f = frame;
                let at = rng.usize(8..f.len());
                f[at] = f[at].wrapping_add(if rng.bool() { 1 } else { 255 });
                f
            }
            // The magic, then anything.
            _ => {
                let mut f = MAGIC.to_vec();
                f.extend((0..rng.usize(0..24)).map(|_| rng.u8(..)));
                f
            }
        };
        out.push(v);
    }
    out
}

// The fault: scripts that take any value of 8+ bytes starting with the magic for a frame (and
// rewrite its bytes 5-8 as an attempt), where Rust reads the whole layout, disagree with Rust on
// what a frame is. On thousands of such values, frame.lua and frame.rs must agree on whether it is
// a frame, its attempt and its payload, and bump must keep a raw value's bytes whole.
async fn lua_and_rust_read_the_same_values_as_frames(env: &Env) {
    let script = format!(
        "{}\n{}",
        include_str!("../../../../../ruststream-redis/src/frame.lua"),
        r"
local out = {}
for i, v in ipairs(ARGV) do
  local layout = frame_layout(v)
  if layout then
    out[i] = {layout.attempt, string.sub(v, layout.payload), bump(v)}
  else
    out[i] = {-1, '', bump(v)}
  end
end
return out
"
    );
    let mut rng = fastrand::Rng::with_seed(8);
    let mut frames = 0;
    for _ in 0..8 {
        let values = magic_values(&mut rng, 500);
        let mut args: Vec<Value> = vec![script.as_str().into(), 0.into()];
        args.extend(values.iter().map(|v| Value::Bytes(Bytes::from(v.clone()))));
        let Value::Array(replies) = env.cmd("EVAL", args).await.expect("EVAL") else {
            panic!("EVAL returns an array");
        };
        assert_eq!(replies.len(), values.len());
        for (v, reply) in values.iter().zip(replies) {
            let Value::Array(reply) = reply else {
                panic!("an array per value")
            };
            let lua_attempt = reply[0].as_i64().expect("attempt");
            let bytes = |i: usize| match &reply[i] {
                Value::Bytes(b) => b.clone(),
                Value::String(s) => s.inner().clone(),
                other => panic!("bytes expected, got {other:?}"),
            };
            let rust = Frame::decode(Bytes::from(v.clone()));
            let rust_is_frame = rust.payload.len() < v.len();
            assert_eq!(lua_attempt >= 0, rust_is_frame, "is {v:?} a frame?");
            let bumped = Frame::decode(bytes(2));
            if rust_is_frame {
                frames += 1;
                assert_eq!(lua_attempt, i64::from(rust.attempt), "attempt of {v:?}");
                assert_eq!(bytes(1), rust.payload, "payload of {v:?}");
                let next = Frame {
                    attempt: rust.attempt.saturating_add(1),
                    ..rust
                };
                assert_eq!(bumped, next, "bump of the frame {v:?}");
            } else {
                assert_eq!(
                    (bumped.attempt, &bumped.payload[..]),
                    (2, &v[..]),
                    "bump of the raw value {v:?} keeps its bytes"
                );
            }
        }
    }
    assert!(frames > 1000, "enough of them were frames: {frames}");
}
