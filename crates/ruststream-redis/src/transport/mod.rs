//! The contract each transport (`list`, `stream`, `pubsub`) fulfils, and the types the core's
//! dispatch loop sees. Sends no command itself.
//!
//! | file | what |
//! |---|---|
//! | `source.rs` | [`Transport`], what one transport does for a subscription (check, prepare, open), and [`RedisSource`], a subscription's source whatever its transport |
//! | `receiver.rs` | [`Receive`], one transport's reading, behind [`RedisReceiver`] with the pause gate |
//! | `settler.rs` | [`Settle`], one transport's settling, behind [`RedisSettler`] |
//! | `token.rs` | [`Token`], what a settle needs of one delivery, and the frames it re-writes |
//! | `delivery.rs` | deliveries made of what a reader read, and the unreadable ones |
//! | `watch.rs` | what every list or stream reader runs beside its reads: gauges and the pause gate |

mod delivery;
mod receiver;
mod settler;
mod source;
mod token;
mod watch;

pub(crate) use self::delivery::{delivery, list_delivery, unreadable};
pub(crate) use self::receiver::{Receive, RedisReceiver, signal_ids};
pub(crate) use self::settler::{RedisSettler, Settle};
pub use self::source::RedisSource;
pub(crate) use self::source::Transport;
pub use self::token::InBatch;
pub(crate) use self::token::Token;
pub(crate) use self::watch::{pause_gate, watch_source};
