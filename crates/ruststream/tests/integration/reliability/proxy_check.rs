//! The proxy the lost-reply tests stand on: a command whose reply it throws away did run.

use std::time::Duration;

use fred::prelude::*;

use crate::harness::proxy::{Proxy, resp_args};
use crate::harness::{Env, bounded, on};

on!([standalone] the_proxy_loses_the_reply_of_a_command_that_ran);

/// A client through `proxy` that sends a command `attempts` times at most and reconnects.
async fn client(proxy: &Proxy, attempts: u32) -> Client {
    let client = Builder::from_config(Config::from_url(&proxy.url()).unwrap())
        .set_policy(ReconnectPolicy::new_constant(0, 50))
        .with_connection_config(|c| c.max_command_attempts = attempts)
        .build()
        .unwrap();
    bounded(
        "connect through the proxy",
        Duration::from_secs(10),
        client.init(),
    )
    .await
    .expect("connected through the proxy");
    client
}

// Not an observation: the harness the lost-reply tests stand on (new, never run before).
async fn the_proxy_loses_the_reply_of_a_command_that_ran(env: &Env) {
    let proxy = Proxy::start(env.url().expect("standalone")).await;
    let key = env.key("counter");
    let incr = resp_args(&[b"INCR", key.as_bytes()]);

    // One attempt: the caller gets an error, yet the INCR ran once.
    let once = client(&proxy, 1).await;
    proxy.cut_after(&incr);
    let r: Result<i64, _> = bounded("INCR", Duration::from_secs(10), once.incr(&key)).await;
    assert!(r.is_err(), "the reply was thrown away: {r:?}");
    assert_eq!(proxy.cuts(), 1);
    assert!(!proxy.armed());
    let v: i64 = env.client.get(&key).await.unwrap();
    assert_eq!(v, 1, "the command whose reply was lost did run on Redis");
    assert_eq!(proxy.sent_count(&incr), 1);
    let _ = once.quit().await;

    // With attempts left, fred sends it again on a new connection: it runs twice, and the
    // caller hears only the second reply.
    let retrying = client(&proxy, 3).await;
    proxy.cut_after(&incr);
    let r: i64 = bounded("INCR", Duration::from_secs(10), retrying.incr(&key))
        .await
        .expect("fred resends the INCR and gets its reply");
    assert_eq!(proxy.cuts(), 2);
    assert_eq!(
        r, 3,
        "the first INCR ran, its reply lost, then the resent one"
    );
    assert_eq!(proxy.sent_count(&incr), 3);
    // The proxy carries on for everything else.
    let v: i64 = retrying.get(&key).await.unwrap();
    assert_eq!(v, 3);
    let _ = retrying.quit().await;
}
