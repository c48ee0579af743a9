//! What the parent and the child share: the message, scenarios and their tuning, and readings
//! from `/proc` (the id tracker and its percentiles are `tracker.rs`).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The benchmark message: `{id, body}` as JSON, the body 100 characters.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Msg {
    /// Dense ids `0..n`, so a tracker is a plain array.
    pub id: u64,
    /// 100 characters; the first 20 are a wall-clock stamp in ns when a scenario needs one.
    pub body: String,
}

ruststream::outgoing!(Msg);

/// A body with no stamp: 20 zeros, then 80 `x`.
const PLAIN_BODY: &str = concat!(
    "00000000000000000000",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
);

impl Msg {
    /// A message whose body carries `stamp_ns` (0: none) in its first 20 characters.
    pub fn new(id: u64, stamp_ns: u64) -> Self {
        let body = if stamp_ns == 0 {
            PLAIN_BODY.to_owned()
        } else {
            let mut body = format!("{stamp_ns:020}");
            body.push_str(&PLAIN_BODY[body.len()..]);
            body
        };
        Self { id, body }
    }

    /// The wall-clock ns stamped at the start of the body, if it has one.
    pub fn stamp(&self) -> Option<u64> {
        self.body.get(..20).and_then(|s| s.parse().ok())
    }
}

/// Wall-clock ns since the epoch (the clock both processes share).
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The scenarios, in the order `all` runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Publishing alone, `messages(&chunk)` per call.
    PublishBatch,
    /// Publishing alone, 64 tasks each publishing one message at a time.
    PublishSingle,
    /// Simple list (`RPOP`).
    Simple,
    /// Reliable list (claim script, settle script).
    Reliable,
    /// Reliable list with a recovery set.
    Recovery,
    /// Reliable list drained by a batch handler, 100 messages a batch.
    Batch,
    /// Stream with a consumer group.
    Stream,
    /// N entries due at once, moved from the delayed set.
    Delayed,
    /// Pub/Sub: one `RedisChannel` subscriber while the parent publishes; at most once.
    Pubsub,
    /// A steady rate on a reliable list, end-to-end latency.
    Latency,
    /// Reliable list with a rate limit that never holds back: the limiter's cost.
    RateLimit,
    /// Reliable list with a per-key rate limit that never holds back.
    RateLimitKey,
    /// `Reliable` on a queue with priority levels, messages spread over them.
    Priorities,
    /// `Reliable` with a concurrency cap across workers that never holds back: the cap's cost.
    Cap,
    /// `Reliable` with a deadline on every handler call that never passes: the deadline's cost.
    Deadline,
    /// `Reliable` read by a handler of three durable steps: what recording steps costs.
    Steps,
}

impl Scenario {
    pub const ALL: [Self; 16] = [
        Self::PublishBatch,
        Self::PublishSingle,
        Self::Simple,
        Self::Reliable,
        Self::Recovery,
        Self::Batch,
        Self::Stream,
        Self::Delayed,
        Self::Pubsub,
        Self::Latency,
        Self::RateLimit,
        Self::RateLimitKey,
        Self::Priorities,
        Self::Cap,
        Self::Deadline,
        Self::Steps,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::PublishBatch => "publish-batch",
            Self::PublishSingle => "publish-single",
            Self::Simple => "simple",
            Self::Reliable => "reliable",
            Self::Recovery => "recovery",
            Self::Batch => "batch",
            Self::Stream => "stream",
            Self::Delayed => "delayed",
            Self::Pubsub => "pubsub",
            Self::Latency => "latency",
            Self::RateLimit => "rate-limit",
            Self::RateLimitKey => "rate-limit-key",
            Self::Priorities => "priorities",
            Self::Cap => "cap",
            Self::Deadline => "deadline",
            Self::Steps => "steps",
        }
    }

    /// Scenarios selected by a `--scenario` value (`publish` is both publish forms).
    pub fn select(name: &str) -> Option<Vec<Self>> {
        match name {
            "all" => Some(Self::ALL.to_vec()),
            "publish" => Some(vec![Self::PublishBatch, Self::PublishSingle]),
            _ => Self::ALL
                .iter()
                .copied()
                .find(|s| s.name() == name)
                .map(|s| vec![s]),
        }
    }

    pub fn is_publish(self) -> bool {
        matches!(self, Self::PublishBatch | Self::PublishSingle)
    }
}

impl FromStr for Scenario {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .copied()
            .find(|x| x.name() == s)
            .ok_or_else(|| format!("unknown scenario `{s}`"))
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the queue lives and its shape: one server or a cluster, partitioned or not.
#[derive(Debug, Clone)]
pub struct Target {
    /// The standalone server (unused on a cluster).
    pub redis: String,
    /// The cluster's node URLs (empty: standalone).
    pub cluster: Vec<String>,
    /// `.partitions(n)` on the queue.
    pub partitions: Option<u16>,
}

impl Target {
    /// The queue's key: `q` on one server; on a cluster `{bench}` (a reliable queue's keys share
    /// its slot), or `bench` partitioned (the partitions are `{bench:0}`..).
    pub fn key(&self) -> &'static str {
        match (self.partitions, self.cluster.is_empty()) {
            (Some(_), _) => "bench",
            (None, true) => crate::KEY,
            (None, false) => "{bench}",
        }
    }

    /// The keys the queue's entries go to (unprefixed): its partitions, or the key itself.
    pub fn queue_keys(&self) -> Vec<String> {
        match self.partitions {
            Some(n) => (0..n).map(|i| format!("{{{}:{i}}}", self.key())).collect(),
            None => vec![self.key().to_owned()],
        }
    }
}

/// Subscription defaults, or the tuned settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Config {
    Default,
    Tuned,
}

impl Config {
    pub fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Tuned => "tuned",
        }
    }
}

/// What a configuration sets, for one scenario.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// `.concurrency(n)` on the source (`None`: the default, 128).
    pub concurrency: Option<usize>,
    /// `RedisBroker::pool_size` (`None`: the default, 2).
    pub pool_size: Option<usize>,
    /// Messages per `messages(&chunk)` call.
    pub chunk: usize,
    /// Publish calls in flight at once.
    pub in_flight: usize,
    /// `RedisChannel::buffer` (`None`: the default) for the pubsub scenario.
    pub buffer: Option<usize>,
    /// How many times the app includes the subscription: each is a reader with a connection of
    /// its own (for a stream, another consumer of the group).
    pub readers: usize,
}

/// Claims per read when the source keeps its default concurrency.
pub const DEFAULT_CONCURRENCY: usize = 128;

impl Tuning {
    /// The settings of `config` for `scenario`. `RSB_TUNED_CONCURRENCY` overrides the tuned
    /// concurrency, `RSB_TUNED_READERS` the tuned number of subscriptions (`RSB_STREAM_READERS`
    /// sets a stream's `.readers(n)` in both configurations), `RSB_TUNED_BUFFER`
    /// sets the tuned pubsub subscription's buffer (to explore; the child inherits them).
    pub fn of(scenario: Scenario, config: Config) -> Self {
        let mut t = Self::table(scenario, config);
        if config == Config::Tuned
            && let Some(c) = env_usize("RSB_TUNED_CONCURRENCY")
        {
            t.concurrency = Some(c);
        }
        if config == Config::Tuned
            && let Some(r) = env_usize("RSB_TUNED_READERS")
        {
            t.readers = r.max(1);
        }
        t
    }

    fn table(scenario: Scenario, config: Config) -> Self {
        let default = Self {
            concurrency: None,
            pool_size: None,
            chunk: 1000,
            in_flight: 1,
            buffer: None,
            readers: 1,
        };
        match config {
            Config::Default => default,
            Config::Tuned => match scenario {
                // Two chunks in flight overlap one round trip with the next chunk's encoding.
                Scenario::PublishBatch => Self {
                    pool_size: env_usize("RSB_TUNED_POOL"),
                    in_flight: env_usize("RSB_TUNED_IN_FLIGHT").unwrap_or(2),
                    ..default
                },
                // One connection pipelines the 64 publishers' commands best.
                Scenario::PublishSingle => Self {
                    pool_size: env_usize("RSB_TUNED_POOL").or(Some(1)),
                    ..default
                },
                Scenario::Simple => Self {
                    concurrency: Some(512),
                    in_flight: 2,
                    ..default
                },
                Scenario::Latency => Self {
                    concurrency: Some(256),
                    ..default
                },
                Scenario::Pubsub => Self {
                    concurrency: Some(256),
                    in_flight: 2,
                    buffer: env_usize("RSB_TUNED_BUFFER"),
                    ..default
                },
                // One reader has one `XREADGROUP` at a time, and decoding its replies bounds it
                // (docs/benchmarks.md): a subscription at 512 reads with two readers (the
                // default from `TWO_READERS_FROM`).
                Scenario::Stream => Self {
                    concurrency: Some(512),
                    in_flight: 2,
                    ..default
                },
                // Reliable, recovery, batch, delayed: 512 measured best for reliable (256 and
                // 1024 slower).
                _ => Self {
                    concurrency: Some(512),
                    in_flight: 2,
                    ..default
                },
            },
        }
    }

    /// Claims per read, as the subscription will make them.
    pub fn batch(&self) -> usize {
        self.concurrency.unwrap_or(DEFAULT_CONCURRENCY)
    }

    /// What this tuning sets, for the RESULT line (`-`: nothing).
    pub fn describe(&self, scenario: Scenario) -> String {
        let mut parts = Vec::new();
        if let Some(c) = self.concurrency {
            parts.push(format!("concurrency:{c}"));
        }
        if let Some(p) = self.pool_size {
            parts.push(format!("pool_size:{p}"));
        }
        if scenario != Scenario::PublishSingle && self.in_flight > 1 {
            parts.push(format!("publish_in_flight:{}", self.in_flight));
        }
        if let Some(b) = self.buffer {
            parts.push(format!("buffer:{b}"));
        }
        if self.readers > 1 {
            parts.push(format!("subscriptions:{}", self.readers));
        }
        if scenario == Scenario::Stream {
            let s = ruststream::RedisStream::new("s").concurrency(self.batch());
            let s = match env_usize("RSB_STREAM_READERS") {
                Some(n) => s.readers(n),
                None => s,
            };
            parts.push(format!("readers:{}", s.reader_count()));
        }
        if parts.is_empty() {
            "-".to_owned()
        } else {
            parts.join(",")
        }
    }
}

pub fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Readings from `/proc`.
pub mod procfs {
    use std::fs;

    /// A `kB` field of `/proc/<pid>/status` (`VmHWM`, `VmRSS`), in kB.
    pub fn status_kb(pid: &str, field: &str) -> Option<u64> {
        let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    }

    /// CPU time all live threads of `pid` have run, and have waited on a run queue for a CPU,
    /// in ns (`/proc/<pid>/task/*/schedstat`).
    pub fn cpu_ns(pid: &str) -> Option<(u64, u64)> {
        let mut total = (0, 0);
        for task in fs::read_dir(format!("/proc/{pid}/task")).ok()? {
            let path = task.ok()?.path().join("schedstat");
            if let Ok(s) = fs::read_to_string(path) {
                let mut f = s.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
                total.0 += f.next().unwrap_or(0);
                total.1 += f.next().unwrap_or(0);
            }
        }
        Some(total)
    }

    /// Whether `pid` is a running `redis-server`.
    pub fn is_redis(pid: u32) -> bool {
        fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim_end().starts_with("redis-server"))
    }
}

/// CPU use of this process and of the Redis server over a window, as % of one core: time run,
/// and time spent runnable but waiting for a CPU (other processes on the machine).
pub struct CpuWindow {
    t0: Instant,
    me0: (u64, u64),
    redis: Option<(String, (u64, u64))>,
}

/// `(run %, wait %)` of one core.
pub type Usage = (f64, f64);

impl CpuWindow {
    pub fn start(redis_pid: Option<u32>) -> Self {
        let redis = redis_pid.and_then(|p| {
            let p = p.to_string();
            procfs::cpu_ns(&p).map(|c| (p, c))
        });
        Self {
            t0: Instant::now(),
            me0: procfs::cpu_ns("self").unwrap_or_default(),
            redis,
        }
    }

    /// This process's and Redis's usage since `start`.
    pub fn stop(&self) -> (Usage, Option<Usage>) {
        #[allow(clippy::cast_precision_loss)]
        let wall = self.t0.elapsed().as_nanos().max(1) as f64;
        #[allow(clippy::cast_precision_loss)]
        let pct = |a: (u64, u64), b: (u64, u64)| {
            (
                b.0.saturating_sub(a.0) as f64 * 100.0 / wall,
                b.1.saturating_sub(a.1) as f64 * 100.0 / wall,
            )
        };
        let me = pct(self.me0, procfs::cpu_ns("self").unwrap_or_default());
        let redis = self
            .redis
            .as_ref()
            .and_then(|(p, c0)| procfs::cpu_ns(p).map(|c1| pct(*c0, c1)));
        (me, redis)
    }
}

/// `run=..% wait=..%` fields of a usage, under `name`.
pub fn usage_fields(name: &str, u: Option<Usage>) -> String {
    match u {
        Some((run, wait)) => format!("{name}_cpu={run:.0} {name}_wait={wait:.0}"),
        None => format!("{name}_cpu=- {name}_wait=-"),
    }
}

/// A rate in messages per second.
pub fn per_s(n: u64, elapsed: Duration) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let n = n as f64;
    n / elapsed.as_secs_f64().max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_100_chars_and_carries_the_stamp() {
        let m = Msg::new(7, 1_234_567_890_123);
        assert_eq!(m.body.len(), 100);
        assert_eq!(m.stamp(), Some(1_234_567_890_123));
        assert_eq!(Msg::new(8, 0).body.len(), 100);
    }

    #[test]
    fn a_cluster_queue_key_is_tagged_and_partitions_tag_themselves() {
        let t = |cluster: bool, partitions| Target {
            redis: String::new(),
            cluster: if cluster {
                vec!["redis://a:1".into()]
            } else {
                vec![]
            },
            partitions,
        };
        assert_eq!(t(false, None).queue_keys(), ["q"]);
        assert_eq!(t(true, None).queue_keys(), ["{bench}"]);
        assert_eq!(t(true, Some(2)).key(), "bench");
        assert_eq!(t(true, Some(2)).queue_keys(), ["{bench:0}", "{bench:1}"]);
    }

    #[test]
    fn scenario_names_round_trip() {
        for s in Scenario::ALL {
            assert_eq!(s.name().parse::<Scenario>(), Ok(s));
        }
        assert_eq!(Scenario::select("publish").map(|v| v.len()), Some(2));
        assert!(Scenario::select("nope").is_none());
    }
}
