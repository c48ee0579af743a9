//! Redis Pub/Sub: the [`RedisChannel`] source, its receiver, and the [`Publish`] policy.
//!
//! Pub/Sub is **at-most-once fan-out**: every subscriber connected when a message is published
//! gets it, once; nothing is stored, so a subscriber that is down, reconnecting or not yet
//! subscribed never sees it, and a message cannot be delivered again. Use a list or a stream
//! when a message must survive a crash or be retried.
//!
//! Commands sent:
//! - `SUBSCRIBE channel` ([`RedisChannel::new`]), `PSUBSCRIBE pattern`
//!   ([`RedisChannel::pattern`]) or `SSUBSCRIBE channel` ([`RedisChannel::sharded`]) on a
//!   connection of the subscription's own: a fred `SubscriberClient`, which sends them again
//!   after every reconnect (`manage_subscriptions`); a sharded subscription also sends its
//!   `SSUBSCRIBE` again every [`RESUBSCRIBE_EVERY`] (see *Sharded* below), any other one a
//!   `PING` every command timeout (`keepalive.rs`), so a connection that went silent without
//!   closing is found and replaced. The app starts once the server has confirmed the
//!   subscription.
//! - `PUBLISH channel frame` for [`Publish::new`], `SPUBLISH channel frame` for
//!   [`Publish::sharded`]: the same frame as a list value (message id,
//!   headers, payload; see [`frame`](crate::frame)), so ids and headers reach the handler. A
//!   batch goes out as one pipeline. A value without the frame prefix (`redis-cli PUBLISH events
//!   '{"n":1}'`) is a raw payload with no headers.
//! - `LPUSH dead-letter-list frame` for settlements that do not acknowledge.
//!
//! | handler outcome | what happens |
//! |---|---|
//! | ack | nothing to send |
//! | drop, undecodable payload | `LPUSH` to the dead-letter list with a `reason` header (`dropped`, `decode: ...`) |
//! | retry, retry_after | Pub/Sub cannot redeliver: `LPUSH` to the dead-letter list with reason [`NO_REDELIVERY`] |
//!
//! The dead-letter list is `<channel>.dead` by default (for a pattern, `<pattern>.dead`), in the
//! channel name's hash slot on a cluster; `no_dead_letter()` discards such messages with an error
//! log instead. Every message a subscription delivers has attempt 1.
//!
//! **Buffering and lag.** fred reads the connection continuously (so Redis never disconnects the
//! subscriber for a full output buffer) and hands every message to a tokio broadcast channel of
//! [`FRED_BUFFER`] slots. A small task of the subscription's own moves each message at once from
//! there into the subscription's buffer, which the receiver drains as handlers free up. That
//! buffer holds up to [`DEFAULT_BUFFER`] (16,384) messages unless [`RedisChannel::buffer`] says
//! otherwise, and takes memory only for what is waiting in it. When handlers fall behind by more
//! than that, new messages are dropped, and each drop is counted: the receiver logs a warning
//! naming the subscription and the count and adds it to
//! `ruststream_pubsub_lagged_total{subscription}` (the channel or pattern). Messages still
//! buffered when the subscription stops are not handled (a warning gives their count).
//!
//! Why two buffers: fred allocates its broadcast capacity up front, for every connection, so a
//! large buffer there costs memory even when idle; fred's channel only has to cover the moments
//! the moving task is not scheduled, so it stays small. Messages fred overwrites before the task
//! reads them are counted as lagged too. The sizing and its figures are in `docs/decisions.md`.
//!
//! **Channel names** get the broker's key prefix, like keys, so apps with different prefixes do
//! not hear each other; in a pattern the prefix is escaped, so only the pattern part matches.
//! The handler's `Context::source` is the channel the message was published on, without the
//! prefix (for a pattern subscription, the matching channel).
//!
//! **Cluster.** Plain (not sharded) Pub/Sub works across a cluster: a `PUBLISH` on any node
//! reaches subscribers on every node. fred sends a client's `SUBSCRIBE`/`PSUBSCRIBE` to one
//! node (chosen by the client's id) and re-sends them after a reconnect or a topology change.
//!
//! **Sharded** ([`RedisChannel::sharded`], Redis 7): `SSUBSCRIBE` and `SPUBLISH` go to the node
//! owning the channel's hash slot (fred routes both by the channel, as by a key), and a message
//! travels only within that shard (the primary and its replicas) instead of the whole cluster
//! bus. The two kinds are distinct: a `SUBSCRIBE`r never gets an `SPUBLISH`, an `SSUBSCRIBE`r
//! never gets a `PUBLISH`. When the slot moves (a failover, a resharding), Redis ends the
//! subscription with a `SUNSUBSCRIBE` push on the same connection, which fred discards without
//! telling anyone and without reconnecting; so the subscription sends its `SSUBSCRIBE` again
//! every [`RESUBSCRIBE_EVERY`] (a no-op while it holds; after a move fred follows the `MOVED`
//! reply to the new owner). Messages published between the move and the next `SSUBSCRIBE` are
//! lost, as Pub/Sub loses any message published while a subscriber is away. A sharded channel
//! cannot be a pattern (Redis has no sharded `PSUBSCRIBE`): a name with glob characters is
//! refused at startup. On a standalone server the commands behave like their plain forms, for
//! their own subscribers only.
//!
//! **This folder:**
//!
//! | file | what | Redis |
//! |---|---|---|
//! | `source.rs` | [`RedisChannel`]: what it subscribes to, its buffer | none |
//! | `transport.rs` | the source as the broker sees it: checks, keys, description, route, retries | none |
//! | `receive.rs` | subscribing and reading; its settler | `SUBSCRIBE` / `PSUBSCRIBE` / `SSUBSCRIBE`, `LPUSH` dead letters |
//! | `publish.rs` | publishing | `PUBLISH` / `SPUBLISH`, pipelined |
//! | `keepalive.rs` | a plain subscription's liveness check | `PING` |
//! | `shard.rs` | a sharded subscription's checks and renewal | `SSUBSCRIBE` |
//!
//! Pub/Sub has no `settle.rs` and no scripts: nothing is stored, so there is nothing to
//! acknowledge or put back. Its settler is `crate::dead`'s, which pushes what does not
//! acknowledge to the dead-letter list.
//!
//! **In memory** (`TestApp`), messages come from the model's `PUBLISH` through
//! [`MemoryServer::subscribe`](crate::memory::MemoryServer::subscribe),
//! [`psubscribe`](crate::memory::MemoryServer::psubscribe) and
//! [`ssubscribe`](crate::memory::MemoryServer::ssubscribe) instead of a connection.

mod keepalive;
mod publish;
mod receive;
mod shard;
mod source;
mod transport;

pub use self::publish::Publish;
pub(crate) use self::publish::publish;
pub use self::receive::FRED_BUFFER;
pub use self::shard::RESUBSCRIBE_EVERY;
pub use self::source::{DEFAULT_BUFFER, MAX_BUFFER, RedisChannel};
pub use self::transport::NO_REDELIVERY;
