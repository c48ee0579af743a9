//! Nothing stays stuck when a worker dies, a reply is lost or a recovery set expires, and a live
//! worker keeps what it holds: stream consumers killed with SIGKILL (child processes: this test
//! binary run again as `reliability::recovery::stream_worker_process`), claim and settle replies
//! thrown away by the proxy, an expired recovery set, handlers slower than `min_idle`, and a raw
//! value that starts like a frame.

use std::future::Future;

use std::sync::Arc;
use std::time::Duration;

use fred::bytes::Bytes;
use fred::prelude::*;
use ruststream::prelude::*;
use ruststream::redis::frame::{Frame, MAGIC};

use super::common::*;
use crate::harness::process::{WorkerProcess, test_name};
use crate::harness::proxy::Proxy;
use crate::harness::{Env, on, start, stop, wait_until};

on!(
    [standalone]
    a_killed_consumers_stream_entries_are_claimed_by_another_after_min_idle,
    a_restarted_consumer_first_takes_back_its_own_pending_entries,
    a_stream_entry_that_kills_every_consumer_ends_in_the_dead_letters,
    a_claim_whose_reply_is_lost_comes_back_after_min_idle,
    without_recovery_a_lost_claim_stays_and_the_app_says_so_at_startup,
    a_settle_sent_twice_without_recovery_runs_once,
    a_settle_sent_twice_on_a_default_reliable_list_runs_once,
    identical_values_of_a_claim_sent_twice_are_two_claims,
    a_stream_read_whose_reply_is_lost_comes_back_after_min_idle,
    a_cancel_whose_reply_is_lost_is_resent_and_answers_the_same,
);

// Standalone only: the scripts run with EVAL on no key.
on!([standalone] lua_and_rust_read_the_same_values_as_frames);

on!(
    [standalone, cluster]
    entries_outliving_an_expired_recovery_set_go_back_to_the_queue,
    a_handler_slower_than_min_idle_is_handled_once,
    a_stream_handler_slower_than_min_idle_is_handled_once,
    a_raw_value_that_starts_like_a_frame_keeps_its_bytes_and_reaches_max_attempts,
);

const Q: &str = "{jobs}";
const S: &str = "{s}";

fn k(suffix: &str) -> String {
    format!("{Q}{suffix}")
}

// ---------------------------------------------------------------------------------------------
// Stream consumers killed mid-handler.

/// The worker: a stream consumer of group `g` on [`S`] named `RELIABILITY_CONSUMER`, whose
/// handler records `<n>:<attempt>:<consumer>` on `<prefix>{s}.started` and never finishes.
#[test]
#[ignore = "the worker process of the stream recovery tests, which run it; does nothing on its own"]
fn stream_worker_process() {
    let Ok(url) = std::env::var("RELIABILITY_WORKER") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let prefix = var("RELIABILITY_PREFIX");
    let consumer = var("RELIABILITY_CONSUMER");
    let min_idle = Duration::from_millis(var("RELIABILITY_MIN_IDLE_MS").parse().unwrap());
    let max_attempts: u32 = var("RELIABILITY_MAX_ATTEMPTS").parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let raw = Builder::from_config(Config::from_url(&url).unwrap())
            .build()
            .unwrap();
        raw.init().await.unwrap();
        let handler = Starter {
            client: raw,
            key: format!("{prefix}{S}.started"),
            consumer: consumer.clone(),
        };
        let source = RedisStream::new(S)
            .group("g")
            .consumer(consumer)
            .min_idle(min_idle)
            .max_attempts(max_attempts)
            .block(Duration::from_millis(200));
        let _running = RustStream::new(AppInfo::new("stream-worker", "0"))
            .with_broker(RedisBroker::standalone(url).prefix(&prefix), |b| {
                b.include(subscriber(source, handler).build());
            })
            .start()
            .await
            .expect("the worker starts");
        // Until the test kills it.
        std::future::pending::<()>().await;
    });
}

struct Starter {
    client: Client,
    key: String,
    consumer: String,
}

impl Handle<Job> for Starter {
    fn handle(
        &self,
        job: &Job,
        _: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        let record = format!("{}:{}:{}", job.n, ctx.attempt(), self.consumer);
        async move {
            let _: Result<i64, _> = self.client.rpush(&self.key, record).await;
            std::future::pending().await
        }
    }
}

/// A stream worker process of `recovery::stream_worker_process`.
fn stream_worker(env: &Env, consumer: &str, min_idle_ms: u64, max_attempts: u32) -> WorkerProcess {
    WorkerProcess::spawn(
        &test_name(module_path!(), "stream_worker_process"),
        &[
            (
                "RELIABILITY_WORKER",
                env.url().expect("standalone").to_owned(),
            ),
            ("RELIABILITY_PREFIX", env.prefix.clone()),
            ("RELIABILITY_CONSUMER", consumer.to_owned()),
            ("RELIABILITY_MIN_IDLE_MS", min_idle_ms.to_string()),
            ("RELIABILITY_MAX_ATTEMPTS", max_attempts.to_string()),
        ],
        None,
    )
}

/// What the worker processes recorded as started, in order.
async fn started(env: &Env) -> Vec<String> {
    env.client
        .lrange(env.key(&format!("{S}.started")), 0, -1)
        .await
        .unwrap()
}

/// Waits until the worker processes have started `records` (child processes take a while).
async fn until_started(env: &Env, records: &[&str]) {
    wait_until(
        "the worker process started its handlers",
        Duration::from_secs(30),
        || async {
            let s = started(env).await;
            records.iter().all(|r| s.iter().any(|x| x == r))
        },
    )
    .await;
}

async fn publish_stream(env: &Env, jobs: &[Job]) {
    let broker = env.broker_with(|b| b.route(S, stream::Publish::new()));
    broker.connect().await.unwrap();
    broker
        .publisher()
        .messages(jobs)
        .to(S)
        .publish()
        .await
        .unwrap();
}

/// A consumer of group `g` in this process.
fn consumer(name: &str, min_idle: Duration) -> RedisStream {
    RedisStream::new(S)
        .group("g")
        .consumer(name)
        .min_idle(min_idle)
        .block(Duration::from_millis(200))
}

// Before: streams never reclaimed pending entries: a consumer killed mid-handler left them
// pending on its name for ever, and no other consumer ever handled them.
async fn a_killed_consumers_stream_entries_are_claimed_by_another_after_min_idle(env: &Env) {
    publish_stream(env, &jobs(3)).await;
    let mut victim = stream_worker(env, "victim", 1000, 10);
    until_started(env, &["0:1:victim", "1:1:victim", "2:1:victim"]).await;
    victim.kill();
    // On the victim's two readers (`victim`, `victim-2`: two by default at concurrency 128).
    let pending = pending_entries(env, S, "g").await;
    assert!(
        pending.len() == 3
            && pending
                .iter()
                .all(|(c, n)| (c == "victim" || c == "victim-2") && *n == 1),
        "left pending: {pending:?}"
    );
    let rec = Rec::acking();
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(subscriber(consumer("rescuer", Duration::from_secs(1)), r).build());
    })
    .await;
    eventually("claimed and handled by the other consumer", async || {
        rec.count() == 3 && pending_count(env, S, "g").await == 0
    })
    .await;
    assert_eq!(
        rec.sorted(),
        seen(&[(0, 2), (1, 2), (2, 2)]),
        "a claimed entry counts the delivery it had"
    );
    assert_eq!(env.llen(&format!("{S}.dead")).await, 0);
    stop(app).await;
}

// Before: a consumer restarted under its old name (`.consumer(name)`) read only new entries:
// those it held when it was killed stayed pending for ever.
async fn a_restarted_consumer_first_takes_back_its_own_pending_entries(env: &Env) {
    publish_stream(env, &jobs(2)).await;
    let mut first = stream_worker(env, "w1", 60_000, 10);
    until_started(env, &["0:1:w1", "1:1:w1"]).await;
    first.kill();
    let rec = Rec::acking();
    let r = rec.clone();
    // min_idle of a minute: no sweep can take them within this test; only the restart does.
    let app = worker(env, |b| {
        b.include(subscriber(consumer("w1", Duration::from_secs(60)), r).build());
    })
    .await;
    eventually("taken back at once and handled", async || {
        rec.count() == 2 && pending_count(env, S, "g").await == 0
    })
    .await;
    assert_eq!(rec.sorted(), seen(&[(0, 2), (1, 2)]));
    stop(app).await;
}

// Before: an entry whose handler killed its consumer every time stayed pending for ever: it
// never reached max_attempts nor the dead letters.
async fn a_stream_entry_that_kills_every_consumer_ends_in_the_dead_letters(env: &Env) {
    publish_stream(env, &[Job { n: 0 }]).await;
    let mut a = stream_worker(env, "a", 500, 2);
    until_started(env, &["0:1:a"]).await;
    a.kill();
    let mut b = stream_worker(env, "b", 500, 2);
    until_started(env, &["0:2:b"]).await;
    b.kill();
    let rec = Rec::acking();
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(subscriber(consumer("c", Duration::from_millis(500)).max_attempts(2), r).build());
    })
    .await;
    eventually("dead-lettered with max-attempts", async || {
        env.llen(&format!("{S}.dead")).await == 1 && pending_count(env, S, "g").await == 0
    })
    .await;
    assert_eq!(reasons(env, &format!("{S}.dead")).await, ["max-attempts"]);
    assert_eq!(rec.count(), 0, "not run a third time");
    assert_eq!(started(env).await, ["0:1:a", "0:2:b"]);
    stop(app).await;
}

// ---------------------------------------------------------------------------------------------
// Replies lost between Redis and the worker (the proxy).

/// A broker through `proxy` with the test's prefix.
fn via(proxy: &Proxy, env: &Env) -> RedisBroker {
    RedisBroker::standalone(proxy.url()).prefix(&env.prefix)
}

// Before: a reliable list had no recovery set unless asked for one: when the connection dropped
// after claim.lua ran but before its reply arrived, the claimed entries stayed in K.processing
// for ever.
async fn a_claim_whose_reply_is_lost_comes_back_after_min_idle(env: &Env) {
    load_list_scripts(env).await;
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    publish(env, Q, &jobs(6)).await;
    // claim.lua with recovery: five keys (queue, processing, claims, pause, cancel record),
    // the queue first.
    proxy.cut_after(&script_call(5, &env.key(Q)));
    let rec = Rec::acking();
    let r = rec.clone();
    // One handler at a time: each claim takes exactly one entry.
    let source = RedisList::new(Q)
        .reliable()
        .min_idle(Duration::from_millis(500))
        .concurrency(1)
        .block(Duration::from_millis(200));
    let app = start(app_on(via(&proxy, env), Duration::from_millis(100), |b| {
        b.include(subscriber(source, r).build());
    }))
    .await;
    eventually("every job handled, nothing left", async || {
        rec.distinct() == 6 && env.keys().await.is_empty()
    })
    .await;
    assert_eq!(proxy.cuts(), 1, "a claim's reply was lost");
    assert_eq!(rec.count(), 6, "each handled once");
    let recovered = rec.seen().iter().filter(|s| s.attempt == 2).count();
    assert_eq!(
        recovered,
        1,
        "the entry of the lost claim came back with attempt 2: {:?}",
        rec.seen()
    );
    stop(app).await;
}

// Before: streams never reclaimed pending entries: entries an XREADGROUP delivered whose reply
// was lost (the connection dropped) stayed pending on a consumer that never knew it had them.
async fn a_stream_read_whose_reply_is_lost_comes_back_after_min_idle(env: &Env) {
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    publish_stream(env, &jobs(4)).await;
    // read.lua: three keys (the stream, its cancel record, its pause key), then the group.
    let stream = env.key(S);
    let (cancels, paused) = (format!("{stream}.cancels"), env.key(&format!("{S}.paused")));
    proxy.cut_after(&crate::harness::proxy::resp_args(&[
        b"3",
        stream.as_bytes(),
        cancels.as_bytes(),
        paused.as_bytes(),
        b"g",
    ]));
    let rec = Rec::acking();
    let r = rec.clone();
    // One handler at a time: each read takes one entry.
    let source = consumer("reader", Duration::from_millis(500)).concurrency(1);
    let app = start(app_on(
        via(&proxy, env).route(S, stream::Publish::new()),
        Duration::from_millis(100),
        |b| {
            b.include(subscriber(source, r).build());
        },
    ))
    .await;
    eventually("every entry handled and acknowledged", async || {
        rec.distinct() == 4 && pending_count(env, S, "g").await == 0
    })
    .await;
    assert_eq!(proxy.cuts(), 1, "a read's reply was lost");
    assert_eq!(rec.count(), 4, "each handled once");
    let recovered: Vec<_> = rec.seen().into_iter().filter(|s| s.attempt == 2).collect();
    assert_eq!(
        recovered.len(),
        1,
        "the lost read's entry came back: {:?}",
        rec.seen()
    );
    stop(app).await;
}

// Before: a reliable list without recovery said nothing about the entries stranded in its
// processing list. (They still stay there: that is what `no_recovery` means.)
async fn without_recovery_a_lost_claim_stays_and_the_app_says_so_at_startup(env: &Env) {
    logs::capture();
    load_list_scripts(env).await;
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    publish(env, Q, &jobs(6)).await;
    // claim.lua without recovery: four keys (queue, processing, pause, cancel record), the
    // queue first.
    proxy.cut_after(&script_call(4, &env.key(Q)));
    // One handler at a time: each claim takes exactly one entry.
    let source = || {
        RedisList::new(Q)
            .reliable()
            .no_recovery()
            .concurrency(1)
            .block(Duration::from_millis(200))
    };
    let rec = Rec::acking();
    let r = rec.clone();
    let app = start(app_on(via(&proxy, env), Duration::from_millis(100), |b| {
        b.include(subscriber(source(), r).build());
    }))
    .await;
    eventually("the five others handled and settled", async || {
        proxy.cuts() == 1
            && rec.distinct() == 5
            && env.llen(Q).await == 0
            && env.llen(&k(".processing")).await == 1
    })
    .await;
    stop(app).await;
    let stranded = env.llen(&k(".processing")).await;
    assert_eq!(stranded, 1, "the lost claim's entry stays claimed");
    assert_eq!(rec.count(), 5);
    let app = worker(env, |b| {
        b.include(subscriber(source(), Rec::acking()).build());
    })
    .await;
    let queue = env.key(Q);
    let entries = format!("entries={stranded}");
    eventually("the app says how many entries sit there", async || {
        !logs::lines_with(&["without crash recovery", &queue, &entries]).is_empty()
    })
    .await;
    assert_eq!(env.llen(&k(".processing")).await, stranded);
    stop(app).await;
}

// Before (and in the new code until claim.lua named each run's claims): fred sends a claim whose
// reply was lost again, the resent claim reused the lost one's claim numbers, so with identical
// values both claims had one recovery-set member; one settle took it, and the lost claim's entry
// was never swept back while other claims kept the set alive.
async fn identical_values_of_a_claim_sent_twice_are_two_claims(env: &Env) {
    load_list_scripts(env).await;
    let source = || {
        RedisList::new(Q)
            .reliable()
            .min_idle(Duration::from_millis(500))
            .concurrency(1)
            .block(Duration::from_millis(200))
    };
    // Another worker holds a claim for the whole test: the recovery set never empties.
    let holder = Rec::deciding(|_, _, _| hang());
    let h = holder.clone();
    let other = worker(env, |b| {
        b.include(subscriber(source(), h).build());
    })
    .await;
    publish(env, Q, &[Job { n: 99 }]).await;
    eventually("the other worker holds its claim", async || {
        holder.count() == 1
    })
    .await;
    for _ in 0..2 {
        env.lpush_raw(Q, r#"{"n":1}"#).await;
    }
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    proxy.cut_after(&script_call(5, &env.key(Q)));
    let rec = Rec::acking();
    let r = rec.clone();
    let app = start(app_on(via(&proxy, env), Duration::from_millis(100), |b| {
        b.include(subscriber(source(), r).build());
    }))
    .await;
    eventually("both identical values handled", async || {
        rec.count() >= 2 && env.llen(Q).await == 0 && env.llen(&k(".processing")).await == 1
    })
    .await;
    assert_eq!(proxy.cuts(), 1);
    assert_eq!(
        rec.sorted(),
        seen(&[(1, 1), (1, 2)]),
        "the lost claim's entry came back after min_idle"
    );
    assert_eq!(
        env.zcard(&k(".claims")).await,
        1,
        "only the other worker's claim"
    );
    stop(app).await;
    stop(other).await;
}

/// Two identical values claimed together; the first settle (a retry) loses its reply and is
/// sent again; the second (a drop) is sent after that rerun.
async fn a_settle_sent_twice_runs_once(env: &Env, no_recovery: bool) {
    logs::capture();
    load_list_scripts(env).await;
    let proxy = Arc::new(Proxy::start(env.url().expect("standalone")).await);
    for _ in 0..2 {
        env.lpush_raw(Q, r#"{"n":1}"#).await;
    }
    // settle.lua of a reliable list: seven keys, the processing list first.
    let settle_call = script_call(7, &env.key(&k(".processing")));
    proxy.cut_after(&settle_call);
    let cut = proxy.clone();
    let rec = Rec::deciding(move |_, attempt, i| match (attempt, i) {
        (1, 0) => settle(HandlerOutcome::retry()),
        (1, _) => {
            let cut = cut.clone();
            Box::pin(async move {
                // Only once the retry's settle ran and lost its reply: a batch of its own.
                let lost = tokio::time::timeout(Duration::from_secs(10), async {
                    while cut.cuts() == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await;
                assert!(lost.is_ok(), "the first settle's reply was not cut");
                Err(HandlerOutcome::drop())
            })
        }
        _ => ack(),
    });
    let r = rec.clone();
    let mut source = RedisList::new(Q)
        .reliable()
        .concurrency(4)
        .retry(Backoff::immediate())
        .block(Duration::from_millis(200));
    if no_recovery {
        source = source.no_recovery();
    }
    let app = start(app_on(via(&proxy, env), Duration::from_millis(100), |b| {
        b.include(subscriber(source, r).build());
    }))
    .await;
    eventually("both settled, the retry handled", async || {
        rec.count() >= 3 && env.llen(Q).await == 0 && env.llen(&k(".processing")).await == 0
    })
    .await;
    // The retry's settle (its `r` entry) reached Redis twice: cut, then sent again by fred.
    // It settles that entry alone, so its ops are `r`.
    assert_eq!(proxy.cuts(), 1);
    assert_eq!(
        proxy.sent_count(b"\r\n$1\r\nr\r\n"),
        2,
        "the settle ran twice"
    );
    assert_eq!(
        rec.seen(),
        seen(&[(1, 1), (1, 1), (1, 2)]),
        "the retry is delivered once"
    );
    assert_eq!(
        reasons(env, &k(".dead")).await,
        ["dropped"],
        "the other claim's dead letter is there"
    );
    if no_recovery {
        // The token set expires 10 minutes after its last settle.
        let ttl = env.pttl(&k(".settles")).await;
        assert!(
            (1..=600_000).contains(&ttl),
            "the settle tokens' ttl: {ttl} ms"
        );
    }
    stop(app).await;
}

// Before: fred resent a settle whose reply was lost, and the rerun of a no-recovery settle
// (LREM by value) removed the other identical claim: the retried message was delivered twice
// and the other's dead letter lost.
async fn a_settle_sent_twice_without_recovery_runs_once(env: &Env) {
    a_settle_sent_twice_runs_once(env, true).await;
}

// Before: a default reliable list had no recovery set, so its settles were the no-recovery
// kind above: the rerun removed the other identical claim (retry delivered twice, dead letter
// lost). Now the settle is keyed by the claim's member.
async fn a_settle_sent_twice_on_a_default_reliable_list_runs_once(env: &Env) {
    a_settle_sent_twice_runs_once(env, false).await;
}

// ---------------------------------------------------------------------------------------------
// Expired recovery sets, slow handlers, raw values.

// Before: recovery_ttl expired the recovery set but not the processing list: once the workers
// had been down longer than the ttl, their claimed entries could never be recovered.
async fn entries_outliving_an_expired_recovery_set_go_back_to_the_queue(env: &Env) {
    let source = || {
        RedisList::new(Q)
            .reliable()
            .recovery_zset(k(".claims"))
            .min_idle(Duration::from_millis(200))
            .recovery_ttl(Duration::from_millis(600))
            .block(Duration::from_millis(200))
    };
    let hung = Rec::deciding(|_, _, _| hang());
    let h = hung.clone();
    let app = worker(env, |b| {
        b.include(subscriber(source(), h).build());
    })
    .await;
    publish(env, Q, &jobs(3)).await;
    eventually("all three claimed", async || hung.count() == 3).await;
    stop(app).await; // The workers are gone; their claims stay.
    eventually("the recovery set expired", async || {
        !env.exists(&k(".claims")).await
    })
    .await;
    assert_eq!(env.llen(&k(".processing")).await, 3);
    let rec = Rec::acking();
    let r = rec.clone();
    let app = worker(env, |b| {
        b.include(subscriber(source(), r).build());
    })
    .await;
    eventually("recovered and handled", async || {
        rec.count() == 3 && env.keys().await.is_empty()
    })
    .await;
    assert_eq!(rec.sorted(), seen(&[(0, 2), (1, 2), (2, 2)]));
    stop(app).await;
}

/// Sleeps `d`, then acks.
fn slow(d: Duration) -> Verdict {
    Box::pin(async move {
        tokio::time::sleep(d).await;
        Ok(())
    })
}

const MIN_IDLE: Duration = Duration::from_millis(500);

// Before: a handler slower than min_idle was swept and redelivered while still running, each
// redelivery spending an attempt: a message that succeeded every time ended in the dead letters
// with max-attempts.
async fn a_handler_slower_than_min_idle_is_handled_once(env: &Env) {
    let rec = Rec::deciding(|_, _, _| slow(3 * MIN_IDLE));
    let source = || {
        RedisList::new(Q)
            .reliable()
            .min_idle(MIN_IDLE)
            .max_attempts(3)
            .block(Duration::from_millis(100))
    };
    // Two workers: either may sweep the other's claims.
    let (r1, r2) = (rec.clone(), rec.clone());
    let one = worker(env, |b| {
        b.include(subscriber(source(), r1).build());
    })
    .await;
    let two = worker(env, |b| {
        b.include(subscriber(source(), r2).build());
    })
    .await;
    publish(env, Q, &[Job { n: 1 }]).await;
    eventually("settled", async || {
        rec.count() >= 1
            && env.llen(Q).await == 0
            && env.llen(&k(".processing")).await == 0
            && env.zcard(&k(".claims")).await == 0
    })
    .await;
    assert_eq!(rec.seen(), seen(&[(1, 1)]), "handled once, on attempt 1");
    assert!(
        !env.exists(&k(".dead")).await,
        "nothing in the dead letters"
    );
    assert!(env.keys().await.is_empty(), "acked: {:?}", env.keys().await);
    stop(one).await;
    stop(two).await;
}

// Before: streams had no sweep (so nothing was redelivered either); the new sweep must keep
// away from a live consumer's entries just the same.
async fn a_stream_handler_slower_than_min_idle_is_handled_once(env: &Env) {
    let rec = Rec::deciding(|_, _, _| slow(3 * MIN_IDLE));
    let source = |name: &str| {
        RedisStream::new(S)
            .group("g")
            .consumer(name)
            .min_idle(MIN_IDLE)
            .max_attempts(3)
            .block(Duration::from_millis(100))
    };
    let (r1, r2) = (rec.clone(), rec.clone());
    let one = worker(env, |b| {
        b.include(subscriber(source("one"), r1).build());
    })
    .await;
    let two = worker(env, |b| {
        b.include(subscriber(source("two"), r2).build());
    })
    .await;
    publish_stream(env, &[Job { n: 1 }]).await;
    eventually("handled and acked", async || {
        rec.count() >= 1 && pending_count(env, S, "g").await == 0
    })
    .await;
    assert_eq!(rec.seen(), seen(&[(1, 1)]), "handled once, on attempt 1");
    assert_eq!(env.llen(&format!("{S}.dead")).await, 0);
    stop(one).await;
    stop(two).await;
}

// Before: a raw value of 8+ bytes starting with the frame magic `\0rs1` had its bytes 5-8
// rewritten (as an attempt counter) on every sweep, and never reached its attempt limit.
async fn a_raw_value_that_starts_like_a_frame_keeps_its_bytes_and_reaches_max_attempts(env: &Env) {
    // MAGIC, then an id length (0xffff) longer than the value: not a frame.
    let raw = Bytes::from_static(b"\0rs1\0\0\0\x05\xff\xffpayload");
    let _: i64 = env.client.lpush(env.key(Q), raw.clone()).await.unwrap();
    let source = || {
        RedisList::new(Q)
            .reliable()
            .min_idle(Duration::from_millis(200))
            .max_attempts(3)
            .block(Duration::from_millis(100))
    };
    // Each worker dies mid-handler (abandons it at shutdown); the next one sweeps it back.
    for attempt in 1..=3 {
        let h = RawHang::default();
        let hh = h.clone();
        let app = worker(env, |b| {
            b.include(subscriber(source(), hh).build());
        })
        .await;
        eventually("delivered", async || !h.seen().is_empty()).await;
        assert_eq!(
            h.seen(),
            [(raw.clone(), attempt)],
            "bytes kept, attempt counted"
        );
        stop(app).await;
    }
    let h = RawHang::default();
    let hh = h.clone();
    let app = worker(env, |b| {
        b.include(subscriber(source(), hh).build());
    })
    .await;
    eventually("dead-lettered", async || env.llen(&k(".dead")).await == 1).await;
    assert!(h.seen().is_empty(), "not run a fourth time");
    let dead = dead_frames(env, &k(".dead")).await;
    assert_eq!(
        dead[0].headers.get("reason").map(String::as_str),
        Some("max-attempts")
    );
    assert_eq!(dead[0].payload, raw, "the dead letter keeps the raw bytes");
    eventually("nothing claimed", async || {
        env.llen(&k(".processing")).await == 0 && env.zcard(&k(".claims")).await == 0
    })
    .await;
    stop(app).await;
}

/// Values that start with the frame magic: frames, frames cut short or with a length off by
/// one, and random bytes.
fn magic_values(rng: &mut fastrand::Rng, n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let headers: ruststream::Headers = (0..rng.usize(0..3))
            .map(|i| {
                (
                    format!("k{i}{}", "x".repeat(rng.usize(0..4))),
                    "v".repeat(rng.usize(0..5)),
                )
            })
            .collect();
        let id = "i".repeat(rng.usize(0..6));
        let payload: Vec<u8> = (0..rng.usize(0..6)).map(|_| rng.u8(..)).collect();
        let attempt = if rng.bool() {
            rng.u32(..)
        } else {
            rng.u32(0..4)
        };
        let frame =
            ruststream::redis::frame::encode_parts(&id, attempt, &headers, &payload).to_vec();
        let v = match rng.u8(0..4) {
            // A frame, whole.
            0 => frame,
            // Cut short.
            1 => frame[..rng.usize(4..=frame.len())].to_vec(),
            // One length byte off by one.
            2 => {
                let mut f = frame;
                let at = rng.usize(8..f.len());
                f[at] = f[at].wrapping_add(if rng.bool() { 1 } else { 255 });
                f
            }
            // The magic, then anything.
            _ => {
                let mut f = MAGIC.to_vec();
                f.extend((0..rng.usize(0..24)).map(|_| rng.u8(..)));
                f
            }
        };
        out.push(v);
    }
    out
}

// Before: the scripts took any value of 8+ bytes that starts with the magic for a frame (and
// rewrote its bytes 5-8 as an attempt), where Rust read the whole layout: the two disagreed on
// what a frame is. Now, on thousands of such values, frame.lua and frame.rs agree on whether it
// is a frame, its attempt and its payload, and bump keeps a raw value's bytes whole.
async fn lua_and_rust_read_the_same_values_as_frames(env: &Env) {
    let script = format!(
        "{}\n{}",
        include_str!("../../../../ruststream-redis/src/frame.lua"),
        r"
local out = {}
for i, v in ipairs(ARGV) do
  local layout = frame_layout(v)
  if layout then
    out[i] = {layout.attempt, string.sub(v, layout.payload), bump(v)}
  else
    out[i] = {-1, '', bump(v)}
  end
end
return out
"
    );
    let mut rng = fastrand::Rng::with_seed(8);
    let mut frames = 0;
    for _ in 0..8 {
        let values = magic_values(&mut rng, 500);
        let mut args: Vec<Value> = vec![script.as_str().into(), 0.into()];
        args.extend(values.iter().map(|v| Value::Bytes(Bytes::from(v.clone()))));
        let Value::Array(replies) = env.cmd("EVAL", args).await.expect("EVAL") else {
            panic!("EVAL returns an array");
        };
        assert_eq!(replies.len(), values.len());
        for (v, reply) in values.iter().zip(replies) {
            let Value::Array(reply) = reply else {
                panic!("an array per value")
            };
            let lua_attempt = reply[0].as_i64().expect("attempt");
            let bytes = |i: usize| match &reply[i] {
                Value::Bytes(b) => b.clone(),
                Value::String(s) => s.inner().clone(),
                other => panic!("bytes expected, got {other:?}"),
            };
            let rust = Frame::decode(Bytes::from(v.clone()));
            let rust_is_frame = rust.payload.len() < v.len();
            assert_eq!(lua_attempt >= 0, rust_is_frame, "is {v:?} a frame?");
            let bumped = Frame::decode(bytes(2));
            if rust_is_frame {
                frames += 1;
                assert_eq!(lua_attempt, i64::from(rust.attempt), "attempt of {v:?}");
                assert_eq!(bytes(1), rust.payload, "payload of {v:?}");
                let next = Frame {
                    attempt: rust.attempt.saturating_add(1),
                    ..rust
                };
                assert_eq!(bumped, next, "bump of the frame {v:?}");
            } else {
                assert_eq!(
                    (bumped.attempt, &bumped.payload[..]),
                    (2, &v[..]),
                    "bump of the raw value {v:?} keeps its bytes"
                );
            }
        }
    }
    assert!(frames > 1000, "enough of them were frames: {frames}");
}

/// A handler that waits (bounded) for its message's cancel, counting calls and cancels seen.
#[derive(Clone, Default)]
struct AwaitsCancel {
    calls: Arc<std::sync::atomic::AtomicUsize>,
    told: Arc<std::sync::atomic::AtomicUsize>,
}

impl Handle<Job> for AwaitsCancel {
    async fn handle(&self, _: &Job, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        use std::sync::atomic::Ordering::SeqCst;
        self.calls.fetch_add(1, SeqCst);
        if tokio::time::timeout(crate::harness::WAIT, ctx.cancelled())
            .await
            .is_ok()
        {
            self.told.fetch_add(1, SeqCst);
        }
        Ok(())
    }
}

// A cancel's script ran and its reply was lost (the connection dropped after the command was
// sent): the client resends it, and the resend must answer what the first run did (from the
// cancel record), cancel nothing twice, and leave nothing behind. Both a running message
// (Signalled) and a delayed one (Removed), each cancelled through a proxy that cuts the first
// reply of the cancel script.
async fn a_cancel_whose_reply_is_lost_is_resent_and_answers_the_same(env: &Env) {
    use std::sync::atomic::Ordering::SeqCst;
    let handler = AwaitsCancel::default();
    let h = handler.clone();
    // The app reads without the proxy: only the canceller's commands go through it.
    let source = RedisList::new(Q)
        .reliable()
        .block(Duration::from_millis(200))
        .cancel_grace(Duration::from_secs(5));
    let app = start(app_on(env.broker(), Duration::from_secs(1), |b| {
        b.include(subscriber(source, h).build());
    }))
    .await;
    let producer = env.broker();
    producer.connect().await.expect("connect");
    let publisher = producer.publisher();
    let job = Job { n: 1 };
    publisher
        .message(&job)
        .to(Q)
        .id("running")
        .publish()
        .await
        .expect("publish");
    publisher
        .message(&job)
        .to(Q)
        .id("later")
        .delay(Duration::from_secs(3600))
        .publish()
        .await
        .expect("publish delayed");
    eventually("the job runs", async || handler.calls.load(SeqCst) == 1).await;

    let proxy = Proxy::start(env.url().expect("standalone")).await;
    let canceller = via(&proxy, env);
    canceller
        .connect()
        .await
        .expect("connect through the proxy");
    let cancels = canceller.publisher();
    // cancel.lua's first key is the cancel record.
    let record = env.key(&k(".cancels"));
    for (id, expected) in [
        ("running", ruststream::CancelOutcome::Signalled),
        ("later", ruststream::CancelOutcome::Removed),
    ] {
        let before = proxy.cuts();
        proxy.cut_after(record.as_bytes());
        let answer = crate::harness::bounded(
            "a cancel whose reply was lost",
            crate::harness::WAIT,
            async {
                // fred resends a command whose connection dropped; a call that still failed is
                // sent again by the caller, as the method's docs say.
                match cancels.cancel(Q, id).await {
                    Ok(answer) => answer,
                    Err(_) => cancels.cancel(Q, id).await.expect("the cancel, sent again"),
                }
            },
        )
        .await;
        assert_eq!(proxy.cuts(), before + 1, "{id}: the cancel's reply was cut");
        assert_eq!(
            answer, expected,
            "{id}: the resend answers what the first run did"
        );
        assert_eq!(
            cancels.cancel(Q, id).await.expect("a third cancel"),
            expected,
            "{id}: and so does every later one"
        );
    }
    assert!(
        proxy.sent_count(record.as_bytes()) >= 4,
        "the cut cancels were sent again"
    );
    eventually("the running job settles as cancelled", async || {
        handler.told.load(SeqCst) == 1 && env.llen(&k(".processing")).await == 0
    })
    .await;
    assert_eq!(handler.calls.load(SeqCst), 1, "the cancelled job ran once");
    assert_eq!(
        env.zcard(&k(".delayed")).await,
        0,
        "the delayed job is gone"
    );
    assert_eq!(env.llen(&k(".dead")).await, 0, "a cancel is no dead letter");
    stop(app).await;
}
