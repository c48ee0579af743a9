//! A TCP proxy in front of one Redis server, for the failures between "the command ran" and
//! "the client heard": [`Proxy::cut_after`] lets the next request that contains some bytes reach
//! Redis, waits for Redis's reply, throws the reply away and closes the client's connection. The
//! client then sees a dropped connection for a command that did run (and fred, which resends
//! commands whose reply it never got, sends it again on a new connection).
//!
//! Standalone servers only: a cluster's redirects name the nodes' own addresses.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

#[derive(Default)]
struct State {
    /// Cut the connection that next sends a request containing these bytes.
    armed: Mutex<Option<Vec<u8>>>,
    /// Connections cut so far.
    cuts: AtomicUsize,
    /// Woken on every cut, and by `cut_all`.
    cut: Notify,
    /// Bumped by `cut_all`: connections older than this generation close.
    generation: AtomicUsize,
}

/// A proxy on a free loopback port; stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
        let addr = listener.local_addr().expect("the proxy's address");
        let state = Arc::new(State::default());
        let upstream = upstream.to_owned();
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(pump(client, server, shared.clone()));
            }
        });
        Self { addr, state, task }
    }

    /// The proxy's URL, `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Cuts the connection that next sends a request containing `needle`, after Redis replied.
    pub fn cut_after(&self, needle: &[u8]) {
        *self.state.armed.lock().expect("proxy state") = Some(needle.to_vec());
    }

    /// Whether a cut is still armed (not yet triggered).
    pub fn armed(&self) -> bool {
        self.state.armed.lock().expect("proxy state").is_some()
    }

    /// Closes every connection open now.
    pub fn cut_all(&self) {
        self.state.generation.fetch_add(1, Ordering::SeqCst);
        self.state.cut.notify_waiters();
    }

    /// How many connections were cut by [`cut_after`](Self::cut_after).
    pub fn cuts(&self) -> usize {
        self.state.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut_all();
    }
}

/// Forwards both ways until either side closes, a cut, or `cut_all`; then both connections
/// close.
async fn pump(client: TcpStream, server: TcpStream, state: Arc<State>) {
    let generation = state.generation.load(Ordering::SeqCst);
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    // Set when a request was forwarded that must lose its reply.
    let cutting = Arc::new(Notify::new());
    let cut_now = cutting.clone();
    let up_state = state.clone();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = client_rx.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return false;
            }
            let chunk = &buf[..n];
            let hit = {
                let mut armed = up_state.armed.lock().expect("proxy state");
                let hit = armed
                    .as_ref()
                    .is_some_and(|needle| chunk.windows(needle.len()).any(|w| w == &needle[..]));
                if hit {
                    *armed = None;
                }
                hit
            };
            if server_tx.write_all(chunk).await.is_err() {
                return false;
            }
            if hit {
                cut_now.notify_one();
                return true;
            }
        }
    };
    let down_state = state.clone();
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            tokio::select! {
                n = server_rx.read(&mut buf) => {
                    let n = n.unwrap_or(0);
                    if n == 0 || client_tx.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
                () = cutting.notified() => {
                    // The request reached Redis: wait for its reply and throw it away.
                    let _ = tokio::time::timeout(Duration::from_secs(2), server_rx.read(&mut buf)).await;
                    down_state.cuts.fetch_add(1, Ordering::SeqCst);
                    down_state.cut.notify_waiters();
                    return;
                }
            }
        }
    };
    let all_cut = async {
        loop {
            state.cut.notified().await;
            if state.generation.load(Ordering::SeqCst) != generation {
                return;
            }
        }
    };
    tokio::pin!(down);
    // Everything closes when this returns: the client's side, then the server's.
    tokio::select! {
        hit = up => if hit { (&mut down).await },
        () = &mut down => {}
        () = all_cut => {}
    }
}
