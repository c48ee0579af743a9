//! [`MemoryRedis`]: a tiny Redis of the commands and scripts the broker sends, on the tokio clock.
//!
//! - **Data**: strings, lists (queues, processing lists, dead letters), hashes (delayed payloads),
//!   sorted sets (recovery and delayed sets), streams with consumer groups, pending entries and
//!   delivery counts; key expiry; pub/sub (channels and glob patterns, `PUBLISH`, `PUBSUB
//!   NUMSUB|NUMPAT|CHANNELS`); sharded pub/sub (`SSUBSCRIBE` through
//!   [`MemoryServer::ssubscribe`], `SPUBLISH`, `PUBSUB SHARDNUMSUB|SHARDCHANNELS`, and the
//!   `SUNSUBSCRIBE` of a moved slot: [`MemoryRedis::fail_over_slot_of`]); the cluster slot
//!   rule (`CROSSSLOT`) when built with [`MemoryRedis::cluster`].
//! - **Scripts**: `SCRIPT LOAD`, `EVAL` and `EVALSHA` run the Lua text the client sent (the
//!   broker's real scripts) on an embedded Lua 5.1, the version Redis embeds, in an environment
//!   built as Redis builds it: `KEYS`, `ARGV`, `redis.call`/`pcall` through the model's own
//!   commands inside the same lock (a script is atomic), read-only globals, the `struct`
//!   library's integer formats. A script is stored under the SHA-1 of its text, with `NOSCRIPT`
//!   until loaded, as on a server. The model knows no script by name: changing a script changes
//!   what the model does, with no other edit.
//! - **Clock**: `TIME`, expiry, claim scores and due times read [`MemoryRedis::now_ms`]: the epoch
//!   milliseconds at creation plus the [`tokio::time::Instant`] elapsed since, so under
//!   `#[tokio::test(start_paused = true)]` time moves only when the test lets it.
//! - **Blocking reads** answer at once; the broker's reader first awaits
//!   [`MemoryServer::ready`], which resolves when the read would get something or its timeout
//!   passes (see `ruststream_redis::memory`).
//! - **What was published** ([`MemoryRedis::pushes`]): see `publishes` for the rule.
//!
//! A command, script library or option the model does not implement fails with an error that
//! says so, and is kept in [`MemoryRedis::errors`] so `TestApp` can report it instead of hanging
//! silently.

mod commands;
mod data;
mod lua;
mod publishes;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fred::error::Error as FredError;
use fred::mocks::{MockCommand, Mocks};
use fred::types::Value;
use futures::future::BoxFuture;
use ruststream_redis::memory::{BlockingRead, MemoryServer};
use tokio::sync::{Notify, broadcast};
use tokio::time::Instant;

/// Messages a subscriber of the model may fall behind by before the oldest are dropped (as a
/// lagging subscriber's are on a real server's client).
const SUBSCRIBER_BUFFER: usize = 1024;

/// Something a publish put on a key, as recorded by the model.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pushed {
    /// A value pushed onto a list (`LPUSH`/`RPUSH`, or a script that only adds, such as a list
    /// publish with a ttl).
    List(Bytes),
    /// A stream entry's field/value pairs (`XADD`).
    Stream(Vec<(Bytes, Bytes)>),
    /// A value scheduled in a delayed set (a delayed publish: a script storing the value in a
    /// hash under an id that it scores in a sorted set); recorded under the sorted set's key.
    Scheduled(Bytes),
    /// A message `PUBLISH`ed (or `SPUBLISH`ed) on a channel.
    Channel(Bytes),
}

/// The model's state, behind one lock: every command is atomic, as on a server.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) db: data::Keyspace,
    /// Script texts by SHA-1 (`SCRIPT LOAD`, `EVAL`).
    pub(crate) scripts: HashMap<String, Bytes>,
    /// The Lua state scripts run on, made on first use.
    pub(crate) lua: Option<lua::Engine>,
    /// What the running command or script added, for the record (see `publishes`).
    pub(crate) journal: Vec<publishes::Change>,
    pub(crate) pushes: Vec<(Bytes, Pushed)>,
    pub(crate) channels: HashMap<Bytes, broadcast::Sender<Bytes>>,
    /// Pattern subscriptions (`PSUBSCRIBE`): glob pattern, and its subscribers' channel.
    pub(crate) patterns: Vec<(Bytes, broadcast::Sender<(Bytes, Bytes)>)>,
    /// Sharded channels (`SSUBSCRIBE`), apart from the plain ones as on a server.
    pub(crate) shards: HashMap<Bytes, broadcast::Sender<Bytes>>,
    pub(crate) cluster: bool,
    pub(crate) next_client_id: i64,
}

impl State {
    /// `PUBLISH`: delivers to the channel's subscribers and to every matching pattern's;
    /// returns how many there were.
    pub(crate) fn publish(&mut self, channel: &[u8], message: &[u8]) -> usize {
        let message = Bytes::copy_from_slice(message);
        let mut received = match self.channels.get(channel) {
            Some(tx) => tx.send(message.clone()).unwrap_or(0),
            None => 0,
        };
        let channel = Bytes::copy_from_slice(channel);
        for (pattern, tx) in &self.patterns {
            if data::glob(pattern, &channel) {
                received += tx.send((channel.clone(), message.clone())).unwrap_or(0);
            }
        }
        received
    }

    /// `SPUBLISH`: delivers to the sharded channel's subscribers only; returns how many there
    /// were.
    pub(crate) fn spublish(&self, channel: &[u8], message: &[u8]) -> usize {
        self.shards.get(channel).map_or(0, |tx| {
            tx.send(Bytes::copy_from_slice(message)).unwrap_or(0)
        })
    }
}

struct Shared {
    state: Mutex<State>,
    /// Woken after every command, so waiting readers look again.
    changed: Notify,
    /// Epoch ms at `started`.
    epoch_ms: u64,
    started: Instant,
    /// Commands processed, for `TestApp`'s "has the app settled" check.
    commands: std::sync::atomic::AtomicU64,
    errors: Mutex<Vec<String>>,
}

/// An in-memory Redis with the semantics the broker relies on, on the tokio clock.
///
/// Cheap to clone (clones share the data). Hand it to a broker with
/// `RedisBroker::attach_memory(Arc::new(model.clone()))`, or let `TestApp` do it; use
/// [`client`](Self::client) for a fred client whose commands go to it.
#[derive(Clone)]
pub struct MemoryRedis(Arc<Shared>);

impl fmt::Debug for MemoryRedis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRedis")
            .field("now_ms", &self.now_ms())
            .finish_non_exhaustive()
    }
}

impl Default for MemoryRedis {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryRedis {
    /// A standalone server whose clock starts at the current wall-clock time.
    pub fn new() -> Self {
        Self::starting_at(SystemTime::now())
    }

    /// A standalone server whose clock reads `epoch` now (for fully reproducible timestamps).
    pub fn starting_at(epoch: SystemTime) -> Self {
        let epoch_ms = epoch
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self(Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            epoch_ms,
            started: Instant::now(),
            commands: std::sync::atomic::AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
        }))
    }

    /// A cluster: every key one command or script touches must hash to one slot, or the command
    /// fails with `CROSSSLOT`, as on a Redis Cluster.
    pub fn cluster() -> Self {
        let m = Self::new();
        m.state().cluster = true;
        m
    }

    /// Ends every sharded subscription to a channel in the hash slot of `channel` (a full
    /// name), as Redis does with a `SUNSUBSCRIBE` push when the slot's primary fails over or the
    /// slot migrates; returns how many channels had subscribers. Messages `SPUBLISH`ed before a
    /// subscriber subscribes again are lost, as on a server.
    pub fn fail_over_slot_of(&self, channel: &str) -> usize {
        let slot = fred::util::redis_keyslot(channel.as_bytes());
        let mut st = self.state();
        let before = st.shards.len();
        st.shards
            .retain(|c, tx| tx.receiver_count() == 0 || fred::util::redis_keyslot(c) != slot);
        before - st.shards.len()
    }

    /// Whether the cluster slot rule is enforced.
    pub fn is_cluster(&self) -> bool {
        self.state().cluster
    }

    /// The model's clock: milliseconds since the epoch.
    pub fn now_ms(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.0.started);
        self.0
            .epoch_ms
            .saturating_add(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
    }

    /// The model's clock as a wall-clock time: compute `.at(..)` publish times from it, since
    /// under a paused clock `SystemTime::now()` does not move with the model.
    pub fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.now_ms())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many commands the model has processed (a progress counter).
    pub fn commands_processed(&self) -> u64 {
        self.0.commands.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Commands and scripts the model refused because it does not implement them.
    pub fn errors(&self) -> Vec<String> {
        self.0
            .errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// What publishes put on any of `keys` (full keys, with any prefix), oldest first.
    pub fn pushes(&self, keys: &[&str]) -> Vec<Pushed> {
        self.state()
            .pushes
            .iter()
            .filter(|(k, _)| keys.iter().any(|key| k[..] == *key.as_bytes()))
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// Every key, sorted.
    pub fn keys(&self) -> Vec<String> {
        let now = self.now_ms();
        let mut st = self.state();
        st.db.purge(now);
        let mut keys: Vec<String> = st
            .db
            .keys
            .keys()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        keys.sort();
        keys
    }

    /// Runs one command, as fred would send it: `execute("LLEN", &["jobs"])`.
    ///
    /// # Errors
    /// The Redis error reply, e.g. `WRONGTYPE ...`.
    pub fn execute(&self, command: &str, args: &[&[u8]]) -> Result<Value, FredError> {
        let args: Vec<Bytes> = args.iter().map(|a| Bytes::copy_from_slice(a)).collect();
        self.run(&command.to_ascii_uppercase(), &args)
    }

    fn run(&self, name: &str, args: &[Bytes]) -> Result<Value, FredError> {
        let now = self.now_ms();
        let result = {
            let mut st = self.state();
            st.db.purge(now);
            let result = commands::execute(&mut st, now, name, args);
            publishes::record_command(&mut st);
            result
        };
        self.0
            .commands
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = &result
            && e.details().contains("does not implement")
        {
            self.0
                .errors
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(e.details().to_owned());
            tracing::error!(error = %e.details(), "in-memory Redis model");
        }
        self.0.changed.notify_waiters();
        result
    }

    /// A fred client whose every command goes to this model (no connection is made). Call
    /// `init().await` before use, as with any fred client.
    ///
    /// # Errors
    /// When fred cannot build the client.
    pub fn client(&self) -> Result<fred::clients::Client, FredError> {
        let config = fred::types::config::Config {
            mocks: Some(Arc::new(self.clone())),
            ..Default::default()
        };
        fred::types::Builder::from_config(config).build()
    }

    fn is_ready(&self, read: &BlockingRead) -> bool {
        let now = self.now_ms();
        let mut st = self.state();
        st.db.purge(now);
        match read {
            BlockingRead::List { key } => st
                .db
                .list(key.as_bytes())
                .ok()
                .flatten()
                .is_some_and(|l| !l.is_empty()),
            BlockingRead::Stream { key, group } => st
                .db
                .stream(key.as_bytes())
                .ok()
                .flatten()
                .is_some_and(|s| s.has_new_for(group.as_bytes())),
            // A kind of read this model version does not know: let the reader poll.
            _ => true,
        }
    }
}

fn arg_bytes(v: Value) -> Bytes {
    match v {
        Value::Bytes(b) => b,
        Value::String(s) => s.into_inner(),
        Value::Integer(i) => Bytes::from(i.to_string()),
        Value::Double(f) => Bytes::from(f.to_string()),
        Value::Boolean(b) => Bytes::from_static(if b { b"1" } else { b"0" }),
        Value::Queued => Bytes::from_static(b"QUEUED"),
        Value::Null | Value::Map(_) | Value::Array(_) => Bytes::new(),
    }
}

impl Mocks for MemoryRedis {
    fn process_command(&self, command: MockCommand) -> Result<Value, FredError> {
        let name = command.cmd.to_ascii_uppercase();
        let mut args = Vec::with_capacity(command.args.len() + 1);
        if let Some(sub) = command.subcommand {
            args.push(sub.into_inner());
        }
        args.extend(command.args.into_iter().map(arg_bytes));
        self.run(&name, &args)
    }
}

impl MemoryServer for MemoryRedis {
    fn ready(&self, read: &BlockingRead, timeout: Duration) -> BoxFuture<'static, ()> {
        let this = self.clone();
        let read = read.clone();
        Box::pin(async move {
            let deadline = Instant::now() + timeout;
            loop {
                let changed = this.0.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if this.is_ready(&read) {
                    return;
                }
                tokio::select! {
                    () = changed => {}
                    () = tokio::time::sleep_until(deadline) => return,
                }
            }
        })
    }

    fn clock_ms(&self) -> Option<u64> {
        Some(MemoryRedis::now_ms(self))
    }

    fn subscribe(&self, channel: &str) -> broadcast::Receiver<Bytes> {
        subscriber_of(&mut self.state().channels, channel)
    }

    fn ssubscribe(&self, channel: &str) -> broadcast::Receiver<Bytes> {
        subscriber_of(&mut self.state().shards, channel)
    }

    fn psubscribe(&self, pattern: &str) -> broadcast::Receiver<(Bytes, Bytes)> {
        let mut st = self.state();
        let pattern = Bytes::copy_from_slice(pattern.as_bytes());
        if let Some((_, tx)) = st.patterns.iter().find(|(p, _)| *p == pattern) {
            return tx.subscribe();
        }
        let (tx, rx) = broadcast::channel(SUBSCRIBER_BUFFER);
        st.patterns.push((pattern, tx));
        rx
    }
}

/// A new subscriber of `channel` among `channels` (plain or sharded).
fn subscriber_of(
    channels: &mut HashMap<Bytes, broadcast::Sender<Bytes>>,
    channel: &str,
) -> broadcast::Receiver<Bytes> {
    channels
        .entry(Bytes::copy_from_slice(channel.as_bytes()))
        .or_insert_with(|| broadcast::channel(SUBSCRIBER_BUFFER).0)
        .subscribe()
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Shared")
    }
}
