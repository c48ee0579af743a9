//! The Redis broker of RustStream, on [`fred`].
//!
//! - [`RedisList`]: work queues on lists, simple (`BRPOP`, at most once) or reliable (claimed into
//!   a processing list, settled with `LREM`, at least once).
//! - [`RedisStream`]: streams read with a consumer group.
//! - [`list::Publish`]: how replies and publishes are pushed (`LPUSH`, optional expiry).
//! - [`RedisBroker`]: connections, key prefix, credentials.
//!
//! Data model (key `K`): `K` the queue, `K.processing` claimed entries, `K.delayed` +
//! `K.delayed.payloads` retries waiting for their time, `K.dead` dead letters with a `reason`
//! header. Every state change is one Lua script (see [`scripts`]) so a crash between two commands
//! never loses or duplicates an entry.

mod broker;
pub mod error;
pub mod frame;
pub mod list;
mod publish;
mod reader;
pub mod scripts;
pub mod stream;
mod validate;

pub use broker::{PublishPolicy, RedisBroker, RedisSource};
pub use list::RedisList;
pub use reader::{REASON_HEADER, RedisReceiver, RedisSettler, Token};
pub use stream::RedisStream;
