//! The native read: a reader whose claim needs no script (a simple list with no gate but the
//! pause, a consumer group with no cap and no rate limit) takes with the plain command (`RPOP
//! key n`, `XREADGROUP`), and stays exact against the operator's pause and the queue's cancels
//! with a `WATCH` of their keys: the pause key `K.paused` and the cancel record `K.cancels`.
//!
//! Each read is one round trip, written at once on a connection of the reader's own outside fred
//! (`crate::conn::wire`): `MULTI`, `EXISTS` of the keys, the read, `EXEC`, then `WATCH` of the
//! keys and `EXISTS` of them, for the next read. fred flushes its socket after `MULTI` and after
//! `EXEC`, and Redis then wakes two or three times a read, which more than doubled its time a
//! message (docs/benchmarks.md, "Native read paths"). The next read is sent natively only when
//! that `EXISTS` found neither key, and its `EXEC` fails (takes nothing) when either key was
//! written since that `WATCH`: a `pause` that returned before the read reached Redis, or a
//! cancel's record. A failed `EXEC` reads again. While either key exists (a pause; a cancel
//! record, which lives `crate::cancel::TTL` after the last cancel) the reader claims through its
//! script, whose gates handle both, and looks at the keys again every [`RECHECK`] (`WATCH` and
//! `EXISTS`, one round trip).
//!
//! The connection goes where the reader's fred client sends the queue's key: the URL's server,
//! the primary sentinel names, or on a cluster the owner of the key's slot in fred's map of the
//! slots (a `MOVED` reply, after a slot moved, names the new one). Any failure (the
//! connection's, a timeout, an error reply outside the transaction) closes it, and the next
//! read connects again. A new connection watches nothing, so it is watched (`WATCH`, `EXISTS`)
//! before its first read. The `EXISTS` inside the `MULTI` still says whether a key existed when
//! the read ran; if one did, the read is [`Native::Unsure`] and the caller puts back or holds
//! what it got. Redis drops a `MULTI` its connection did not finish; a reply lost after `EXEC`
//! ran loses what a simple list popped (at most once, as the list promises) and leaves a
//! group's entries pending, for its recovery.
//!
//! An error reply of the read (a key of the wrong type, a missing group) sends the reader to the
//! script, which reports it as it always has. Not for the in-memory model (`crate::memory`),
//! which has no transactions: its readers use the script.
//!
//! Commands: `MULTI`, `EXISTS`, the [`Read`], `EXEC`, `WATCH`, and those of connecting
//! (`crate::conn::wire`).

use std::time::Duration;

use bytes::Bytes;
use fred::error::{Error as FredError, ErrorKind as FredKind};
use fred::prelude::*;
use fred::types::config::Server;
use ruststream_core::Result;
use tokio::time::Instant;

use crate::conn::wire::{Dial, Frame, Wire, moved_to};
use crate::error::core;

/// How often a reader claiming through its script because a key was set looks again.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// Most `EXEC`s in a row a read lets a write of the keys fail before it claims through the
/// script.
const ATTEMPTS: usize = 3;

/// What a native read did.
#[derive(Debug)]
pub(crate) enum Native {
    /// Neither key existed when the read ran: each command's reply, in order.
    Read(Vec<Value>),
    /// A key existed when the read ran: each command's reply, for the caller to put back or
    /// hold.
    Unsure(Vec<Value>),
    /// A key is set (or the read got an error reply): claim through the script.
    Script,
}

/// A native read: the commands inside the `MULTI`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Read<'a> {
    /// `RPOP key count`.
    Pop { key: &'a str, count: usize },
    /// `XREADGROUP GROUP group consumer COUNT count STREAMS key >`, then `XREVRANGE key + -
    /// COUNT 1`.
    Group {
        key: &'a str,
        group: &'a str,
        consumer: &'a str,
        count: usize,
    },
}

impl Read<'_> {
    /// Its commands' arguments.
    fn commands(&self) -> Vec<Vec<Vec<u8>>> {
        let b = |s: &str| s.as_bytes().to_vec();
        match *self {
            Read::Pop { key, count } => vec![vec![b("RPOP"), b(key), b(&count.to_string())]],
            Read::Group {
                key,
                group,
                consumer,
                count,
            } => vec![
                [
                    "XREADGROUP",
                    "GROUP",
                    group,
                    consumer,
                    "COUNT",
                    &count.to_string(),
                    "STREAMS",
                    key,
                    ">",
                ]
                .map(b)
                .to_vec(),
                ["XREVRANGE", key, "+", "-", "COUNT", "1"].map(b).to_vec(),
            ],
        }
    }
}

/// One reader's watch of its pause key and cancel record, on its own connection.
pub(crate) struct Watched {
    keys: Vec<String>,
    dial: Dial,
    /// The longest a round trip may take.
    timeout: Duration,
    conn: tokio::sync::Mutex<Conn>,
}

/// The connection and what is known of it.
#[derive(Default)]
struct Conn {
    wire: Option<Wire>,
    /// The node a `MOVED` reply named: where the next connection goes.
    owner: Option<Server>,
    /// The connection watches the keys, and the `EXISTS` after the `WATCH` found neither.
    armed: bool,
    /// When a set key was seen: not before then is the native read tried again.
    recheck: Option<Instant>,
    /// The server refused a command of the round trip (a warning said so), until one passes.
    refusing: bool,
    /// The server's ACL refuses the transaction: the reader uses its script for good.
    forbidden: bool,
}

impl Conn {
    fn armed(&self) -> bool {
        self.armed && self.wire.is_some()
    }

    /// After an `EXISTS` of the keys counted `set`.
    fn saw(&mut self, set: i64) {
        self.armed = set == 0;
        self.recheck = (set != 0).then(|| Instant::now() + RECHECK);
    }

    /// Closes the connection; the next read connects again, not before `RECHECK` when `wait`.
    fn close(&mut self, wait: bool) {
        self.wire = None;
        self.armed = false;
        self.recheck = wait.then(|| Instant::now() + RECHECK);
    }
}

impl Watched {
    /// The watch of `keys` (full names, in one slot), on a connection made with `dial`, each
    /// round trip bounded by `timeout`.
    pub(crate) fn new(keys: Vec<String>, dial: Dial, timeout: Duration) -> Self {
        Self {
            keys,
            dial,
            timeout,
            conn: tokio::sync::Mutex::new(Conn::default()),
        }
    }

    /// Runs `read` natively when neither key is set (see the module docs); `client` is the
    /// reader's fred client, whose server the connection goes to.
    ///
    /// # Errors
    /// The connection's errors (the read may then have run: a simple list's at most once).
    pub(crate) async fn read(&self, client: &Client, read: Read<'_>) -> Result<Native> {
        let mut conn = self.conn.lock().await;
        if conn.forbidden {
            return Ok(Native::Script);
        }
        if !conn.armed() {
            if conn.recheck.is_some_and(|at| Instant::now() < at) {
                return Ok(Native::Script);
            }
            let armed = self.arm(&mut conn, client).await;
            match armed {
                Ok(Some(set)) => conn.saw(set),
                Ok(None) => return Ok(Native::Script),
                Err(e) => {
                    conn.close(true);
                    return Err(core(e));
                }
            }
            if !conn.armed {
                return Ok(Native::Script);
            }
        }
        for _ in 0..ATTEMPTS {
            match self.once(&mut conn, read).await {
                Ok(Some(Native::Script)) => return Ok(Native::Script),
                Ok(Some(native)) => {
                    conn.refusing = false;
                    return Ok(native);
                }
                Ok(None) if conn.armed() => {}
                Ok(None) => return Ok(Native::Script),
                Err(e) => {
                    conn.close(true);
                    return Err(core(e));
                }
            }
        }
        Ok(Native::Script)
    }

    /// Connects when closed, then `WATCH` and `EXISTS` of the keys: how many are set; `None`
    /// when a reply says the reader must use its script for now.
    async fn arm(&self, conn: &mut Conn, client: &Client) -> Result<Option<i64>, FredError> {
        if conn.wire.is_none() {
            let server = match conn.owner.clone() {
                Some(owner) => owner,
                None => server_of(client, self.keys.first().map_or("", String::as_str))?,
            };
            let wire = self.dial.connect(&server).await;
            conn.wire = Some(wire.inspect_err(|_| conn.owner = None)?);
        }
        let commands = [self.command(b"WATCH", true), self.command(b"EXISTS", true)];
        let mut replies = self.round_trip(conn, &commands).await?;
        let set = replies.pop();
        match (replies.pop(), set) {
            (Some(Frame::SimpleString(_)), Some(Frame::Integer(set))) => Ok(Some(set)),
            (Some(Frame::Error(e)), _) | (_, Some(Frame::Error(e))) => {
                self.refused(conn, &crate::error::reply_error(&e));
                Ok(None)
            }
            other => Err(unexpected(&format!("WATCH and EXISTS answered {other:?}"))),
        }
    }

    /// One round trip: the read in its `MULTI`, then the `WATCH` for the next. `None` when the
    /// `EXEC` failed (a key was written since the last `WATCH`).
    async fn once(&self, conn: &mut Conn, read: Read<'_>) -> Result<Option<Native>, FredError> {
        let reads = read.commands();
        let n = reads.len();
        let mut commands = vec![self.command(b"MULTI", false), self.command(b"EXISTS", true)];
        commands.extend(reads);
        commands.push(self.command(b"EXEC", false));
        commands.push(self.command(b"WATCH", true));
        commands.push(self.command(b"EXISTS", true));
        let mut replies = self.round_trip(conn, &commands).await?.into_iter();
        if let Some(Frame::Error(e)) = replies.next() {
            // No transaction: the commands after `MULTI` ran one by one, the read unwatched.
            let e = crate::error::reply_error(&e);
            self.refused(conn, &e);
            let plain: Vec<Frame> = replies.skip(1).take(n).collect();
            if plain.len() != n || plain.iter().any(|r| matches!(r, Frame::Error(_))) {
                return Ok(Some(Native::Script));
            }
            return Ok(Some(Native::Unsure(plain.into_iter().map(value).collect())));
        }
        // One QUEUED a command inside the transaction.
        for reply in replies.by_ref().take(1 + n) {
            if let Frame::Error(e) = reply {
                self.refused(conn, &crate::error::reply_error(&e));
                return Ok(None);
            }
        }
        let (exec, watch, after) = (replies.next(), replies.next(), replies.next());
        match (watch, after) {
            (Some(Frame::SimpleString(_)), Some(Frame::Integer(set))) => conn.saw(set),
            _ => conn.armed = false,
        }
        let items = match exec {
            Some(Frame::Null) => return Ok(None),
            Some(Frame::Array(items)) => items,
            Some(Frame::Error(e)) => return Err(crate::error::reply_error(&e)),
            other => return Err(unexpected(&format!("EXEC answered {other:?}"))),
        };
        let mut items = items.into_iter();
        let before = match items.next() {
            Some(Frame::Integer(n)) => n,
            _ => 1,
        };
        let replies: Vec<Frame> = items.collect();
        if replies.len() != n {
            return Err(unexpected("EXEC answered another number of replies"));
        }
        // An error reply of the read: the script reports it.
        if replies.iter().any(|r| matches!(r, Frame::Error(_))) {
            return Ok(Some(Native::Script));
        }
        let replies = replies.into_iter().map(value).collect();
        Ok(Some(if before == 0 {
            Native::Read(replies)
        } else {
            Native::Unsure(replies)
        }))
    }

    /// Writes `commands` at once and reads a reply each, within the timeout. The connection is
    /// closed on any failure (a round trip cut short leaves it mid-reply).
    async fn round_trip(
        &self,
        conn: &mut Conn,
        commands: &[Vec<Vec<u8>>],
    ) -> Result<Vec<Frame>, FredError> {
        let Some(mut wire) = conn.wire.take() else {
            return Err(FredError::new(FredKind::IO, "native read: not connected"));
        };
        let all = async {
            wire.send_all(commands).await?;
            let mut replies = Vec::with_capacity(commands.len());
            for _ in commands {
                replies.push(wire.next().await?);
            }
            Ok::<_, FredError>(replies)
        };
        let replies = tokio::time::timeout(self.timeout, all)
            .await
            .map_err(|_| {
                FredError::new(
                    FredKind::Timeout,
                    format!("native read: no reply within {:?}", self.timeout),
                )
            })??;
        conn.wire = Some(wire);
        Ok(replies)
    }

    /// After an error reply outside the transaction: a `MOVED` sends the next connection to the
    /// node it names at once. An ACL's refusal (`NOPERM`: the user lacks `@transaction`) stops
    /// the native reads of this reader for good, with a warning that says how to grant them.
    /// Anything else (a replica's `READONLY` after a failover) closes the connection for
    /// [`RECHECK`], with a warning when a refusal starts. Either way this read uses the script.
    fn refused(&self, conn: &mut Conn, e: &FredError) {
        let moved = e.is_moved().then(|| moved_to(e.details())).flatten();
        let wait = moved.is_none();
        conn.close(wait);
        conn.owner = moved;
        let error = crate::error::redact(e.details());
        if *e.kind() == FredKind::Auth {
            conn.forbidden = true;
            tracing::warn!(%error, keys = ?self.keys, "the server refuses MULTI, EXEC or WATCH to this user: reading through the script, which costs Redis more; grant the user +@transaction");
        } else if wait && !conn.refusing {
            conn.refusing = true;
            tracing::warn!(%error, keys = ?self.keys, "the server refused a native read: reading through the script, trying again every second");
        }
    }

    /// The command `name`, followed by the keys when `with_keys`.
    fn command(&self, name: &[u8], with_keys: bool) -> Vec<Vec<u8>> {
        let keys = if with_keys { self.keys.as_slice() } else { &[] };
        let keys = keys.iter().map(|k| k.as_bytes().to_vec());
        [name.to_vec()].into_iter().chain(keys).collect()
    }
}

/// Where the reader's fred client sends `key`: on a cluster, the primary that owns its slot in
/// fred's map of the slots; else the server it is connected to.
fn server_of(client: &Client, key: &str) -> Result<Server, FredError> {
    if client.is_clustered() {
        let slot = fred::util::redis_keyslot(key.as_bytes());
        let owner = client
            .cached_cluster_state()
            .and_then(|slots| slots.get_server(slot).cloned());
        if let Some(owner) = owner {
            return Ok(owner);
        }
    }
    let mut servers = client.active_connections();
    servers.sort_by(|a, b| (&*a.host, a.port).cmp(&(&*b.host, b.port)));
    servers
        .into_iter()
        .next()
        .ok_or_else(|| FredError::new(FredKind::IO, "native read: the reader's connection is down"))
}

/// A reply frame as fred's value, for the readers that parse fred's values.
fn value(frame: Frame) -> Value {
    match frame {
        Frame::BulkString(b) | Frame::SimpleString(b) => Value::Bytes(b),
        Frame::Integer(n) => Value::Integer(n),
        Frame::Array(items) => Value::Array(items.into_iter().map(value).collect()),
        Frame::Null => Value::Null,
        Frame::Error(e) => Value::Bytes(Bytes::copy_from_slice(e.as_bytes())),
    }
}

/// The error of a reply the native read does not expect.
fn unexpected(what: &str) -> FredError {
    FredError::new(FredKind::Protocol, format!("native read: {what}"))
}
