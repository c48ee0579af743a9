//! A TCP proxy in front of one Redis server, for the failures between "the command ran" and
//! "the client heard": [`Proxy::cut_after`] lets the next request that contains some bytes reach
//! Redis, waits until Redis has answered it, throws the answer away and closes the client's
//! connection. The client then sees a dropped connection for a command that did run (and fred,
//! which resends commands whose reply it never got, sends it again on a new connection).
//!
//! How "Redis has answered" is known: once the request is forwarded, nothing more goes to the
//! client, and the proxy sends Redis an `ECHO <marker>` of its own behind it; Redis answers in
//! order, so the marker's reply comes after the reply to the cut request. A request is forwarded
//! whole: bytes that end inside a command are held until the command is complete.
//!
//! [`Proxy::stall_all`] silences every open connection without closing it (a frozen peer, a
//! network that drops everything): for the failures no reconnect notices by itself.
//!
//! [`Proxy::outage_on`] holds the next request that contains some bytes (Redis never gets it),
//! closes every connection and turns new ones away for a while: an outage that begins while
//! that command is in flight, for what a client does with it when Redis is back.
//!
//! [`Proxy::freeze_on`] holds the next request that contains some bytes and, for a while, every
//! request of every connection: a server that froze (or a network that stalled) with that
//! command on its way. At the thaw the held request reaches Redis first, and the others only
//! once it and the next requests of its connection (as many as asked) have their replies, so
//! they run before anything sent during the freeze.
//!
//! Everything the clients sent is kept per connection, so a test can count how often a request
//! reached Redis ([`Proxy::sent_count`]), e.g. to see that a cut command was sent again.
//!
//! Standalone servers only: a cluster's redirects name the nodes' own addresses.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How long a cut waits for Redis's reply before it closes the connection anyway.
const REPLY_WAIT: Duration = Duration::from_secs(5);

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
    /// Bumped by `stall_all`: connections older than this generation go silent.
    stalled: AtomicUsize,
    /// What each connection's client sent, in order.
    sent: Mutex<Vec<Vec<u8>>>,
    /// Hold the next request containing these bytes, then an outage this long.
    outage: Mutex<Option<(Vec<u8>, Duration)>>,
    /// New connections close at once until then.
    down_until: Mutex<Option<Instant>>,
    /// Hold the next request containing these bytes, and every request, this long.
    freeze: Mutex<Option<(Vec<u8>, Duration)>>,
    /// How many requests of the held one's connection go before the others at the thaw.
    freeze_first: AtomicUsize,
    /// While a freeze holds: when it thaws.
    thaw: Mutex<Option<Instant>>,
    /// Set when the requests that go first at the thaw got their replies: the others go then.
    thawed: AtomicBool,
    /// Woken when `thawed` is set.
    thawing: Notify,
}

impl State {
    /// Whether connections are turned away now.
    fn down(&self) -> bool {
        self.down_until
            .lock()
            .expect("proxy state")
            .is_some_and(|t| Instant::now() < t)
    }

    /// Takes the armed outage if `chunk` contains its needle: the outage's length.
    fn outage_hit(&self, chunk: &[u8]) -> Option<Duration> {
        take_hit(&self.outage, chunk)
    }

    /// Waits while a freeze holds: until its held request got its reply (at most
    /// [`REPLY_WAIT`] past the thaw).
    async fn thawed(&self) {
        loop {
            let woken = self.thawing.notified();
            let Some(thaw) = *self.thaw.lock().expect("proxy state") else {
                return;
            };
            if self.thawed.load(Ordering::SeqCst) {
                return;
            }
            let latest = tokio::time::Instant::from_std(thaw + REPLY_WAIT);
            if tokio::time::timeout_at(latest, woken).await.is_err() {
                return;
            }
        }
    }
}

/// Takes the armed `(needle, length)` in `slot` if `chunk` contains its needle: its length.
fn take_hit(slot: &Mutex<Option<(Vec<u8>, Duration)>>, chunk: &[u8]) -> Option<Duration> {
    let mut armed = slot.lock().expect("proxy state");
    let (needle, length) = armed.as_ref()?;
    if !chunk.windows(needle.len()).any(|w| w == &needle[..]) {
        return None;
    }
    let length = *length;
    *armed = None;
    Some(length)
}

/// A proxy on a free loopback port; stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `upstream` (`host:port`, or a `redis://host:port` URL).
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
        let addr = listener.local_addr().expect("the proxy's address");
        let state = Arc::new(State::default());
        let upstream = upstream
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned();
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if shared.down() {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
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

    /// When a request containing `needle` next comes, does not forward it, closes every
    /// connection, and closes new ones at once for `outage` (Redis is unreachable).
    pub fn outage_on(&self, needle: &[u8], outage: Duration) {
        *self.state.outage.lock().expect("proxy state") = Some((needle.to_vec(), outage));
    }

    /// Whether an outage is still armed (its request not yet seen).
    pub fn outage_armed(&self) -> bool {
        self.state.outage.lock().expect("proxy state").is_some()
    }

    /// When a request containing `needle` next comes, holds it and every request of every
    /// connection for `freeze`; then forwards it, and the others once it and the next
    /// `first - 1` requests of its connection got their replies.
    pub fn freeze_on(&self, needle: &[u8], freeze: Duration, first: usize) {
        self.state
            .freeze_first
            .store(first.max(1), Ordering::SeqCst);
        *self.state.freeze.lock().expect("proxy state") = Some((needle.to_vec(), freeze));
    }

    /// Whether a freeze is still armed (its request not yet seen).
    pub fn freeze_armed(&self) -> bool {
        self.state.freeze.lock().expect("proxy state").is_some()
    }

    /// Closes every connection open now.
    pub fn cut_all(&self) {
        self.state.generation.fetch_add(1, Ordering::SeqCst);
        self.state.cut.notify_waiters();
    }

    /// Makes every connection open now go silent, as a peer that froze or a network that
    /// drops everything would: nothing more is forwarded either way, and nothing is closed
    /// (until [`cut_all`](Self::cut_all) or the proxy's drop). New connections work.
    pub fn stall_all(&self) {
        self.state.stalled.fetch_add(1, Ordering::SeqCst);
        self.state.cut.notify_waiters();
    }

    /// How many connections were cut by [`cut_after`](Self::cut_after) (each once its request
    /// was answered by Redis).
    pub fn cuts(&self) -> usize {
        self.state.cuts.load(Ordering::SeqCst)
    }

    /// How many times the clients sent `needle` through the proxy, over all connections.
    pub fn sent_count(&self, needle: &[u8]) -> usize {
        let sent = self.state.sent.lock().expect("proxy state");
        sent.iter()
            .map(|bytes| bytes.windows(needle.len()).filter(|w| *w == needle).count())
            .sum()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut_all();
    }
}

/// The RESP bulk strings of a request as it goes on the wire, back to back: `$<len>\r\n<arg>\r\n`
/// for each argument. A needle for [`Proxy::cut_after`] that matches consecutive arguments.
pub fn resp_args(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Whether `buf` ends at the end of a complete RESP request (arrays of bulk strings, as clients
/// send them). Anything else it cannot read counts as complete.
fn complete(buf: &[u8]) -> bool {
    fn line(buf: &[u8], at: usize) -> Option<(i64, usize)> {
        let end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
        let n = std::str::from_utf8(&buf[at + 1..end]).ok()?.parse().ok()?;
        Some((n, end + 2))
    }
    let mut at = 0;
    while at < buf.len() {
        if buf[at] != b'*' {
            return true;
        }
        let Some((n, mut next)) = line(buf, at) else {
            return false;
        };
        for _ in 0..n.max(0) {
            if next >= buf.len() {
                return false;
            }
            if buf[next] != b'$' {
                return true;
            }
            let Some((len, data)) = line(buf, next) else {
                return false;
            };
            next = data + usize::try_from(len.max(0)).unwrap_or(0) + 2;
            if next > buf.len() {
                return false;
            }
        }
        at = next;
    }
    true
}

/// Forwards both ways until either side closes, a cut, or `cut_all`; then both connections
/// close. A stalled connection forwards nothing more and stays open until `cut_all`.
///
/// Both halves of both sockets live until this returns: dropping the half that writes to Redis
/// would send it a FIN, and Redis frees a client that closed its side without answering what
/// it had blocked on (a cut `XREADGROUP .. BLOCK` would never reply, nor the marker after it).
async fn pump(client: TcpStream, server: TcpStream, state: Arc<State>) {
    static MARKERS: AtomicUsize = AtomicUsize::new(0);
    let generation = state.generation.load(Ordering::SeqCst);
    let stall_generation = state.stalled.load(Ordering::SeqCst);
    let conn = {
        let mut sent = state.sent.lock().expect("proxy state");
        sent.push(Vec::new());
        sent.len() - 1
    };
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    // Set before a request that must lose its reply is forwarded: from then on nothing goes
    // to the client. `marker` is the reply that says Redis answered everything before it.
    let cutting = AtomicBool::new(false);
    // After this connection forwarded the request a freeze held: how many more of its replies
    // the others wait for.
    let thawing = AtomicUsize::new(0);
    let marker = format!("rs-proxy-cut-{}", MARKERS.fetch_add(1, Ordering::Relaxed));
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        // Bytes read but not yet forwarded (a command not complete yet).
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let n = client_rx.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return false;
            }
            pending.extend_from_slice(&buf[..n]);
            if !complete(&pending) {
                continue;
            }
            let chunk = std::mem::take(&mut pending);
            if let Some(length) = take_hit(&state.freeze, &chunk) {
                let thaw = Instant::now() + length;
                state.thawed.store(false, Ordering::SeqCst);
                *state.thaw.lock().expect("proxy state") = Some(thaw);
                tokio::time::sleep_until(tokio::time::Instant::from_std(thaw)).await;
                state.sent.lock().expect("proxy state")[conn].extend_from_slice(&chunk);
                thawing.store(state.freeze_first.load(Ordering::SeqCst), Ordering::SeqCst);
                if server_tx.write_all(&chunk).await.is_err() {
                    return false;
                }
                continue;
            }
            if thawing.load(Ordering::SeqCst) == 0 {
                state.thawed().await;
            }
            if let Some(length) = state.outage_hit(&chunk) {
                *state.down_until.lock().expect("proxy state") = Some(Instant::now() + length);
                state.generation.fetch_add(1, Ordering::SeqCst);
                state.cut.notify_waiters();
                return false;
            }
            state.sent.lock().expect("proxy state")[conn].extend_from_slice(&chunk);
            let hit = {
                let mut armed = state.armed.lock().expect("proxy state");
                let hit = armed
                    .as_ref()
                    .is_some_and(|needle| chunk.windows(needle.len()).any(|w| w == &needle[..]));
                if hit {
                    *armed = None;
                }
                hit
            };
            if hit {
                cutting.store(true, Ordering::SeqCst);
                let mut echo = b"*2\r\n".to_vec();
                echo.extend_from_slice(&resp_args(&[b"ECHO", marker.as_bytes()]));
                return server_tx.write_all(&chunk).await.is_ok()
                    && server_tx.write_all(&echo).await.is_ok();
            }
            if server_tx.write_all(&chunk).await.is_err() {
                return false;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        // What came from Redis since the cut began, searched for the marker.
        let mut thrown: Vec<u8> = Vec::new();
        loop {
            let n = server_rx.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            let left = thawing.load(Ordering::SeqCst);
            if left > 0 {
                thawing.store(left - 1, Ordering::SeqCst);
                if left == 1 {
                    state.thawed.store(true, Ordering::SeqCst);
                    state.thawing.notify_waiters();
                }
            }
            if !cutting.load(Ordering::SeqCst) {
                if client_tx.write_all(&buf[..n]).await.is_err() {
                    return;
                }
                continue;
            }
            thrown.extend_from_slice(&buf[..n]);
            if thrown.windows(marker.len()).any(|w| w == marker.as_bytes()) {
                return;
            }
        }
    };
    // Resolves once `cut_all` (or the proxy's drop) closed connections of this generation.
    let all_cut = async {
        loop {
            state.cut.notified().await;
            if state.generation.load(Ordering::SeqCst) != generation {
                return;
            }
        }
    };
    let stalled = async {
        loop {
            state.cut.notified().await;
            if state.stalled.load(Ordering::SeqCst) != stall_generation {
                return;
            }
        }
    };
    tokio::pin!(down, all_cut);
    // Everything closes when this returns: the client's side, then the server's.
    tokio::select! {
        hit = up => if hit {
            // The request reached Redis: wait for its reply (the marker's) and throw it away.
            // The cut counts however that ends: the client never hears a reply.
            let _ = tokio::time::timeout(REPLY_WAIT, &mut down).await;
            state.cuts.fetch_add(1, Ordering::SeqCst);
            state.cut.notify_waiters();
        },
        () = &mut down => {}
        () = &mut all_cut => {}
        // Silent: nothing is polled any more, both sides stay open.
        () = stalled => all_cut.await,
    }
}
