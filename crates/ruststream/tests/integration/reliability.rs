//! The reliability contract under partial failures: nothing is lost or stuck when a script fails
//! halfway, when Redis is full, when a worker dies, when a connection drops between "the command
//! ran" and "the client heard", or when a value is not what it seems. Fault injection on a real
//! Redis: the stand's standalone server (and its cluster where the failure applies there too),
//! servers of a test's own (`harness::stand::OwnRedis`) for server settings such as maxmemory,
//! child processes killed with SIGKILL, and `harness::proxy` for lost replies.
//!
//! Each test says in a comment above it which fault it catches (each reproduced on Redis 7.0.15
//! with the guard taken out), and asserts what that fault gets wrong. By theme:
//!
//! - `scripts`: scripts that fail whole (wrong key types, too many headers, maxmemory);
//! - `recovery`: dead workers and consumers, lost claim replies, expired recovery sets, slow
//!   handlers, raw values that look like frames, settles sent twice;
//! - `shutdown`: a settle that keeps failing does not hold the shutdown past its timeout;
//! - `silence`: outcomes that must not vanish without a log, a metric or a useful reason;
//! - `proxy_check`: the proxy itself.
//!
//! Every wait is bounded and polls a condition.

#[path = "reliability/common.rs"]
mod common;
#[path = "reliability/liveness.rs"]
mod liveness;
#[path = "reliability/proxy_check.rs"]
mod proxy_check;
#[path = "reliability/recovery/mod.rs"]
mod recovery;
#[path = "reliability/scripts.rs"]
mod scripts;
#[path = "reliability/shutdown.rs"]
mod shutdown;
#[path = "reliability/silence.rs"]
mod silence;
