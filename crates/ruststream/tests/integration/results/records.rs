//! The result record: its ttl, the first result stays, a key of another type is refused and left
//! alone, a zero ttl is refused at startup, a result whose reply was lost is written once, and a
//! full Redis refuses a result whole.

use crate::harness;

use std::time::Duration;

use fred::prelude::*;
use harness::{Env, WAIT, on};
use ruststream::prelude::*;

use super::{
    Done, KEY, Mode, Worker, await_job, job_key, producer, publish_job, reliable, stop_all,
    two_workers, worker,
};

on!(
    [memory, standalone, cluster] multi_thread:
    a_result_expires_after_its_ttl,
    the_first_result_stays,
    a_job_key_of_another_type_is_refused_and_left_alone,
);

on!([memory] a_zero_result_ttl_is_refused_at_startup);

// The proxy that loses replies works on a standalone server only.
on!([standalone] multi_thread: a_result_whose_reply_was_lost_is_written_once);

async fn a_result_expires_after_its_ttl(env: &Env) {
    let ttl = Duration::from_millis(1500);
    let handler = Worker::new("w", Mode::Double);
    let apps = [
        worker(env, reliable(KEY), handler.named("a"), |b| {
            b.result_ttl(ttl)
        })
        .await,
        worker(env, reliable(KEY), handler.named("b"), |b| {
            b.result_ttl(ttl)
        })
        .await,
    ];
    let publisher = producer(env);
    let done = await_job(&publisher, KEY, 4, "short", WAIT)
        .await
        .expect("result");
    assert_eq!(done.n, 8);
    let pttl = env.pttl("ruststream:job:{short}").await;
    assert!(
        pttl > 0 && pttl <= 1500,
        "the record expires within its ttl: {pttl}"
    );
    env.eventually("the record expired", async || {
        !env.exists("ruststream:job:{short}").await
    })
    .await;
    assert_eq!(publisher.job_state("short").await.expect("state"), None);
    stop_all(env, apps).await;
}

async fn the_first_result_stays(env: &Env) {
    let handler = Worker::new("", Mode::Twice);
    let apps = two_workers(env, &handler).await;
    let publisher = producer(env);
    let done = await_job(&publisher, KEY, 1, "twice", WAIT)
        .await
        .expect("result");
    assert_eq!(done.n, 100);
    // The redelivery set another result and progress: neither replaced the final record.
    env.eventually("the redelivery ran", async || handler.attempts() == [1, 2])
        .await;
    let state = publisher.job_state("twice").await.expect("state");
    let state = state.expect("a record");
    assert_eq!(
        state.result::<Done>().expect("decodes").map(|d| d.n),
        Some(100)
    );
    assert_eq!(state.progress::<u32>().expect("decodes"), None);
    stop_all(env, apps).await;
}

async fn a_job_key_of_another_type_is_refused_and_left_alone(env: &Env) {
    let key = job_key(env, "taken");
    let _: () = env
        .client
        .set(&key, "someone else's", None, None, false)
        .await
        .expect("SET");
    let handler = Worker::new("", Mode::Probe);
    let apps = two_workers(env, &handler).await;
    publish_job(&producer(env), 1, "taken").await;
    env.eventually("the handler ran", async || handler.attempts() == [1])
        .await;
    assert_eq!(
        *handler.awaited.lock().expect("lock"),
        [false],
        "published without await_result"
    );
    let errors = handler.errors.lock().expect("lock").clone();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, ruststream::ErrorKind::WrongType, "{errors:?}");
    let value: String = env.client.get(&key).await.expect("GET");
    assert_eq!(value, "someone else's");
    stop_all(env, apps).await;
}

async fn a_zero_result_ttl_is_refused_at_startup(env: &Env) {
    let app = RustStream::new(AppInfo::new("results", "0.0.0")).with_broker(
        env.broker_with(|b| b.result_ttl(Duration::ZERO)),
        |b| {
            b.include(subscriber(reliable(KEY), Worker::new("w", Mode::Double)).build());
        },
    );
    let Err(err) = env.try_start(app).await else {
        panic!("a zero result ttl must be refused at startup");
    };
    assert_eq!(
        harness::config_error(&err).option,
        "RedisBroker::result_ttl",
        "{err}"
    );
}

async fn a_result_whose_reply_was_lost_is_written_once(env: &Env) {
    let proxy = harness::proxy::Proxy::start(env.url().expect("standalone")).await;
    let prefix = env.prefix.clone();
    let through_proxy = RedisBroker::standalone(proxy.url()).prefix(prefix);
    let handler = Worker::new("w", Mode::Double);
    let app = RustStream::new(AppInfo::new("results-cut", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(through_proxy, {
            let handler = handler.clone();
            move |b| {
                b.include(subscriber(reliable(KEY), handler).build());
            }
        });
    let app = env.start(app).await;
    // The worker's write to the record runs, its reply is lost, and fred sends it again.
    let needle = b"ruststream:job:{cut}";
    proxy.cut_after(needle);
    let done = await_job(&producer(env), KEY, 7, "cut", WAIT)
        .await
        .expect("the result");
    assert_eq!(done.n, 14);
    env.eventually("the handler finished", async || handler.attempts() == [1])
        .await;
    assert_eq!(proxy.cuts(), 1, "the reply was cut");
    assert!(proxy.sent_count(needle) >= 2, "the write was sent again");
    let state = producer(env).job_state("cut").await.expect("state");
    assert_eq!(
        state.and_then(|s| s.result::<Done>().ok().flatten()),
        Some(done)
    );
    env.stop(app).await;
}

/// At maxmemory (noeviction) the job script, which only adds, is refused whole: the handler's
/// `set_result` fails with OOM and writes nothing, while the message is still handled and
/// settled. On a server of the test's own.
#[tokio::test]
async fn a_full_redis_refuses_a_result_whole() {
    if harness::redis_url().is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(harness::unique("results-oom"));
    std::fs::create_dir_all(&dir).expect("a data directory");
    let redis = harness::stand::OwnRedis::start(dir, harness::stand::OwnRedis::free_port()).await;
    let broker = || RedisBroker::standalone(redis.url()).prefix("oom:");
    let publisher = broker().publisher();
    publish_job(&publisher, 1, "full").await;
    let raw = harness::stand::node_client(&redis.url()).await;
    let config_set = async |name: &str, value: &str| {
        let _: Value = raw
            .custom(fred::cmd!("CONFIG"), vec!["SET", name, value])
            .await
            .expect("CONFIG SET");
    };
    config_set("maxmemory-policy", "noeviction").await;
    config_set("maxmemory", "1").await;
    let handler = Worker::new("w", Mode::Probe);
    let app = RustStream::new(AppInfo::new("results-oom", "0.0.0"))
        .shutdown_timeout(Duration::from_secs(1))
        .with_broker(broker(), {
            let handler = handler.clone();
            move |b| {
                b.include(subscriber(reliable(KEY), handler).build());
            }
        });
    let app = harness::start(app).await;
    harness::wait_until("the handler ran", WAIT, async || handler.attempts() == [1]).await;
    let errors = handler.errors.lock().expect("lock").clone();
    assert!(
        errors.len() == 1 && errors[0].0 == ruststream::ErrorKind::OutOfMemory,
        "{errors:?}"
    );
    let exists: i64 = raw
        .exists("oom:ruststream:job:{full}")
        .await
        .expect("EXISTS");
    assert_eq!(exists, 0, "nothing written");
    harness::wait_until("the message was settled", WAIT, async || {
        let processing: i64 = raw.llen("oom:{jobs}.processing").await.expect("LLEN");
        processing == 0
    })
    .await;
    harness::stop(app).await;
    config_set("maxmemory", "0").await;
    let _ = raw.quit().await;
}
