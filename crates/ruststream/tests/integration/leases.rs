//! Leases after a reconnect: a Redis outage longer than `min_idle` must not
//! redeliver the work of live workers. A reliable list (with recovery) and a reliable stream
//! each hold slow jobs in live handlers while Redis goes away for 2.5 s, 2.5 × `min_idle`, in
//! three ways: their own Redis (`appendfsync always`) is SIGKILLed and restarted, whatever each
//! connection was doing; or, through a proxy, the reader's next sweep, or its next blocking
//! read, is in flight when Redis becomes unreachable (the proxy holds it, closes every
//! connection and turns new ones away). Or Redis freezes for as long with the reader's next
//! sweep on its way, and at the thaw that sweep reaches Redis before the leases' renewals held
//! meanwhile (the proxy holds every request, then lets the sweep through first). Or the server
//! itself is frozen (SIGSTOP) for as long, whatever each connection was doing.
//! When the connections come back each reader renews its claims before it sweeps, and a sweep
//! sent before the outage never runs after it, so every job is handled once.

use crate::harness;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::proxy::{Proxy, resp_args};
use harness::stand::OwnRedis;
use harness::{bounded, unique, wait_until};
use ruststream::prelude::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Job {
    n: u32,
}

outgoing!(Job);

const MIN_IDLE: Duration = Duration::from_secs(1);
const OUTAGE: Duration = Duration::from_millis(2500);
/// How long each handler works: through the outage and well past it.
const WORK: Duration = Duration::from_secs(6);
const JOBS: u32 = 4;

/// Counts the starts of each job's handler; each works [`WORK`], then acks.
#[derive(Clone, Default)]
struct Slow(Arc<Mutex<HashMap<u32, u32>>>);

impl Slow {
    fn starts(&self) -> HashMap<u32, u32> {
        self.0.lock().expect("lock").clone()
    }
}

impl Handle<Job> for Slow {
    async fn handle(&self, job: &Job, _: &(), _: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        *self.0.lock().expect("lock").entry(job.n).or_default() += 1;
        tokio::time::sleep(WORK).await;
        Ok(())
    }
}

/// Entries claimed and not settled: the processing list's length, or the group's pending count.
async fn in_flight(r: &fred::prelude::Client, prefix: &str, stream: bool) -> Option<i64> {
    use fred::prelude::*;
    if stream {
        let reply: Value = r
            .custom(
                fred::cmd!("XPENDING"),
                vec![format!("{prefix}{{lease}}"), "g".into()],
            )
            .await
            .ok()?;
        match reply {
            Value::Array(a) => a.first().and_then(Value::as_i64),
            _ => None,
        }
    } else {
        let queued: i64 = r.llen(format!("{prefix}{{lease}}")).await.ok()?;
        let held: i64 = r.llen(format!("{prefix}{{lease}}.processing")).await.ok()?;
        Some(queued + held)
    }
}

/// How Redis goes away while every job is in its handler.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// SIGKILL, restarted after [`OUTAGE`].
    Kill,
    /// The reader's next sweep held in flight by the proxy, then Redis unreachable for
    /// [`OUTAGE`]. The sweep is the claim call recording claims (a list's `claims` argument),
    /// or `XPENDING .. IDLE` (a stream's).
    SweepInFlight,
    /// Likewise with the reader's next blocking read (`BLMOVE`, `XREAD .. BLOCK`), which fred
    /// sends again after the outage: the sweep after its reply must know of the outage.
    ReadInFlight,
    /// Every request held for [`OUTAGE`] from the reader's next sweep on (a list's claim call
    /// recording claims, a stream's `XPENDING .. IDLE` and its claim), then that sweep
    /// forwarded first: it reaches Redis past its deadline, with every lease aged by the freeze.
    SweepLate,
    /// The server frozen (SIGSTOP) for [`OUTAGE`], whatever each connection was doing; every
    /// lease ages by the freeze, and nothing reconnects.
    Freeze,
}

impl Fault {
    /// What the proxy holds: a request containing this.
    fn needle(self, stream: bool) -> Vec<u8> {
        let arg: &[u8] = match (self, stream) {
            (Self::SweepInFlight | Self::SweepLate, false) => b"claims",
            (Self::SweepInFlight | Self::SweepLate, true) => b"IDLE",
            (_, false) => b"BLMOVE",
            (_, true) => b"BLOCK",
        };
        resp_args(&[arg])
    }
}

async fn outage_run(stream: bool, fault: Fault) {
    let dir = std::env::temp_dir().join(unique("leases"));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let port = OwnRedis::free_port();
    let mut redis = OwnRedis::start(dir.clone(), port).await;
    let proxy = match fault {
        Fault::Kill | Fault::Freeze => None,
        _ => Some(Proxy::start(&redis.url()).await),
    };
    let url = proxy.as_ref().map_or_else(|| redis.url(), Proxy::url);
    let prefix = format!("{}:", unique("leases"));
    let slow = Slow::default();
    let broker = RedisBroker::standalone(&url).prefix(&prefix);
    let app = RustStream::new(AppInfo::new("leases", "0"))
        .shutdown_timeout(Duration::from_secs(10))
        .with_broker(broker.clone(), |b| {
            if stream {
                let source = RedisStream::new("{lease}")
                    .group("g")
                    .min_idle(MIN_IDLE)
                    .concurrency(8);
                b.include(ruststream::subscriber(source, slow.clone()).build());
            } else {
                let source = RedisList::new("{lease}")
                    .reliable()
                    .min_idle(MIN_IDLE)
                    .recovery_zset("{lease}.claims")
                    .concurrency(8);
                b.include(ruststream::subscriber(source, slow.clone()).build());
            }
        });
    let running = harness::start(app).await;
    let jobs: Vec<Job> = (0..JOBS).map(|n| Job { n }).collect();
    broker
        .publisher()
        .messages(&jobs)
        .to("{lease}")
        .publish()
        .await
        .expect("publish");
    wait_until(
        "every job is in a handler",
        Duration::from_secs(10),
        || async { slow.starts().len() == JOBS as usize },
    )
    .await;
    // The fault itself: Redis stays away longer than min_idle.
    let _back = match &proxy {
        None if fault == Fault::Freeze => {
            redis.freeze(OUTAGE).await;
            None
        }
        None => {
            redis.kill();
            tokio::time::sleep(OUTAGE).await;
            Some(OwnRedis::start(dir.clone(), port).await)
        }
        Some(proxy) if fault == Fault::SweepLate => {
            // A stream's sweep is `XPENDING`, then the claim of what it found: on this new
            // server its script's first `EVALSHA` gets `NOSCRIPT`, then `SCRIPT LOAD`, `EVALSHA`.
            proxy.freeze_on(&fault.needle(stream), OUTAGE, if stream { 4 } else { 1 });
            wait_until("the sweep is held", Duration::from_secs(10), || async {
                !proxy.freeze_armed()
            })
            .await;
            None
        }
        Some(proxy) => {
            proxy.outage_on(&fault.needle(stream), OUTAGE);
            wait_until("the request is held", Duration::from_secs(10), || async {
                !proxy.outage_armed()
            })
            .await;
            None
        }
    };
    // Everything settled: a redelivered job would still be in flight (it works WORK again).
    let r = harness::stand::node_client(&format!("127.0.0.1:{port}")).await;
    wait_until("every job is settled", Duration::from_secs(30), || async {
        in_flight(&r, &prefix, stream).await == Some(0)
    })
    .await;
    bounded("shutdown", Duration::from_secs(20), running.shutdown())
        .await
        .expect("the app stops");
    let starts = slow.starts();
    let what = if stream { "stream" } else { "list" };
    println!(
        "leases ({what}, {fault:?}): handler starts per job after a {OUTAGE:?} outage: {starts:?}"
    );
    assert!(
        starts.values().all(|s| *s == 1),
        "{what}: a live worker's job was redelivered after the outage: {starts:?}"
    );
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reliable_list_keeps_live_claims_through_an_outage_longer_than_min_idle() {
    outage_run(false, Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_keeps_live_claims_through_an_outage_longer_than_min_idle() {
    outage_run(true, Fault::Kill).await;
}

// The fault: fred sends the sweep held in flight again once Redis is back, before the reader knows
// of the outage, and it takes the live workers' claims. A sweep goes with `fail_fast`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reliable_list_sweep_in_flight_at_an_outage_does_not_run_after_it() {
    outage_run(false, Fault::SweepInFlight).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_sweep_in_flight_at_an_outage_does_not_run_after_it() {
    outage_run(true, Fault::SweepInFlight).await;
}

// The fault: the sweep after the read's reply knows of the outage only if fred's reconnect event
// has reached its listener's task by then. The reader reads the reconnect events itself before it
// sweeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reliable_list_read_in_flight_at_an_outage_renews_before_the_next_sweep() {
    outage_run(false, Fault::ReadInFlight).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_read_in_flight_at_an_outage_renews_before_the_next_sweep() {
    outage_run(true, Fault::ReadInFlight).await;
}

// The fault: a sweep that runs when it reaches Redis, however late, takes the live workers' claims,
// their renewals held behind it. The sweep's deadline in the server's clock stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reliable_list_sweep_that_reaches_redis_past_its_deadline_sweeps_nothing() {
    outage_run(false, Fault::SweepLate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_sweep_that_reaches_redis_past_its_deadline_claims_nothing() {
    outage_run(true, Fault::SweepLate).await;
}

// A frozen server, the fault `SweepLate` stages: the renewal queued during the freeze runs at the
// thaw before the reader's next sweep, which waits for its read's reply. A renewal sent as
// `EVALSHA` would get `NOSCRIPT` on a fresh server and take two more round trips, between which
// that sweep runs (about one run in ten;
// `a_renewal_is_one_command_on_a_server_without_its_script`).
// sweep ran (about one run in ten; `a_renewal_is_one_command_on_a_server_without_its_script`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reliable_list_keeps_live_claims_through_a_freeze_longer_than_min_idle() {
    outage_run(false, Fault::Freeze).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_keeps_live_claims_through_a_freeze_longer_than_min_idle() {
    outage_run(true, Fault::Freeze).await;
}

/// The `cmdstat_<name>` entries of `INFO commandstats`: command → calls.
pub(crate) async fn command_calls(client: &fred::prelude::Client) -> HashMap<String, u64> {
    use fred::prelude::*;
    let info: String = client
        .custom(fred::cmd!("INFO"), vec!["commandstats"])
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

// The fault: `EVALSHA`, then on `NOSCRIPT` `SCRIPT LOAD` and `EVALSHA` again, is three round trips
// for the renewal that must reach Redis before a sweep (see the freeze test above). The renewal is
// one `EVAL`.
#[tokio::test]
async fn a_renewal_is_one_command_on_a_server_without_its_script() {
    use fred::prelude::*;
    let dir = std::env::temp_dir().join(unique("leases-eval"));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let redis = OwnRedis::start(dir, OwnRedis::free_port()).await;
    let client = harness::stand::node_client(&format!("127.0.0.1:{}", redis.port)).await;
    let zset = "{q}.claims";
    let _: i64 = client
        .zadd(zset, None, None, false, false, (1.0, "r1:0.1.0"))
        .await
        .expect("ZADD");
    let _: () = client.script_flush(false).await.expect("SCRIPT FLUSH");
    let _: () = client
        .custom(fred::cmd!("CONFIG"), vec!["RESETSTAT"])
        .await
        .expect("CONFIG RESETSTAT");
    let members = [bytes::Bytes::from_static(b"r1:0.1.0")];
    let lease = ruststream::redis::testing::Lease {
        zset,
        ttl_ms: 0,
        members: &members,
    };
    let moved = ruststream::redis::testing::Call::call(&lease, &client)
        .await
        .expect("the renewal");
    assert_eq!(moved, 1, "the member's score moved");
    let calls = command_calls(&client).await;
    let scripts: Vec<(&String, &u64)> = calls
        .iter()
        .filter(|(name, _)| name.starts_with("eval") || name.starts_with("script"))
        .collect();
    assert_eq!(scripts, vec![(&"eval".to_owned(), &1)], "{calls:?}");
}
