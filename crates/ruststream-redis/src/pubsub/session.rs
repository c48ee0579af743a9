//! The task that keeps one subscription on a connection of its own (`crate::conn::wire`) and
//! passes its messages on with backpressure: the next message is read only once the one before
//! found room in the subscription's read-ahead buffer.
//!
//! Commands sent: `SUBSCRIBE channel`, `PSUBSCRIBE pattern` or `SSUBSCRIBE channel` after every
//! connect; `PING` when the connection was silent for the command timeout (no reply within
//! another one replaces the connection). Where: on a cluster, a plain subscription goes to one
//! of the nodes the shared pool is connected to (chosen by the channel's name), a sharded one to
//! the owner of its slot (a `-MOVED` reply names it); under sentinel, to the primary the pool
//! found; else to the URL's server.
//!
//! A lost connection is logged, counted in `ruststream_pubsub_disconnects_total{subscription}`
//! and subscribed again with capped exponential backoff: this is how Redis's own loss shows, a
//! subscriber past its `client-output-buffer-limit pubsub` being disconnected. A `SUNSUBSCRIBE`
//! push (the channel's slot moved to another node) subscribes again at once, on the new owner.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use fred::error::{Error, ErrorKind};
use fred::prelude::*;
use fred::types::config::Server;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::source::Kind;
use crate::conn::wire::{Dial, Frame, Wire, moved_to};

/// The longest wait between two attempts to subscribe again.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// One message: the channel it was published on, and its bytes.
pub(super) type Message = (Bytes, Bytes);

/// What a subscription subscribes to, and where.
pub(super) struct Spec {
    pub(super) kind: Kind,
    /// The full channel or pattern.
    pub(super) channel: String,
    /// The channel or pattern as the user named it: the logs' and the metric's label.
    pub(super) label: Arc<str>,
    pub(super) dial: Dial,
    /// The shared pool: the servers it is connected to are where a subscription goes.
    pub(super) pool: Pool,
    /// Where to go when the pool knows no server (standalone: the URL's; cluster: its nodes).
    pub(super) fallback: Vec<Server>,
    /// How long a connection may stay silent before a `PING`, and wait for its reply.
    pub(super) idle: Duration,
}

/// A running subscription.
pub(super) struct Session {
    pub(super) messages: mpsc::Receiver<Message>,
    pub(super) connected: Arc<AtomicBool>,
    pub(super) task: JoinHandle<()>,
}

/// Subscribes; returns once the server confirmed the subscription, or with why it refused.
/// At most `buffer` messages are read ahead of the receiver.
pub(super) async fn start(spec: Spec, buffer: usize) -> Result<Session, Error> {
    let (tx, messages) = mpsc::channel(buffer.max(1));
    let (first, confirmed) = oneshot::channel();
    let connected = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn(run(
        State {
            disconnects: metrics::counter!("ruststream_pubsub_disconnects_total", "subscription" => spec.label.to_string()),
            spec,
            owner: None,
            connected: connected.clone(),
            tx,
        },
        first,
    ));
    match confirmed.await {
        Ok(Ok(())) => Ok(Session {
            messages,
            connected,
            task,
        }),
        Ok(Err(e)) => {
            task.abort();
            Err(e)
        }
        Err(_) => Err(Error::new(
            ErrorKind::Canceled,
            "the subscription task ended",
        )),
    }
}

struct State {
    spec: Spec,
    /// The server a `-MOVED` reply named, tried first next time.
    owner: Option<Server>,
    connected: Arc<AtomicBool>,
    tx: mpsc::Sender<Message>,
    disconnects: metrics::Counter,
}

/// How a connection's session ended.
enum End {
    /// The receiver is gone: the subscription stopped.
    Stopped,
    /// Redis ended the subscription (`SUNSUBSCRIBE`: its slot moved) or named another owner
    /// (`-MOVED`): subscribe again at once.
    Moved,
    /// The connection could not be opened or subscribed.
    NotSubscribed(Error),
    /// The subscribed connection was lost; `behind` when the read-ahead buffer was full at some
    /// point on it.
    Lost(Error, bool),
}

async fn run(mut state: State, first: oneshot::Sender<Result<(), Error>>) {
    let mut first = Some(first);
    let (mut backoff, mut moves) = (Duration::ZERO, 0_u32);
    let mut failing = false;
    loop {
        let end = state.session(&mut first).await;
        state.connected.store(false, Ordering::Relaxed);
        let label = &state.spec.label;
        match end {
            End::Stopped => return,
            End::NotSubscribed(e) | End::Lost(e, _) if first.is_some() => {
                if let Some(first) = first.take() {
                    let _ = first.send(Err(e));
                }
                return;
            }
            End::Moved if moves < 3 => {
                moves += 1;
                continue;
            }
            End::Moved => {
                if let Some(first) = first.take() {
                    let e = Error::new(ErrorKind::Routing, "redirected (MOVED) over and over");
                    let _ = first.send(Err(e));
                    return;
                }
            }
            End::Lost(e, behind) => {
                failing = false;
                state.disconnects.increment(1);
                // `behind`: the handlers fell behind on this connection, so Redis's output
                // buffer for it grew; past `client-output-buffer-limit pubsub` Redis closes it.
                tracing::warn!(subscription = %label, error = %crate::error::redact(e.details()), behind,
                    "pub/sub connection lost: messages published until it is subscribed again are lost; subscribing again");
                backoff = Duration::ZERO;
            }
            End::NotSubscribed(e) if !failing => {
                failing = true;
                tracing::warn!(subscription = %label, error = %crate::error::redact(e.details()),
                    "cannot subscribe again: messages are lost until it is; retrying with backoff");
            }
            End::NotSubscribed(_) => {}
        }
        moves = 0;
        state.owner = None;
        backoff = (backoff * 2).clamp(Duration::from_millis(100), MAX_BACKOFF);
        tokio::time::sleep(backoff).await;
        if state.tx.is_closed() {
            return;
        }
    }
}

impl State {
    /// Connects, subscribes and passes messages on until the connection ends.
    async fn session(&mut self, first: &mut Option<oneshot::Sender<Result<(), Error>>>) -> End {
        let mut wire = match self.subscribe().await {
            Ok(Some(wire)) => wire,
            Ok(None) => return End::Moved,
            Err(e) => return End::NotSubscribed(e),
        };
        self.connected.store(true, Ordering::Relaxed);
        match first.take() {
            Some(first) => {
                let _ = first.send(Ok(()));
            }
            None => tracing::info!(subscription = %self.spec.label, "pub/sub subscribed again"),
        }
        let mut behind = false;
        loop {
            let frame = match self.next(&mut wire).await {
                Ok(frame) => frame,
                Err(_) if self.tx.is_closed() => return End::Stopped,
                Err(e) => return End::Lost(e, behind),
            };
            match message(frame) {
                Push::Message(m) => {
                    behind |= self.tx.capacity() == 0;
                    // Backpressure: nothing more is read until the receiver makes room.
                    if self.tx.send(m).await.is_err() {
                        return End::Stopped;
                    }
                }
                Push::Unsubscribed => {
                    tracing::info!(subscription = %self.spec.label,
                        "Redis ended the subscription (its slot moved): subscribing again");
                    self.owner = None;
                    return End::Moved;
                }
                Push::Error(e) => return End::Lost(e, behind),
                Push::Other => {}
            }
        }
    }

    /// The next frame of `wire`; a `PING` after `idle` of silence, and an error when that gets
    /// no reply either.
    async fn next(&self, wire: &mut Wire) -> Result<Frame, Error> {
        let idle = self.spec.idle;
        if let Ok(frame) = tokio::time::timeout(idle, wire.next()).await {
            return frame;
        }
        if self.tx.is_closed() {
            return Err(Error::new(ErrorKind::Canceled, "stopped"));
        }
        wire.send(&[b"PING"]).await?;
        wire.reply(idle).await
    }

    /// A connection subscribed; `None` when a `-MOVED` reply named another server (then the
    /// next attempt goes there).
    async fn subscribe(&mut self) -> Result<Option<Wire>, Error> {
        let server = self.server()?;
        let mut wire = self.spec.dial.connect(&server).await?;
        let (command, confirmed): (&[u8], &[u8]) = match self.spec.kind {
            Kind::Channel => (b"SUBSCRIBE", b"subscribe"),
            Kind::Pattern => (b"PSUBSCRIBE", b"psubscribe"),
            Kind::Sharded => (b"SSUBSCRIBE", b"ssubscribe"),
        };
        wire.send(&[command, self.spec.channel.as_bytes()]).await?;
        loop {
            match wire.reply(self.spec.idle).await? {
                Frame::Error(e) => {
                    let e = crate::error::reply_error(&e);
                    if e.is_moved() {
                        self.owner = moved_to(e.details());
                        return Ok(None);
                    }
                    return Err(e);
                }
                Frame::Array(items) if word(items.first()) == Some(confirmed) => {
                    return Ok(Some(wire));
                }
                _ => {}
            }
        }
    }

    /// Where to connect: the server a `-MOVED` named, else one the pool is connected to,
    /// chosen by the channel's name so that subscriptions spread over a cluster's nodes.
    fn server(&self) -> Result<Server, Error> {
        if let Some(owner) = &self.owner {
            return Ok(owner.clone());
        }
        let mut servers = self.spec.pool.active_connections();
        if servers.is_empty() {
            servers.clone_from(&self.spec.fallback);
        }
        servers.sort_by(|a, b| (&*a.host, a.port).cmp(&(&*b.host, b.port)));
        servers.dedup();
        if servers.is_empty() {
            return Err(Error::new(
                ErrorKind::IO,
                "no server to subscribe on: the shared connections are down",
            ));
        }
        let mut hash = DefaultHasher::new();
        self.spec.channel.hash(&mut hash);
        let at = usize::try_from(hash.finish() % servers.len() as u64).unwrap_or(0);
        Ok(servers.swap_remove(at))
    }
}

/// What a frame of a subscribed connection says.
enum Push {
    Message(Message),
    /// The server ended the subscription.
    Unsubscribed,
    Error(Error),
    /// A confirmation, a `PING`'s reply.
    Other,
}

fn message(frame: Frame) -> Push {
    let items = match frame {
        Frame::Array(items) => items,
        Frame::Error(e) => return Push::Error(Error::new(ErrorKind::Unknown, e.to_string())),
        _ => return Push::Other,
    };
    let bytes = |i: usize| match items.get(i) {
        Some(Frame::BulkString(b) | Frame::SimpleString(b)) => b.clone(),
        _ => Bytes::new(),
    };
    match word(items.first()) {
        Some(b"message" | b"smessage") => Push::Message((bytes(1), bytes(2))),
        Some(b"pmessage") => Push::Message((bytes(2), bytes(3))),
        Some(b"sunsubscribe" | b"unsubscribe" | b"punsubscribe") => Push::Unsubscribed,
        _ => Push::Other,
    }
}

fn word(frame: Option<&Frame>) -> Option<&[u8]> {
    match frame {
        Some(Frame::BulkString(b) | Frame::SimpleString(b)) => Some(b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Frame {
        Frame::BulkString(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn messages_of_each_kind_are_read_and_the_rest_is_not() {
        let got = |f: Frame| match message(f) {
            Push::Message((c, p)) => Some((c, p)),
            _ => None,
        };
        let m = got(Frame::Array(vec![bulk("message"), bulk("ch"), bulk("p")]));
        assert_eq!(m, Some((Bytes::from("ch"), Bytes::from("p"))));
        let m = got(Frame::Array(vec![
            bulk("pmessage"),
            bulk("c*"),
            bulk("ch"),
            bulk("p"),
        ]));
        assert_eq!(m, Some((Bytes::from("ch"), Bytes::from("p"))));
        let m = got(Frame::Array(vec![bulk("smessage"), bulk("s"), bulk("p")]));
        assert_eq!(m, Some((Bytes::from("s"), Bytes::from("p"))));
        assert!(got(Frame::Array(vec![bulk("pong"), bulk("")])).is_none());
        let ended = Frame::Array(vec![bulk("sunsubscribe"), bulk("s"), Frame::Integer(0)]);
        assert!(matches!(message(ended), Push::Unsubscribed));
    }

    #[test]
    fn a_moved_reply_names_the_owner() {
        let s = moved_to("MOVED 3999 127.0.0.1:7002").expect("a server");
        assert_eq!((&*s.host, s.port), ("127.0.0.1", 7002));
        assert!(moved_to("MOVED 3999").is_none());
    }
}
