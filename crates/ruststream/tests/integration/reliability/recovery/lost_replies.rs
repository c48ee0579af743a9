//! Replies lost between Redis and the worker (thrown away by the proxy): a claim's, a stream
//! read's, a settle's and a cancel's. What ran comes back after `min_idle` or answers the same
//! when resent, and runs once.

use std::sync::Arc;
use std::time::Duration;

use ruststream::prelude::*;

use crate::harness::proxy::Proxy;
use crate::harness::{Env, on, start, stop};
use crate::reliability::common::*;

use super::{Q, S, consumer, k, publish_stream};

on!(
    [standalone]
    a_claim_whose_reply_is_lost_comes_back_after_min_idle,
    without_recovery_a_lost_claim_stays_and_the_app_says_so_at_startup,
    a_settle_sent_twice_without_recovery_runs_once,
    a_settle_sent_twice_on_a_default_reliable_list_runs_once,
    identical_values_of_a_claim_sent_twice_are_two_claims,
    a_stream_read_whose_reply_is_lost_comes_back_after_min_idle,
    a_cancel_whose_reply_is_lost_is_resent_and_answers_the_same,
);

// ---------------------------------------------------------------------------------------------
// Replies lost between Redis and the worker (the proxy).

/// A broker through `proxy` with the test's prefix.
fn via(proxy: &Proxy, env: &Env) -> RedisBroker {
    RedisBroker::standalone(proxy.url()).prefix(&env.prefix)
}

// The fault: without a recovery set, when the connection drops after claim.lua ran but before its
// reply arrived, the claimed entries stay in K.processing for ever. A default reliable list has
// one.
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

// The fault: entries an XREADGROUP delivered whose reply was lost (the connection dropped) stay
// pending on a consumer that never knew it had them, unless a sweep reclaims them.
async fn a_stream_read_whose_reply_is_lost_comes_back_after_min_idle(env: &Env) {
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    publish_stream(env, &jobs(4)).await;
    // A plain group reads natively: its `XREADGROUP` runs at the `EXEC` of a watched `MULTI` on
    // the reader's own connection, the only one through the proxy that sends `EXEC`.
    proxy.cut_after(b"\r\nEXEC\r\n");
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

// A reliable list without recovery must say, at startup, that entries are stranded in its
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

// The fault: fred sends a claim whose reply was lost again. A resent claim that reuses the lost
// one's claim numbers gives both claims of identical values one recovery-set member; one settle
// takes it, and the lost claim's entry is never swept back while other claims keep the set alive.
// Each run of claim.lua names its claims with the server's time.
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

// The fault: fred resends a settle whose reply was lost. A rerun of a no-recovery settle (LREM by
// value) would remove the other identical claim: the retried message delivered twice and the
// other's dead letter lost. The settle token makes the rerun a no-op.
async fn a_settle_sent_twice_without_recovery_runs_once(env: &Env) {
    a_settle_sent_twice_runs_once(env, true).await;
}

// The same fault on a default reliable list, whose settles are keyed by the claim's batch member
// and index instead of a token.
async fn a_settle_sent_twice_on_a_default_reliable_list_runs_once(env: &Env) {
    a_settle_sent_twice_runs_once(env, false).await;
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
