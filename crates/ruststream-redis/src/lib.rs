//! The Redis broker of RustStream, on [`fred`].
//!
//! - [`RedisList`]: work queues on lists, simple (`BRPOP`, at most once) or reliable (claimed into
//!   a processing list, settled with `LREM`, at least once).
//! - [`RedisStream`]: streams read with a consumer group.
//! - [`RedisChannel`]: Pub/Sub channels and patterns (`SUBSCRIBE`/`PSUBSCRIBE`, at most once).
//! - [`list::Publish`]: how replies and publishes are pushed (`LPUSH`, optional expiry);
//!   [`stream::Publish`] (`XADD`) and [`pubsub::Publish`] (`PUBLISH`) for the other transports.
//! - [`RedisBroker`]: connections, key prefix, credentials.
//!
//! Data model (key `K`): `K` the queue, `K.processing` claimed entries, `K.delayed` +
//! `K.delayed.payloads` retries waiting for their time, `K.dead` dead letters with a `reason`
//! header; a Pub/Sub channel `C` stores nothing but its dead letters, `C.dead`. On a cluster,
//! the default derived names of an untagged key go in its slot by tagging the whole key
//! (`{app:uploads}.delayed`, see `list::derived`); a reliable queue needs a hash tag.
//! Every state change is one Lua script (see [`scripts`]) so a crash between two commands
//! never loses or duplicates an entry.

mod broker;
pub mod error;
pub mod frame;
mod gauges;
pub mod list;
pub mod memory;
mod publish;
pub mod pubsub;
mod reader;
pub mod scripts;
mod settler;
pub mod stream;
mod tls;
mod validate;

pub use broker::{PublishPolicy, RedisBroker, RedisSource};
pub use list::RedisList;
pub use pubsub::RedisChannel;
pub use reader::{MOVE_BATCH, RECOVER_BATCH, RedisReceiver, Token};
pub use settler::{REASON_HEADER, RedisSettler};
pub use stream::RedisStream;
