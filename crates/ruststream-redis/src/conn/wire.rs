//! A connection of RustStream's own to one Redis server, outside fred, read only when asked:
//! TCP or TLS, `AUTH` when the broker has credentials, `SELECT` when it names a database, RESP2
//! frames encoded and decoded with `redis-protocol` (the codec fred itself is built on).
//!
//! Two users need what fred does not do:
//! - A Pub/Sub subscription (`crate::pubsub`). fred reads a subscriber connection continuously
//!   and hands its messages to a broadcast channel that drops what a slow reader has not taken;
//!   this connection reads the socket only when its owner asks for the next frame, so a
//!   subscription that cannot keep up leaves the messages in the kernel's buffers and in Redis's
//!   output buffer instead.
//! - A native read (`crate::claim::native`). fred flushes its socket after `MULTI` and after
//!   `EXEC`, so a read in a `MULTI` reaches Redis in two or three writes, and Redis wakes for
//!   each; [`Wire::send_all`] writes a whole round trip at once.
//!
//! Commands sent: `AUTH [user] password`, `SELECT db`, then what the owner sends.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fred::error::{Error, ErrorKind};
use fred::types::config::{Config, Server, TlsConnector};
use redis_protocol::resp2::decode::decode_bytes_mut;
use redis_protocol::resp2::encode::extend_encode;
use redis_protocol::resp2::types::BytesFrame;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// How much a read asks the socket for at once.
const READ_CHUNK: usize = 64 * 1024;

/// A frame of the connection.
pub(crate) type Frame = BytesFrame;

/// What a connection needs besides the address: credentials and TLS, from the broker's
/// configuration.
#[derive(Clone)]
pub(crate) struct Dial {
    username: Option<String>,
    password: Option<String>,
    database: Option<u8>,
    tls: Option<TlsConnector>,
    timeout: Duration,
}

impl Dial {
    /// The credentials and TLS of `config` (fred's, as the broker builds it); a connect or a
    /// handshake taking longer than `timeout` fails.
    pub(crate) fn new(config: &Config, timeout: Duration) -> Self {
        Self {
            username: config.username.clone(),
            password: config.password.clone(),
            database: config.database,
            tls: config.tls.as_ref().map(|t| t.connector.clone()),
            timeout,
        }
    }

    /// Connects to `server`, authenticates and selects the database.
    pub(crate) async fn connect(&self, server: &Server) -> Result<Wire, Error> {
        let mut wire = tokio::time::timeout(self.timeout, self.open(server))
            .await
            .map_err(|_| timed_out("connecting", self.timeout))??;
        if let Some(password) = &self.password {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = &self.username {
                args.push(user.as_bytes());
            }
            args.push(password.as_bytes());
            wire.send(&args).await?;
            if let Frame::Error(e) = wire.reply(self.timeout).await? {
                return Err(Error::new(ErrorKind::Auth, e.to_string()));
            }
        }
        if let Some(db) = self.database.filter(|&db| db != 0) {
            wire.send(&[b"SELECT", db.to_string().as_bytes()]).await?;
            if let Frame::Error(e) = wire.reply(self.timeout).await? {
                return Err(crate::error::reply_error(&e));
            }
        }
        Ok(wire)
    }

    async fn open(&self, server: &Server) -> Result<Wire, Error> {
        let tcp = TcpStream::connect((&*server.host, server.port))
            .await
            .map_err(io)?;
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn Io> = match &self.tls {
            None => Box::new(tcp),
            Some(TlsConnector::Rustls(connector)) => {
                let name = server
                    .tls_server_name
                    .as_ref()
                    .unwrap_or(&server.host)
                    .to_string();
                let name = rustls::pki_types::ServerName::try_from(name)
                    .map_err(|e| Error::new(ErrorKind::Tls, e.to_string()))?;
                Box::new(connector.connect(name, tcp).await.map_err(io)?)
            }
        };
        Ok(Wire {
            io,
            buf: BytesMut::with_capacity(READ_CHUNK),
        })
    }
}

/// A byte stream a connection runs on: TCP, or TLS over TCP.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One connection: what was read and not decoded yet stays in `buf`.
pub(crate) struct Wire {
    io: Box<dyn Io>,
    buf: BytesMut,
}

impl Wire {
    /// Sends one command.
    pub(crate) async fn send(&mut self, args: &[&[u8]]) -> Result<(), Error> {
        self.send_all(&[args]).await
    }

    /// Sends `commands` (each its arguments) in one write.
    pub(crate) async fn send_all<C, A>(&mut self, commands: &[C]) -> Result<(), Error>
    where
        C: AsRef<[A]>,
        A: AsRef<[u8]>,
    {
        let mut out = BytesMut::new();
        for args in commands {
            let frame = Frame::Array(
                args.as_ref()
                    .iter()
                    .map(|a| Frame::BulkString(Bytes::copy_from_slice(a.as_ref())))
                    .collect(),
            );
            extend_encode(&mut out, &frame, false)?;
        }
        self.io.write_all(&out).await.map_err(io)?;
        self.io.flush().await.map_err(io)
    }

    /// The next frame, reading the socket only when none is buffered. Cancel safe: a frame
    /// partly read when the future is dropped stays buffered for the next call.
    pub(crate) async fn next(&mut self) -> Result<Frame, Error> {
        loop {
            if let Some((frame, _, _)) = decode_bytes_mut(&mut self.buf)? {
                return Ok(frame);
            }
            self.buf.reserve(READ_CHUNK);
            if self.io.read_buf(&mut self.buf).await.map_err(io)? == 0 {
                return Err(Error::new(
                    ErrorKind::IO,
                    "the server closed the connection",
                ));
            }
        }
    }

    /// The next frame within `timeout`.
    pub(crate) async fn reply(&mut self, timeout: Duration) -> Result<Frame, Error> {
        tokio::time::timeout(timeout, self.next())
            .await
            .map_err(|_| timed_out("waiting for a reply", timeout))?
    }
}

/// The server of a `MOVED slot host:port` reply.
pub(crate) fn moved_to(reply: &str) -> Option<Server> {
    let address = reply.split_ascii_whitespace().nth(2)?;
    let (host, port) = address.rsplit_once(':')?;
    Some(Server::new(host, port.parse().ok()?))
}

fn io(e: std::io::Error) -> Error {
    Error::new(ErrorKind::IO, format!("{e:?}"))
}

fn timed_out(what: &str, after: Duration) -> Error {
    Error::new(ErrorKind::Timeout, format!("{what} took over {after:?}"))
}
