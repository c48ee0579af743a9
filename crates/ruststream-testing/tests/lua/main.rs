//! The model runs the real Lua: ad-hoc scripts (not the broker's) sent with `EVAL`, `SCRIPT
//! LOAD` and `EVALSHA` give the replies Redis 7 gives. Each case's expected reply was read from
//! a Redis 7.0 server; when a Redis is reachable (`RUSTSTREAM_REDIS_URL`, default
//! `redis://127.0.0.1:6379`; `scripts/test` starts one, and CI requires it), every case also
//! runs there, under a key prefix of its own that is deleted afterwards, and the two replies must
//! be equal.
//!
//! `adhoc`: ad-hoc scripts; `claims`: the claim scripts and their gates through their typed calls;
//! `calls`: the other scripts' typed calls; `back`: every way back to a queue; `dead`: the
//! dead-letter list's bound in every script that pushes dead letters; `cancels`: the cancel
//! script, the claim's cancel gate and the settle's race with a cancel.

mod adhoc;
mod back;
mod batches;
mod calls;
mod cancels;
mod claims;
mod dead;
mod flows;
mod steps;

use std::time::Duration;

use fred::prelude::*;
use ruststream_testing::MemoryRedis;

/// A reply in a form both backends can be compared in: fred gives a bulk string from a server
/// as text when it is UTF-8, the model hands its bytes over as they are.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Int(i64),
    Text(Vec<u8>),
    Nil,
    List(Vec<Reply>),
    Error(String),
}

use Reply::{Int, List, Nil};

fn t(s: &str) -> Reply {
    Reply::Text(s.as_bytes().to_vec())
}

fn reply(r: Result<Value, fred::error::Error>) -> Reply {
    match r {
        Err(e) => Reply::Error(e.details().to_owned()),
        Ok(v) => value(v),
    }
}

fn value(v: Value) -> Reply {
    match v {
        Value::Integer(i) => Int(i),
        Value::Bytes(b) => Reply::Text(b.to_vec()),
        Value::String(s) => Reply::Text(s.as_bytes().to_vec()),
        Value::Null => Nil,
        Value::Array(items) => List(items.into_iter().map(value).collect()),
        other => Reply::Error(format!("unexpected reply {other:?}")),
    }
}

/// Redis's script cache is the server's, shared by every test of this binary: a test that uses
/// the real Redis holds this shared for as long as it does, and the one that empties the cache
/// (`SCRIPT FLUSH`) holds it alone, so no other test's script is flushed between its
/// `SCRIPT LOAD` and its `EVALSHA`.
static SCRIPT_CACHE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A client on the real Redis with the script cache held shared (`SCRIPT_CACHE`).
struct Redis {
    client: Client,
    _cache: tokio::sync::RwLockReadGuard<'static, ()>,
}

impl std::ops::Deref for Redis {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

/// A client on the real Redis, the script cache held shared, or `None` (skip) when there is
/// none, except under CI.
async fn redis() -> Option<Redis> {
    let cache = SCRIPT_CACHE.read().await;
    Some(Redis {
        client: connect().await?,
        _cache: cache,
    })
}

/// Whether `client`'s server is Valkey (its `INFO server` names a `valkey_version`).
async fn is_valkey(client: &Client) -> bool {
    let info: Result<String, _> = client.info(Some(fred::types::InfoKind::Server)).await;
    info.is_ok_and(|i| i.contains("valkey_version:"))
}

/// `reply` with Valkey's words for an error turned into Redis 7's, which the model follows. Valkey
/// differs from Redis 7 in what these tests read (listed on the guide's "Supported servers"
/// page), never in what RustStream's scripts do:
/// - an error raised in a script names no script: `script: on @user_script:1.`, where Redis
///   says `script: <sha1>, on @user_script:1.` (the sha1 is dropped from both sides);
/// - four messages of the scripting engine name the command differently (`This Valkey command
///   is not allowed from script`);
/// - a Lua number passed to a command is written in its shortest form (`0.1`), where Redis
///   writes `%.17g` (`0.10000000000000001`): the cases that show it are not compared on Valkey.
///   RustStream's scripts write numbers with `string.format`.
fn valkey_as_redis(reply: Reply) -> Reply {
    const WORDS: [(&str, &str); 4] = [
        (
            "Wrong number of args calling command from script",
            "Wrong number of args calling Redis command from script",
        ),
        (
            "ERR Command arguments must be strings or integers",
            "ERR Lua redis lib command arguments must be strings or integers",
        ),
        (
            "at least one argument for this call script",
            "at least one argument for this redis lib call script",
        ),
        (
            "This Valkey command is not allowed from script",
            "This Redis command is not allowed from script",
        ),
    ];
    match reply {
        Reply::Error(mut e) => {
            for (valkey, redis) in WORDS {
                e = e.replace(valkey, redis);
            }
            if let Some(at) = e.find(" script: ") {
                let rest = &e[at + " script: ".len()..];
                if let Some(on) = rest.find("on @user_script:") {
                    e = format!("{} script: {}", &e[..at], &rest[on..]);
                }
            }
            Reply::Error(e)
        }
        List(items) => List(items.into_iter().map(valkey_as_redis).collect()),
        other => other,
    }
}

/// A client on the real Redis, or `None` (skip) when there is none, except under CI.
async fn connect() -> Option<Client> {
    let url = std::env::var("RUSTSTREAM_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let client = Builder::from_config(Config::from_url(&url).ok()?)
        .build()
        .ok()?;
    let up = tokio::time::timeout(Duration::from_secs(3), client.init()).await;
    match up {
        Ok(Ok(_)) => Some(client),
        _ if std::env::var_os("CI").is_some() => {
            panic!("no Redis at {url}: CI runs the tests through scripts/test")
        }
        _ => {
            eprintln!("SKIPPED: no Redis at {url}; run the tests with scripts/test");
            None
        }
    }
}

fn fastrand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Runs `scenario` (given a client and a key prefix of its own; it deletes its keys at the end)
/// on the model and, when a Redis is reachable, on Redis, and asserts both give `expect`.
async fn on_both<T, Fut>(name: &str, expect: T, scenario: impl Fn(Client, String) -> Fut)
where
    T: PartialEq + std::fmt::Debug,
    Fut: std::future::Future<Output = T>,
{
    let model = MemoryRedis::new();
    let client = model.client().expect("a model client");
    client.init().await.expect("init");
    let got = scenario(client, format!("{name}-model")).await;
    assert_eq!(got, expect, "{name} on the model");
    let Some(redis) = redis().await else {
        return;
    };
    let prefix = format!("rs{name}-{}-{}", std::process::id(), fastrand_suffix());
    let got = scenario(redis.clone(), prefix).await;
    assert_eq!(got, expect, "{name} on Redis");
    let _ = redis.quit().await;
}

/// The full name of `s` under `prefix`, in the prefix's hash slot.
fn key(prefix: &str, s: &str) -> String {
    format!("{{{prefix}}}{s}")
}
