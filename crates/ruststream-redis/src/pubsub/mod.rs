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
//!   connection of the subscription's own (`crate::conn::wire`, `session.rs`; `AUTH` first when
//!   the broker has credentials), sent again after every reconnect, and a `PING` when it was silent for
//!   the command timeout, so a connection that went quiet without closing is found and
//!   replaced. The app starts once the server has confirmed the subscription.
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
//! **Backpressure: nothing is dropped in this process.** The subscription's connection is read
//! by a task of its own that passes each message into a read-ahead buffer of
//! [`DEFAULT_BUFFER`] (16,384) messages unless [`RedisChannel::buffer`] says otherwise (memory is
//! taken only for what waits), which the receiver drains as handlers free up. When the buffer is
//! full the task waits for room before it reads the next message from the socket: what Redis
//! sends meanwhile stays in the kernel's socket buffers and then in Redis's output buffer for the
//! client. So a subscription that cannot keep up loses nothing here; the only loss left is
//! Redis's own, visible one: past `client-output-buffer-limit pubsub` (32 MB, or 8 MB for 60 s,
//! by default) Redis disconnects the subscriber. The lost connection is logged (a warning naming
//! the subscription, saying whether the handlers were behind), counted in
//! `ruststream_pubsub_disconnects_total{subscription}`, and subscribed again with backoff
//! (100 ms doubling to 5 s); messages published while it was away are lost, as Pub/Sub loses
//! any message published while a subscriber is away. Messages still buffered when the
//! subscription stops are not handled (a warning gives their count).
//!
//! Why not fred's `SubscriberClient`: fred reads a connection continuously and hands every
//! message to a tokio broadcast channel, whose slow receiver loses messages silently; it has no
//! way to stop reading. See `docs/decisions.md`, "A connection of its own, read with
//! backpressure".
//!
//! On `TestApp` the model's feed is a broadcast channel: a subscription more than its buffer
//! behind there loses messages, counted in `ruststream_pubsub_lagged_total{subscription}`.
//!
//! **Channel names** get the broker's key prefix, like keys, so apps with different prefixes do
//! not hear each other; in a pattern the prefix is escaped, so only the pattern part matches.
//! The handler's `Context::source` is the channel the message was published on, without the
//! prefix (for a pattern subscription, the matching channel).
//!
//! **Cluster.** Plain (not sharded) Pub/Sub works across a cluster: a `PUBLISH` on any node
//! reaches subscribers on every node. A `SUBSCRIBE`/`PSUBSCRIBE` goes to one of the nodes the
//! shared pool is connected to (chosen by the channel's name, so subscriptions spread), and to
//! another one after a reconnect when that node is gone.
//!
//! **Sharded** ([`RedisChannel::sharded`], Redis 7): `SSUBSCRIBE` and `SPUBLISH` go to the node
//! owning the channel's hash slot (a subscription follows the `-MOVED` reply of another node),
//! and a message travels only within that shard (the primary and its replicas) instead of the
//! whole cluster bus. The two kinds are distinct: a `SUBSCRIBE`r never gets an `SPUBLISH`, an
//! `SSUBSCRIBE`r never gets a `PUBLISH`. When the slot moves (a failover, a resharding), Redis
//! ends the subscription with a `SUNSUBSCRIBE` push on the same connection (or the connection
//! closes): the subscription then subscribes again at once, on the new owner. Messages
//! published between the move and the new `SSUBSCRIBE` are lost, as Pub/Sub loses any message
//! published while a subscriber is away. A sharded channel cannot be a pattern (Redis has no
//! sharded `PSUBSCRIBE`): a name with glob characters is refused at startup. On a standalone
//! server the commands behave like their plain forms, for their own subscribers only.
//!
//! **This folder:**
//!
//! | file | what | Redis |
//! |---|---|---|
//! | `source.rs` | [`RedisChannel`]: what it subscribes to, its buffer | none |
//! | `transport.rs` | the source as the broker sees it: checks, keys, description, route, retries | none |
//! | `receive.rs` | the receiver: messages as handlers free up; its settler | `LPUSH` dead letters |
//! | `session.rs` | the task keeping the subscription: subscribing, reading with backpressure, reconnecting | `SUBSCRIBE` / `PSUBSCRIBE` / `SSUBSCRIBE`, `PING` |
//! | `publish.rs` | publishing | `PUBLISH` / `SPUBLISH`, pipelined |
//! | `shard.rs` | a sharded channel's checks | none |
//!
//! Pub/Sub has no `settle.rs` and no scripts: nothing is stored, so there is nothing to
//! acknowledge or put back. Its settler is `crate::dead`'s, which pushes what does not
//! acknowledge to the dead-letter list.
//!
//! **In memory** (`TestApp`), messages come from the model's `PUBLISH` through
//! [`MemoryServer::subscribe`](crate::memory::MemoryServer::subscribe),
//! [`psubscribe`](crate::memory::MemoryServer::psubscribe) and
//! [`ssubscribe`](crate::memory::MemoryServer::ssubscribe) instead of a connection.

mod publish;
mod receive;
mod session;
mod shard;
mod source;
mod transport;

pub use self::publish::Publish;
pub(crate) use self::publish::publish;
pub use self::source::{DEFAULT_BUFFER, MAX_BUFFER, RedisChannel};
pub use self::transport::NO_REDELIVERY;
