//! The native read: a reader whose claim needs no script (a simple list with no gate but the
//! pause, a consumer group with no cap and no rate limit) takes with the plain command (`RPOP
//! key n`, `XREADGROUP`), and stays exact against the operator's pause and the queue's cancels
//! with a `WATCH` of their keys: the pause key `K.paused` and the cancel record `K.cancels`.
//!
//! Each read is one round trip on the reader's own connection: `MULTI`, `EXISTS` of the keys,
//! the read, `EXEC`, then `WATCH` of the keys and `EXISTS` of them, for the next read. fred
//! writes a command to the socket at once when nothing else waits in its queue, and always
//! after a command of its own kind, `MULTI` and `EXEC` here: so the round trip goes as two
//! pipelines queued together, the last `EXISTS` alone in the second, and fred writes it in
//! three writes (`MULTI`; the `EXISTS`, the read and `EXEC`; `WATCH` and `EXISTS`), not one
//! per command. Splitting it there loses nothing: a reconnect between the two pipelines is one
//! between two round trips, which the `EXISTS` inside the `MULTI` covers (below). The next
//! read is sent natively only when that `EXISTS` found neither key, and its `EXEC` fails (takes
//! nothing) when either key was written since that `WATCH`: a `pause` that returned before the
//! read reached Redis, or a cancel's record. A failed `EXEC` reads again. While either key
//! exists (a pause; a cancel record, which lives `crate::cancel::TTL` after the last cancel) the
//! reader claims through its script, whose gates handle both, and looks at the keys again
//! every [`RECHECK`] (`WATCH` and `EXISTS`, one round trip).
//!
//! The `EXISTS` inside the `MULTI` covers a read that ran without its `WATCH`: fred
//! reconnected between two round trips, and a new connection watches nothing. It says whether a
//! key existed when the read ran; if one did, the read is [`Native::Unsure`] and the caller puts
//! back or holds what it got. Every command here is sent to run when sent or not at all
//! (`crate::lua::once`): a round trip cut by a dropped connection fails and is not sent again,
//! and Redis drops a `MULTI` its connection did not finish.
//!
//! An error reply of the read (a key of the wrong type, a missing group) sends the reader to the
//! script, which reports it as it always has. Not for the in-memory model (`crate::memory`),
//! which has no transactions: its readers use the script.
//!
//! Commands: `MULTI`, `EXISTS`, the [`Read`], `EXEC`, `WATCH`.

use std::sync::Mutex;
use std::time::Duration;

use fred::clients::{Pipeline, WithOptions};
use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use ruststream_core::Result;
use tokio::time::Instant;

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
    /// A key existed when the read ran (it ran without its `WATCH`, after a reconnect): each
    /// command's reply, for the caller to put back or hold.
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
    /// How many commands it is.
    fn len(&self) -> usize {
        match self {
            Read::Pop { .. } => 1,
            Read::Group { .. } => 2,
        }
    }

    /// Queues its commands on `p`, as fred's own commands: unlike a custom command, one of
    /// them is written without a flush of the socket while more waits in fred's queue.
    async fn queue(&self, p: &Pipe) -> std::result::Result<(), fred::error::Error> {
        match *self {
            Read::Pop { key, count } => p.rpop(key, Some(count)).await,
            Read::Group {
                key,
                group,
                consumer,
                count,
            } => {
                let count = u64::try_from(count).unwrap_or(u64::MAX);
                let () = p
                    .xreadgroup(group, consumer, Some(count), None, false, key, ">")
                    .await?;
                p.xrevrange(key, "+", "-", Some(1)).await
            }
        }
    }
}

/// A reply of a pipeline.
type Replied = std::result::Result<Value, fred::error::Error>;

/// A pipeline of a reader's client, its commands sent once (`crate::lua::once`).
type Pipe = Pipeline<WithOptions<Client>>;

/// One reader's watch of its pause key and cancel record.
pub(crate) struct Watched {
    keys: Vec<String>,
    hash: ClusterHash,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy, Default)]
struct State {
    /// The connection watches the keys, and the `EXISTS` after the `WATCH` found neither.
    armed: bool,
    /// When a set key was seen: not before then is the native read tried again.
    recheck: Option<Instant>,
}

impl Watched {
    /// The watch of `keys` (full names, in the queue's slot `slot_key`'s).
    pub(crate) fn new(keys: Vec<String>, slot_key: &str) -> Self {
        Self {
            keys,
            hash: crate::keys::slot_of(slot_key),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> State {
        *self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set(&self, armed: bool) {
        let recheck = (!armed).then(|| Instant::now() + RECHECK);
        *self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = State { armed, recheck };
    }

    fn cmd(&self, name: &'static str) -> CustomCommand {
        CustomCommand::new_static(name, self.hash.clone(), false)
    }

    /// Runs `read` natively when neither key is set (see the
    /// module docs).
    ///
    /// # Errors
    /// The connection's errors (the read may then have run: a simple list's at most once).
    pub(crate) async fn read(&self, client: &Client, read: Read<'_>) -> Result<Native> {
        let state = self.state();
        if !state.armed {
            if state.recheck.is_some_and(|at| Instant::now() < at) {
                return Ok(Native::Script);
            }
            let p = self.pipeline(client);
            self.queue_watch(&p).await;
            let (_, set) = self.then_exists(client, &p).await;
            let set = set?;
            self.set(set == 0);
            if set > 0 {
                return Ok(Native::Script);
            }
        }
        for _ in 0..ATTEMPTS {
            match self.once(client, read).await {
                Ok(Some(native)) => return Ok(native),
                Ok(None) if self.state().armed => {}
                Ok(None) => return Ok(Native::Script),
                Err(e) => {
                    self.set(false);
                    return Err(e);
                }
            }
        }
        Ok(Native::Script)
    }

    /// One round trip: the read in its `MULTI`, then the `WATCH` for the next. `None` when the
    /// `EXEC` failed (a key was written since the last `WATCH`).
    async fn once(&self, client: &Client, read: Read<'_>) -> Result<Option<Native>> {
        let p = self.pipeline(client);
        let queue = async {
            let () = p.custom(self.cmd("MULTI"), Vec::<Value>::new()).await?;
            let () = p.exists(self.keys.clone()).await?;
            read.queue(&p).await?;
            p.custom::<(), Value>(self.cmd("EXEC"), Vec::new()).await
        };
        queue.await.map_err(core)?;
        self.queue_watch(&p).await;
        let (mut replies, after) = self.then_exists(client, &p).await;
        let after = after?;
        self.set(after == 0);
        let exec = replies
            .len()
            .checked_sub(2)
            .map(|at| replies.swap_remove(at));
        let items = match exec {
            Some(Ok(Value::Null)) => return Ok(None),
            Some(Ok(Value::Array(items))) => items,
            // An error reply of the read: the script reports it.
            Some(Err(e)) if is_reply(&e) => return Ok(Some(Native::Script)),
            Some(Err(e)) => return Err(core(e)),
            other => return Err(unexpected(&format!("EXEC answered {other:?}"))),
        };
        let mut items = items.into_iter();
        let before = items.next().and_then(|v| v.as_i64()).unwrap_or(1);
        let replies: Vec<Value> = items.collect();
        if replies.len() != read.len() {
            return Err(unexpected("EXEC answered another number of replies"));
        }
        Ok(Some(if before == 0 {
            Native::Read(replies)
        } else {
            Native::Unsure(replies)
        }))
    }

    fn pipeline(&self, client: &Client) -> Pipe {
        Pipeline::from(client.with_options(&crate::lua::once()))
    }

    /// Queues `WATCH` of the keys on `p`, as fred's own command (a custom one would flush).
    /// fred answers its `WATCH` in a pipeline with an error at once (it expects `OK` and gets
    /// its queued placeholder) after queueing it: the `WATCH` is sent with the pipeline all the
    /// same, and its reply is not read (a failed `WATCH` shows as the reconnect case, which the
    /// `EXISTS` inside the next `MULTI` covers).
    async fn queue_watch(&self, p: &Pipe) {
        let _queued = p.watch(self.keys.clone()).await;
    }

    /// Sends `p` and, queued right behind it as a pipeline of its own, `EXISTS` of the keys:
    /// `p`'s replies and the count. While the `EXISTS` waits in fred's queue, fred writes
    /// `p`'s own commands without flushing the socket after each.
    async fn then_exists(&self, client: &Client, p: &Pipe) -> (Vec<Replied>, Result<i64>) {
        let last = self.pipeline(client);
        let queued = last.exists::<(), _>(self.keys.clone()).await;
        let (replies, mut after) = tokio::join!(p.try_all::<Value>(), last.try_all::<Value>());
        let count = match queued {
            Ok(()) => exists(after.pop()),
            Err(e) => Err(core(e)),
        };
        (replies, count)
    }
}

/// The count of an `EXISTS` reply.
fn exists(reply: Option<Replied>) -> Result<i64> {
    match reply {
        Some(Ok(v)) => Ok(v.as_i64().unwrap_or(1)),
        Some(Err(e)) => Err(core(e)),
        None => Err(unexpected("no reply to EXISTS")),
    }
}

/// The error of a reply the native read does not expect.
fn unexpected(what: &str) -> ruststream_core::Error {
    core(fred::error::Error::new(
        fred::error::ErrorKind::Protocol,
        format!("native read: {what}"),
    ))
}

/// Whether `e` is an error reply of Redis to the read (a wrong type, a missing group), not the
/// connection's or the server's state.
fn is_reply(e: &fred::error::Error) -> bool {
    use ruststream_core::ErrorKind as K;
    matches!(crate::error::kind_of(e), K::WrongType | K::Other)
}
