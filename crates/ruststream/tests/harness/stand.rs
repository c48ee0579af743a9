//! Servers and raw clients outside a test's [`Env`](super::Env): connections to one node, and
//! servers of a test's own for fault tests that kill or restart them (and so must not disturb
//! the shared stand): [`Stand`] (sets started by scripts/stand's functions), [`OwnRedis`] (one
//! persistent redis-server), [`server_pid`] and [`kill9`]; ACL users ([`acl_user`]).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;

use super::{bounded, wait_until};

/// A connected fred client for `config`, within 10 s.
pub async fn connect(config: Config) -> Client {
    let client = Builder::from_config(config).build().expect("a fred client");
    bounded(
        "connecting to Redis",
        Duration::from_secs(10),
        client.init(),
    )
    .await
    .expect("connected");
    client
}

/// A fred configuration for the cluster of these node URLs.
pub fn cluster_config(urls: &[String]) -> Config {
    let mut config = Config::from_url(&urls[0]).expect("a valid cluster URL");
    let hosts = urls
        .iter()
        .flat_map(|u| {
            Config::from_url(u)
                .expect("a valid cluster URL")
                .server
                .hosts()
        })
        .map(|s| (s.host.to_string(), s.port))
        .collect();
    config.server = ServerConfig::new_clustered(hosts);
    config
}

/// A client on one node of the stand (no cluster redirects): `host:port` or a URL.
pub async fn node_client(addr: &str) -> Client {
    let url = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("redis://{addr}")
    };
    connect(Config::from_url(&url).expect("a valid URL")).await
}

/// Servers of the test's own, started by `scripts/stand` functions in a bash process that stops
/// them (its EXIT trap) when this guard drops: stdin closes, the shell's `read` ends.
pub struct Stand {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The `RUSTSTREAM_*` variables the functions exported.
    pub vars: HashMap<String, String>,
}

impl Stand {
    /// Runs `calls` (e.g. `stand_cluster --cluster-node-timeout 1000`) after sourcing
    /// scripts/stand; returns once they have finished (the servers are ready).
    pub fn start(calls: &str) -> Self {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/stand");
        let body = format!(
            ". \"$1\"; {calls}; env | grep '^RUSTSTREAM_'; echo STAND-READY; read -r _ || true"
        );
        let mut child = Command::new("bash")
            // `$0` is not the script, so sourcing it only defines the functions.
            .args(["-c", &body, "stand-helper", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("bash runs scripts/stand");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let mut vars = HashMap::new();
        let mut ready = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line == "STAND-READY" {
                ready = true;
                break;
            }
            if let Some((k, v)) = line.split_once('=') {
                vars.insert(k.to_owned(), v.to_owned());
            }
        }
        let mut stand = Self { child, stdin, vars };
        assert!(
            ready,
            "scripts/stand failed to run `{calls}` (its errors are above)"
        );
        stand.vars.retain(|k, _| k.starts_with("RUSTSTREAM_"));
        stand
    }

    /// An exported variable.
    pub fn var(&self, name: &str) -> String {
        self.vars
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("scripts/stand did not export {name}"))
    }

    /// The node URLs of the cluster `stand_cluster` started.
    pub fn cluster_urls(&self) -> Vec<String> {
        self.var("RUSTSTREAM_CLUSTER_URLS")
            .split(',')
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Stand {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SIGKILL would skip the trap that stops the servers: ask with SIGTERM first.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// The pid of the redis-server at `addr` (`INFO server`'s `process_id`).
pub async fn server_pid(client: &Client) -> u32 {
    let info: String = client
        .custom(fred::cmd!("INFO"), vec!["server"])
        .await
        .expect("INFO server");
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("process_id in INFO server")
}

/// Sends SIGKILL to `pid`.
pub fn kill9(pid: u32) {
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -KILL {pid} failed");
}

/// A redis-server of the test's own, persistent (`appendfsync always`), on a fixed port.
pub struct OwnRedis {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its data directory (removed on drop).
    pub dir: PathBuf,
}

impl OwnRedis {
    /// A port nothing listens on.
    pub fn free_port() -> u16 {
        loop {
            let port = 15000 + fastrand::u16(..7000);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
                && std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
            {
                return port;
            }
        }
    }

    /// Starts redis-server on `port` with its data in `dir`; returns once it answers `PING`.
    pub async fn start(dir: PathBuf, port: u16) -> Self {
        let log = dir.join("redis.log");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--dir",
                dir.to_str().unwrap(),
                "--logfile",
                log.to_str().unwrap(),
            ])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server runs (scripts/stand installs it)");
        let mut me = Self {
            child: Some(child),
            port,
            dir,
        };
        let url = me.url();
        let exited = me.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
        assert!(
            exited.is_none(),
            "redis-server exited: {exited:?}, see {log:?}"
        );
        wait_until(
            "the server answers PING",
            Duration::from_secs(20),
            || async {
                let Ok(c) = Builder::from_config(Config::from_url(&url).unwrap()).build() else {
                    return false;
                };
                let ok = tokio::time::timeout(Duration::from_secs(1), c.init()).await;
                let pong = matches!(ok, Ok(Ok(_))) && c.ping::<String>(None).await.is_ok();
                let _ = c.quit().await;
                pong
            },
        )
        .await;
        me
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Freezes the server (SIGSTOP) for `length`, then lets it go on (SIGCONT): what a VM
    /// pause or a long stall looks like to its clients, whose connections stay open.
    pub async fn freeze(&self, length: Duration) {
        let Some(pid) = self.child.as_ref().map(Child::id) else {
            return;
        };
        let signal = |sig: &str| {
            let status = Command::new("kill")
                .args([sig, &pid.to_string()])
                .status()
                .expect("kill runs");
            assert!(status.success(), "kill {sig} {pid} failed");
        };
        signal("-STOP");
        tokio::time::sleep(length).await;
        signal("-CONT");
    }

    /// SIGKILL, then waits for the process to end.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An ACL user on the stand's server that may touch only keys and channels under `prefix`.
pub async fn acl_user(admin: &Client, user: &str, password: &str, prefix: &str) {
    let _: Value = admin
        .custom(
            fred::cmd!("ACL"),
            vec![
                "SETUSER".to_owned(),
                user.to_owned(),
                "reset".to_owned(),
                "on".to_owned(),
                format!(">{password}"),
                format!("~{prefix}*"),
                format!("&{prefix}*"),
                "+@all".to_owned(),
            ],
        )
        .await
        .expect("ACL SETUSER");
}
