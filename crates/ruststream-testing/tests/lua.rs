//! The model runs the real Lua: ad-hoc scripts (not the broker's) sent with `EVAL`, `SCRIPT
//! LOAD` and `EVALSHA` give the replies Redis 7 gives. Each case's expected reply was read from
//! a Redis 7.0 server; when a Redis is reachable (`RUSTSTREAM_REDIS_URL`, default
//! `redis://127.0.0.1:6379`; `scripts/test` starts one, and CI requires it), every case also
//! runs there, under a key prefix of its own that is deleted afterwards, and the two replies must
//! be equal.

use std::time::Duration;

use fred::prelude::*;
use fred::types::scripts::Script;
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

use Reply::{Error as E, Int, List, Nil};

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

/// One ad-hoc script: its text, how many of `{k1, k2}` it takes as `KEYS`, its `ARGV`, and the
/// reply Redis 7 gives (`{sha}` in an error stands for the script's SHA-1).
struct Case {
    lua: &'static str,
    keys: usize,
    argv: &'static [&'static [u8]],
    expect: Reply,
}

fn case(lua: &'static str, keys: usize, argv: &'static [&'static [u8]], expect: Reply) -> Case {
    Case {
        lua,
        keys,
        argv,
        expect,
    }
}

fn raised(message: &str, line: usize) -> Reply {
    E(format!(
        "{message} script: {{sha}}, on @user_script:{line}."
    ))
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

fn cases() -> Vec<Case> {
    vec![
        // redis.call runs the command against the same data.
        case(
            "return redis.call('LPUSH', KEYS[1], ARGV[1])",
            1,
            &[b"a"],
            Int(1),
        ),
        case(
            "redis.call('RPUSH', KEYS[1], 'a', 'b') return redis.call('LRANGE', KEYS[1], 0, -1)",
            1,
            &[],
            List(vec![t("a"), t("b")]),
        ),
        // A Redis error raised by redis.call, returned by redis.pcall, caught by pcall.
        case(
            "redis.call('SET', KEYS[1], 'v') return redis.call('LPUSH', KEYS[1], 'x')",
            1,
            &[],
            raised(WRONGTYPE, 1),
        ),
        case(
            "redis.call('SET', KEYS[1], 'v') return redis.pcall('LPUSH', KEYS[1], 'x')",
            1,
            &[],
            E(WRONGTYPE.to_owned()),
        ),
        case(
            "redis.call('SET', KEYS[1], 'v')\nlocal r = redis.pcall('LPUSH', KEYS[1], 'x')\nreturn {type(r), r.err}",
            1,
            &[],
            List(vec![t("table"), t(WRONGTYPE)]),
        ),
        case(
            "redis.call('SET', KEYS[1], 'v')\nlocal ok, e = pcall(redis.call, 'LPUSH', KEYS[1], 'x')\nreturn {tostring(ok), e}",
            1,
            &[],
            List(vec![t("false"), t(WRONGTYPE)]),
        ),
        case(
            "local function push(k)\n  redis.call('SET', k, 'v')\n  return redis.call('LPUSH', k, 'x')\nend\nreturn push(KEYS[1])",
            1,
            &[],
            raised(WRONGTYPE, 3),
        ),
        case(
            "return redis.pcall('GET')",
            0,
            &[],
            E("ERR Wrong number of args calling Redis command from script".to_owned()),
        ),
        case(
            "return redis.call('SET', KEYS[1], {})",
            1,
            &[],
            raised(
                "ERR Lua redis lib command arguments must be strings or integers",
                1,
            ),
        ),
        case(
            "return redis.call()",
            0,
            &[],
            raised(
                "ERR Please specify at least one argument for this redis lib call",
                1,
            ),
        ),
        case(
            "return redis.call('EVAL', 'return 1', 0)",
            0,
            &[],
            raised("ERR This Redis command is not allowed from script", 1),
        ),
        // A shebang line names the engine and flags; it is not run, and line numbers keep it.
        case("#!lua flags=allow-oom\nreturn 1", 0, &[], Int(1)),
        case(
            "#!lua\nreturn redis.call('TYPE', KEYS[1])",
            1,
            &[],
            t("none"),
        ),
        case(
            "#!lua flags=allow-oom\nerror('boom')",
            0,
            &[],
            raised("ERR user_script:2: boom", 2),
        ),
        case(
            "#!lua flags=made-up\nreturn 1",
            0,
            &[],
            E("ERR Unexpected flag in script shebang: made-up".to_owned()),
        ),
        // Lua errors, and Redis's restrictions on globals.
        case(
            "error('boom')",
            0,
            &[],
            raised("ERR user_script:1: boom", 1),
        ),
        case(
            "error({err = 'MYERR custom'})",
            0,
            &[],
            raised("MYERR custom", 1),
        ),
        case(
            "local ok, e = pcall(error, {err = 'X y'}) return e",
            0,
            &[],
            t("X y"),
        ),
        case(
            "x = 1 return x",
            0,
            &[],
            raised("ERR user_script:1: Attempt to modify a readonly table", 1),
        ),
        case(
            "local n = 1\nfunction f() return n end\nreturn f()",
            0,
            &[],
            raised("ERR user_script:2: Attempt to modify a readonly table", 2),
        ),
        case(
            "string.x = 1",
            0,
            &[],
            raised("ERR user_script:1: Attempt to modify a readonly table", 1),
        ),
        case(
            "return undefinedvar",
            0,
            &[],
            raised(
                "ERR user_script:1: Script attempted to access nonexistent global variable 'undefinedvar'",
                1,
            ),
        ),
        case(
            "return type(print)",
            0,
            &[],
            raised(
                "ERR user_script:1: Script attempted to access nonexistent global variable 'print'",
                1,
            ),
        ),
        // unpack fails where Redis's Lua does (LUAI_MAXCSTACK).
        case(
            "local t = {} for i = 1, 7999 do t[i] = i end return #{unpack(t)}",
            0,
            &[],
            Int(7999),
        ),
        case(
            "local t = {} for i = 1, 8000 do t[i] = i end return #{unpack(t)}",
            0,
            &[],
            raised("ERR user_script:1: too many results to unpack", 1),
        ),
        // Redis to Lua.
        case(
            "local v = redis.call('GET', KEYS[1]) return type(v) .. ':' .. tostring(v)",
            1,
            &[],
            t("boolean:false"),
        ),
        case(
            "local r = redis.call('SET', KEYS[1], 'v') return type(r) .. ':' .. r.ok",
            1,
            &[],
            t("table:OK"),
        ),
        case(
            "local t = redis.call('TIME') return {#t, type(t[1])}",
            0,
            &[],
            List(vec![Int(2), t("string")]),
        ),
        case(
            "return type(redis.call('LPUSH', KEYS[1], 'a'))",
            1,
            &[],
            t("number"),
        ),
        // Lua to Redis.
        case(
            "return {1, 2.9, -3.7, 'a', false, true, nil, 5}",
            0,
            &[],
            List(vec![Int(1), Int(2), Int(-3), t("a"), Nil, Int(1)]),
        ),
        case("return 3.99", 0, &[], Int(3)),
        case("return 2^63", 0, &[], Int(i64::MIN)),
        case("return true", 0, &[], Int(1)),
        case("return false", 0, &[], Nil),
        case("return nil", 0, &[], Nil),
        case("return {ok = 'FINE'}", 0, &[], t("FINE")),
        case("return redis.status_reply('FINE')", 0, &[], t("FINE")),
        case(
            "return {err = 'bad thing'}",
            0,
            &[],
            E("bad thing".to_owned()),
        ),
        case(
            "return redis.error_reply('bad')",
            0,
            &[],
            E("ERR bad".to_owned()),
        ),
        case(
            "return redis.error_reply('-MY bad')",
            0,
            &[],
            E("MY bad".to_owned()),
        ),
        case("return redis.call('SET', KEYS[1], 'v')", 1, &[], t("OK")),
        // Numbers passed to redis.call are written as %.17g.
        case(
            "for i, n in ipairs({3, 1.5, 0.1, 1e17, 2^53}) do redis.call('RPUSH', KEYS[1], n) end\nreturn redis.call('LRANGE', KEYS[1], 0, -1)",
            1,
            &[],
            List(vec![
                t("3"),
                t("1.5"),
                t("0.10000000000000001"),
                t("1e+17"),
                t("9007199254740992"),
            ]),
        ),
        case(
            "redis.call('SET', KEYS[1], -0.0) return redis.call('GET', KEYS[1])",
            1,
            &[],
            t("-0"),
        ),
        // Lua 5.1 itself: -0.0 and 0 are one constant of a function, so the LRANGE below gets
        // "-0", which Redis does not read as an integer.
        case(
            "redis.call('RPUSH', KEYS[1], -0.0)\nreturn redis.call('LRANGE', KEYS[1], 0, -1)",
            1,
            &[],
            raised("ERR value is not an integer or out of range", 2),
        ),
        // KEYS and ARGV are binary-safe strings.
        case(
            "return {ARGV[1], #ARGV[1], #ARGV, KEYS[2] ~= nil}",
            2,
            &[b"\0\xff\x01", b"b"],
            List(vec![
                Reply::Text(b"\0\xff\x01".to_vec()),
                Int(3),
                Int(2),
                Int(1),
            ]),
        ),
        // struct, as the broker's scripts use it.
        case("return struct.pack('>I4', 258)", 0, &[], t("\0\0\x01\x02")),
        case(
            "return struct.pack('>I4>I2>I2', 2, 0, 0) .. 'x'",
            0,
            &[],
            t("\0\0\0\x02\0\0\0\0x"),
        ),
        case(
            "return {struct.unpack('>I4', struct.pack('>I4', 4000000000))}",
            0,
            &[],
            List(vec![Int(4_000_000_000), Int(5)]),
        ),
        case(
            "local a, pos = struct.unpack('>I2', ARGV[1], 3) return {a, pos}",
            0,
            &[b"\0\x01\0\x02"],
            List(vec![Int(2), Int(5)]),
        ),
        case(
            "return {struct.unpack('<i2', struct.pack('<i2', -2))}",
            0,
            &[],
            List(vec![Int(-2), Int(3)]),
        ),
        case(
            "return struct.pack('>Q', 1)",
            0,
            &[],
            raised(
                "ERR user_script:1: bad argument #1 to 'pack' (invalid format option 'Q')",
                1,
            ),
        ),
        case(
            "return struct.unpack('>I4', 'ab')",
            0,
            &[],
            raised(
                "ERR user_script:1: bad argument #2 to 'unpack' (data string too short)",
                1,
            ),
        ),
    ]
}

/// The keys of one case: `{p}k1`, `{p}k2` (one hash slot).
fn keys(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{{{prefix}}}k{i}")).collect()
}

fn expected(c: &Case) -> Reply {
    let sha = Script::from_lua(c.lua).sha1().to_string();
    match &c.expect {
        Reply::Error(m) => Reply::Error(m.replace("{sha}", &sha)),
        other => other.clone(),
    }
}

fn on_model(c: &Case, prefix: &str) -> Reply {
    let model = MemoryRedis::new();
    let keys = keys(prefix, c.keys);
    let mut args: Vec<&[u8]> = vec![c.lua.as_bytes()];
    let numkeys = c.keys.to_string();
    args.push(numkeys.as_bytes());
    args.extend(keys.iter().map(|k| k.as_bytes()));
    args.extend(c.argv.iter().copied());
    reply(model.execute("EVAL", &args))
}

async fn on_redis(client: &Client, c: &Case, prefix: &str) -> Reply {
    let keys = keys(prefix, c.keys);
    let argv: Vec<Value> = c
        .argv
        .iter()
        .map(|a| Value::Bytes(a.to_vec().into()))
        .collect();
    let got = client
        .eval::<Value, _, _, _>(c.lua, keys.clone(), argv)
        .await;
    let _: i64 = client.del(keys).await.unwrap_or(0);
    reply(got)
}

#[test]
fn ad_hoc_scripts_give_redis_7_replies_on_the_model() {
    let mut failures = Vec::new();
    for (i, c) in cases().iter().enumerate() {
        let got = on_model(c, &format!("lua-model-{i}"));
        if got != expected(c) {
            failures.push(format!(
                "{}\n  model: {got:?}\n  redis: {:?}",
                c.lua,
                expected(c)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A client on the real Redis, or `None` (skip) when there is none, except under CI.
async fn redis() -> Option<Client> {
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

#[tokio::test]
async fn ad_hoc_scripts_give_the_same_replies_on_the_model_and_on_redis() {
    let Some(client) = redis().await else {
        return;
    };
    let run = format!("rslua-{}-{}", std::process::id(), fastrand_suffix());
    let mut failures = Vec::new();
    for (i, c) in cases().iter().enumerate() {
        let prefix = format!("{run}-{i}");
        let on_redis = on_redis(&client, c, &prefix).await;
        let on_model = on_model(c, &prefix);
        if on_redis != on_model {
            failures.push(format!(
                "{}\n  model: {on_model:?}\n  redis: {on_redis:?}",
                c.lua
            ));
        }
    }
    let _ = client.quit().await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
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

/// A claim of up to 5 entries from `levels` through `gates`.
fn claim_of<'a>(
    levels: &'a [String],
    record: &'a ruststream_redis::Record,
    gates: &'a [ruststream_redis::Gate],
) -> ruststream_redis::Claim<'a> {
    ruststream_redis::Claim {
        levels,
        record,
        gates,
        max: 5,
        first_seq: 0,
    }
}

/// The claim pipeline's script through its typed call (`ruststream_redis::Claim`, the same the
/// readers use): the pause gate lets nothing through, then the levels are taken highest first
/// into the processing list. Returns what each call gave: (closed gate, values).
async fn typed_claim(client: Client, prefix: String) -> Vec<(Option<String>, Vec<Vec<u8>>)> {
    use ruststream_redis::{Call, Gate, Record};
    let key = |s: &str| key(&prefix, &format!("q{s}"));
    let levels = vec![key(""), key(".p1")];
    let paused = key(".paused");
    let _: i64 = client.rpush(&levels[0], vec!["a", "b"]).await.unwrap();
    let _: i64 = client.rpush(&levels[1], "c").await.unwrap();
    let () = client.set(&paused, "op", None, None, false).await.unwrap();
    let record = Record::List {
        processing: key(".processing"),
    };
    let gates = [Gate::paused(paused.clone())];
    let claim = claim_of(&levels, &record, &gates);
    let mut out = Vec::new();
    for unpause in [true, false] {
        let got = claim.call(&client).await.expect("the claim runs");
        out.push((got.closed, got.values.iter().map(|v| v.to_vec()).collect()));
        if unpause {
            let _: i64 = client.del(&paused).await.unwrap();
        }
    }
    let mut keys = claim.build().0;
    keys.push(key(".processing"));
    let _: i64 = client.del(keys).await.unwrap_or(0);
    out
}

#[tokio::test]
async fn the_typed_claim_call_gives_the_same_claims_on_the_model_and_on_redis() {
    let expect = vec![
        (Some("paused".to_owned()), Vec::new()),
        (None, vec![b"c".to_vec(), b"b".to_vec(), b"a".to_vec()]),
    ];
    on_both("claim", expect, typed_claim).await;
}

/// `operate/oldest_claim.lua` through `OldestClaim`: the claim time is read from each member
/// (`<reader>:<seq>.<seconds>.<microseconds>:<value>`), not from its score; a member of another
/// shape names none. Returns each call's reply.
async fn oldest_claim(client: Client, prefix: String) -> Vec<(u64, Option<i64>)> {
    use ruststream_redis::{Call, OldestClaim};
    let zset = key(&prefix, "q.claims");
    let members = vec![
        (1.0, "junk"),
        (3.0, "r1:2.1600000000.999999:b"),
        (5.0, "r1:1.1700000000.250000:a"),
    ];
    let mut out = Vec::new();
    let none = OldestClaim {
        zset: &zset,
        most: 10,
    };
    out.push(none.call(&client).await.expect("oldest_claim.lua runs"));
    let _: i64 = client
        .zadd(&zset, None, None, false, false, members)
        .await
        .unwrap();
    for most in [1, 2, 10] {
        let call = OldestClaim { zset: &zset, most };
        out.push(call.call(&client).await.expect("oldest_claim.lua runs"));
    }
    let _: i64 = client.del(&zset).await.unwrap_or(0);
    out
}

#[tokio::test]
async fn the_typed_oldest_claim_call_gives_the_same_reply_on_the_model_and_on_redis() {
    let expect = vec![
        (0, None),
        (1, None),
        (2, Some(1_600_000_000_999)),
        (3, Some(1_600_000_000_999)),
    ];
    on_both("oldest", expect, oldest_claim).await;
}

/// `operate/delayed.lua` through `ChangeDelayed`: a promote of the earliest takes only the
/// entries not yet due, a cancel by id counts the ids it found, a cancel of the earliest takes
/// the lowest score (the overdue entry, below the promoted ones' server time). Returns each
/// call's count, then the set's members and the hash's fields left.
async fn change_delayed(client: Client, prefix: String) -> (Vec<usize>, Vec<String>, Vec<String>) {
    use ruststream_redis::{Call, ChangeDelayed, DelayedChange, DelayedPick};
    let set = key(&prefix, "q.delayed");
    let payloads = key(&prefix, "q.delayed.payloads");
    let future = 9.0e12;
    let entries = vec![(future, "a"), (future + 1.0, "b"), (1.0, "c")];
    let _: i64 = client
        .zadd(&set, None, None, false, false, entries)
        .await
        .unwrap();
    let fields = vec![("a", "fa"), ("b", "fb"), ("c", "fc")];
    let _: i64 = client.hset(&payloads, fields).await.unwrap();
    let calls = [
        (DelayedChange::Promote, DelayedPick::Earliest(10)),
        (DelayedChange::Promote, DelayedPick::Earliest(10)),
        (DelayedChange::Cancel, DelayedPick::Ids(&["a", "zz"])),
        (DelayedChange::Cancel, DelayedPick::Earliest(1)),
    ];
    let mut counts = Vec::new();
    for (change, pick) in calls {
        let call = ChangeDelayed {
            set: &set,
            payloads: &payloads,
            change,
            pick,
        };
        counts.push(call.call(&client).await.expect("delayed.lua runs"));
    }
    let left: Vec<String> = client
        .zrange(&set, 0, -1, None, false, None, false)
        .await
        .unwrap();
    let mut fields: Vec<String> = client.hkeys(&payloads).await.unwrap();
    fields.sort();
    let _: i64 = client.del(vec![set, payloads]).await.unwrap_or(0);
    (counts, left, fields)
}

#[tokio::test]
async fn the_typed_delayed_change_call_gives_the_same_reply_on_the_model_and_on_redis() {
    let expect = (vec![2, 0, 1, 1], vec!["b".to_owned()], vec!["b".to_owned()]);
    on_both("delayed", expect, change_delayed).await;
}

/// A periodic script's reply.
#[derive(Debug, PartialEq)]
enum Periodic {
    /// A registration's: the last fired tick.
    Registered(Option<u64>),
    /// A fired tick's: whether the stored one moved.
    Fired(bool),
}

/// `periodic/register.lua` and `periodic/fired.lua` through `RegisterPeriodic` and
/// `PeriodicFired`: the last tick only moves forward, and a registration reads it. Returns each
/// call's reply, then the definition stored.
async fn periodic(client: Client, prefix: String) -> (Vec<Periodic>, String) {
    use Periodic::{Fired, Registered};
    use ruststream_redis::{Call, PeriodicFired, RegisterPeriodic};
    let registry = key(&prefix, "ruststream:periodic");
    let last = key(&prefix, "ruststream:periodic.last");
    let register = |definition| RegisterPeriodic {
        registry: &registry,
        last: &last,
        name: "nightly",
        definition,
    };
    let fired = |tick| PeriodicFired {
        last: &last,
        name: "nightly",
        tick,
    };
    let mut out = vec![Registered(
        register("{\"v\":1}").call(&client).await.unwrap(),
    )];
    for tick in [1000, 900, 1000] {
        out.push(Fired(fired(tick).call(&client).await.unwrap()));
    }
    out.push(Registered(
        register("{\"v\":2}").call(&client).await.unwrap(),
    ));
    out.push(Fired(fired(2000).call(&client).await.unwrap()));
    out.push(Registered(
        register("{\"v\":2}").call(&client).await.unwrap(),
    ));
    let definition: String = client.hget(&registry, "nightly").await.unwrap();
    let _: i64 = client.del(vec![registry, last]).await.unwrap_or(0);
    (out, definition)
}

#[tokio::test]
async fn the_typed_periodic_calls_give_the_same_replies_on_the_model_and_on_redis() {
    use Periodic::{Fired, Registered};
    let expect = (
        vec![
            Registered(None),
            Fired(true),
            Fired(false),
            Fired(false),
            Registered(Some(1000)),
            Fired(true),
            Registered(Some(2000)),
        ],
        "{\"v\":2}".to_owned(),
    );
    on_both("periodic", expect, periodic).await;
}

/// `list/push_ttl.lua` through `PushTtl`: pushes onto the left in order (more than one `LPUSH`
/// batch of 1,000 too) and sets the ttl. Returns each call's length, the list's first and last
/// values, and whether its ttl is set and at most the one given.
async fn push_ttl(client: Client, prefix: String) -> (Vec<i64>, Vec<String>, bool) {
    use ruststream_redis::{Call, PushTtl};
    let list = key(&prefix, "q");
    let ttl = Duration::from_secs(60);
    let many: Vec<Value> = (0..1500).map(|i| Value::from(format!("m{i}"))).collect();
    let mut lens = Vec::new();
    for values in [vec![Value::from("a"), Value::from("b")], many] {
        let push = PushTtl {
            list: &list,
            ttl,
            values: &values,
        };
        lens.push(push.call(&client).await.expect("push_ttl.lua runs"));
    }
    let first: Vec<String> = client.lrange(&list, 0, 0).await.unwrap();
    let last: Vec<String> = client.lrange(&list, -2, -1).await.unwrap();
    let pttl: i64 = client.pttl(&list).await.unwrap();
    let _: i64 = client.del(&list).await.unwrap_or(0);
    let ends = first.into_iter().chain(last).collect();
    (lens, ends, pttl > 0 && pttl <= 60_000)
}

#[tokio::test]
async fn the_typed_push_ttl_call_gives_the_same_reply_on_the_model_and_on_redis() {
    let expect = (
        vec![2, 1502],
        vec!["m1499".to_owned(), "b".to_owned(), "a".to_owned()],
        true,
    );
    on_both("pushttl", expect, push_ttl).await;
}

/// `list/lease.lua` through `Lease`: moves the scores of the members still in the recovery set
/// (more than one `ZADD` batch of 500 members), never adds one back, and sets the set's ttl.
/// Returns how many moved, the set's size, whether the gone member is absent, and whether the
/// ttl is set.
async fn lease(client: Client, prefix: String) -> (u64, u64, bool, bool) {
    use bytes::Bytes;
    use ruststream_redis::{Call, Lease};
    let zset = key(&prefix, "q.claims");
    let held: Vec<String> = (0..700).map(|i| format!("r1:{i}.1.0:v{i}")).collect();
    let scored: Vec<(f64, String)> = held.iter().map(|m| (1.0, m.clone())).collect();
    let _: i64 = client
        .zadd(&zset, None, None, false, false, scored)
        .await
        .unwrap();
    let mut members: Vec<Bytes> = held.into_iter().map(Bytes::from).collect();
    members.push(Bytes::from_static(b"r1:9999.1.0:gone"));
    let call = Lease {
        zset: &zset,
        ttl_ms: 60_000,
        members: &members,
    };
    let moved = call.call(&client).await.expect("lease.lua runs");
    let size: u64 = client.zcard(&zset).await.unwrap();
    let gone: Option<f64> = client.zscore(&zset, "r1:9999.1.0:gone").await.unwrap();
    let pttl: i64 = client.pttl(&zset).await.unwrap();
    let _: i64 = client.del(&zset).await.unwrap_or(0);
    (moved, size, gone.is_none(), pttl > 0 && pttl <= 60_000)
}

#[tokio::test]
async fn the_typed_lease_call_gives_the_same_reply_on_the_model_and_on_redis() {
    on_both("lease", (700, 700, true, true), lease).await;
}

/// `job.lua` through `WriteJob`: progress until a result or a failure, which is final (the
/// first one wins). Returns each write's reply, then each record's `progress`, `result`,
/// `error` and `state`, and whether the ttl is set.
async fn job(client: Client, prefix: String) -> (Vec<bool>, Vec<Vec<Option<String>>>, bool) {
    use bytes::Bytes;
    use ruststream_redis::{Call, JobKind, WriteJob};
    let done = key(&prefix, "job:done");
    let failed = key(&prefix, "job:failed");
    let ttl = Duration::from_secs(60);
    let writes = [
        (&done, JobKind::Progress, "1"),
        (&done, JobKind::Result, "\"r\""),
        (&done, JobKind::Progress, "2"),
        (&done, JobKind::Failed, "late"),
        (&failed, JobKind::Failed, "why"),
        (&failed, JobKind::Result, "\"r\""),
    ];
    let mut wrote = Vec::new();
    for (key, kind, value) in writes {
        let value = Bytes::from_static(value.as_bytes());
        let write = WriteJob {
            key,
            kind,
            value: &value,
            ttl,
        };
        wrote.push(write.call(&client).await.expect("job.lua runs"));
    }
    let mut records = Vec::new();
    for key in [&done, &failed] {
        let fields = vec!["progress", "result", "error", "state"];
        records.push(client.hmget(key, fields).await.unwrap());
    }
    let pttl: i64 = client.pttl(&done).await.unwrap();
    let _: i64 = client.del(vec![done, failed]).await.unwrap_or(0);
    (wrote, records, pttl > 0 && pttl <= 60_000)
}

#[tokio::test]
async fn the_typed_job_write_call_gives_the_same_reply_on_the_model_and_on_redis() {
    let s = |v: &str| Some(v.to_owned());
    let expect = (
        vec![true, true, false, false, true, false],
        vec![
            vec![s("1"), s("\"r\""), None, s("done")],
            vec![None, None, s("why"), s("failed")],
        ],
        true,
    );
    on_both("job", expect, job).await;
}

/// `stream/trim.lua` through `TrimAcked`: nothing without the stream or its groups, nothing
/// while a group has read nothing, then what every group has acknowledged below the lowest id
/// one still needs (a pending entry, or a last-delivered one). Redis's `XTRIM MINID ~` drops
/// whole macro nodes only (of 100 entries, `stream-node-max-entries`' default), the model drops
/// what an exact trim would: the threshold is put at the 101st entry, the first of the second
/// node, where the two agree. Returns each call's reply.
async fn trim_acked(client: Client, prefix: String) -> Vec<(u64, String)> {
    use ruststream_redis::{Call, TrimAcked};
    let stream = key(&prefix, "events");
    let trim = TrimAcked { stream: &stream };
    let mut out = vec![trim.call(&client).await.expect("trim.lua runs")];
    for i in 1..=101 {
        let id = format!("1-{i}");
        let _: String = client
            .xadd(&stream, false, None, id.as_str(), ("f", "v"))
            .await
            .unwrap();
    }
    out.push(trim.call(&client).await.expect("trim.lua runs"));
    let () = client
        .xgroup_create(&stream, "reader", "0", false)
        .await
        .unwrap();
    out.push(trim.call(&client).await.expect("trim.lua runs"));
    let _: Value = client
        .xreadgroup("reader", "c", Some(101), None, false, &stream, ">")
        .await
        .unwrap();
    let acked: Vec<String> = (1..=100).map(|i| format!("1-{i}")).collect();
    let _: i64 = client.xack(&stream, "reader", acked).await.unwrap();
    let () = client
        .xgroup_create(&stream, "late", "1-101", false)
        .await
        .unwrap();
    for _ in 0..2 {
        out.push(trim.call(&client).await.expect("trim.lua runs"));
    }
    let _: i64 = client.del(&stream).await.unwrap_or(0);
    out
}

#[tokio::test]
async fn the_typed_trim_call_gives_the_same_reply_on_the_model_and_on_redis() {
    let t = |n, id: &str| (n, id.to_owned());
    let expect = vec![
        t(0, ""),
        t(0, ""),
        t(0, "0-0"),
        t(100, "1-101"),
        t(0, "1-101"),
    ];
    on_both("trim", expect, trim_acked).await;
}

/// A frame of message `id` with the given headers (`rs.priority` puts it on a level).
fn frame(id: &str, headers: &[(&str, &str)]) -> bytes::Bytes {
    let mut h = ruststream_core::Headers::new();
    for (k, v) in headers {
        h.insert((*k).to_owned(), (*v).to_owned());
    }
    ruststream_redis::frame::encode_parts(id, 1, &h, b"{}")
}

/// Every way back to a queue through its typed call (the same the settlers, the mover, the
/// operator and the publisher use), all through `back.lua`: a retry goes onto its own level, a
/// due delayed entry onto its own level, a dead letter back onto a stream as fields with its
/// reason in `dead-history`, a unique publish once per window onto its level. Returns what each
/// key holds afterwards.
async fn the_way_back(client: &Client, prefix: &str) -> Vec<Reply> {
    use ruststream_redis::{
        Call, Dest, Later, MoveDue, Op, PublishUnique, Requeue, ScheduleLater, SettleKeys,
        SettleList, Taken, UniqueBatch,
    };
    let key = |s: &str| format!("{{{prefix}}}q{s}");
    let levels = vec![key(""), key(".p1")];
    let dest = Dest::list(levels.clone());
    let high = frame("h", &[("rs.priority", "1")]);
    let low = frame("l", &[]);
    let _: i64 = client
        .lpush(key(".processing"), vec![high.clone(), low.clone()])
        .await
        .unwrap();
    let keys = SettleKeys {
        processing: key(".processing"),
        dead: key(".dead"),
        delayed: key(".delayed"),
        payloads: key(".delayed.payloads"),
        record: key(".settles"),
    };
    let settled = SettleList {
        keys: &keys,
        dest: &dest,
        token: Some("t1".into()),
        entries: vec![
            (
                high.clone(),
                None,
                Op::Retry {
                    frame: high.clone(),
                },
            ),
            (low.clone(), None, Op::Ack),
        ],
    }
    .call(client)
    .await
    .expect("the settle runs");
    let later = [Later {
        due: ruststream_core::Due::In(Duration::ZERO),
        id: "d".into(),
        frame: frame("d", &[("rs.priority", "1")]),
        unique: None,
    }];
    let scheduled = ScheduleLater {
        set: &keys.delayed,
        payloads: &keys.payloads,
        token: "t2",
        entries: &later,
    }
    .call(client)
    .await
    .expect("the schedule runs");
    let moved = MoveDue {
        set: &keys.delayed,
        payloads: &keys.payloads,
        dead: Some(&keys.dead),
        dest: &dest,
        most: 10,
    }
    .call(client)
    .await
    .expect("the mover runs");
    let _: i64 = client
        .lpush(&keys.dead, frame("x", &[("reason", "max-attempts")]))
        .await
        .unwrap();
    let stream = Dest::Stream {
        key: key(".s"),
        bound: "maxlen:10".into(),
    };
    let requeued = Requeue {
        dead: &keys.dead,
        dest: &stream,
        take: Taken::Oldest(5),
    }
    .call(client)
    .await
    .expect("the requeue runs");
    let mut batch = UniqueBatch::default();
    for _ in 0..2 {
        batch.frame(
            key(".unique:u"),
            Duration::from_secs(60),
            Value::Bytes(frame("u", &[("rs.priority", "1")])),
        );
    }
    let published = PublishUnique {
        dest: &dest,
        token: "t3",
        batch: &batch,
    }
    .call(client)
    .await
    .expect("the unique publish runs");
    let mut out = vec![
        Int(settled),
        Int(scheduled as i64),
        Int(moved.moved),
        Int(requeued),
        Int(published as i64),
    ];
    for l in &levels {
        out.push(reply(client.lrange(l, 0, -1).await));
    }
    let fields: Result<Value, _> = client
        .custom(
            fred::cmd!("XRANGE"),
            vec![key(".s"), "-".to_owned(), "+".to_owned()],
        )
        .await;
    // The entry's id differs between the two: keep its fields only.
    out.push(match reply(fields) {
        List(entries) => List(
            entries
                .into_iter()
                .map(|e| match e {
                    List(mut parts) if parts.len() == 2 => parts.remove(1),
                    other => other,
                })
                .collect(),
        ),
        other => other,
    });
    let mut all: Vec<String> = levels.clone();
    for s in [
        ".processing",
        ".dead",
        ".delayed",
        ".delayed.payloads",
        ".settles",
        ".s",
        ".unique:u",
    ] {
        all.push(key(s));
    }
    let _: i64 = client.del(all).await.unwrap_or(0);
    out
}

#[tokio::test]
async fn every_way_back_to_a_queue_gives_the_same_queues_on_the_model_and_on_redis() {
    let model = MemoryRedis::new();
    let client = model.client().expect("a model client");
    client.init().await.expect("init");
    let got = the_way_back(&client, "back-model").await;
    // Both claims owned (an ack and a retry); one scheduled, moved, requeued; the unique
    // publish counts both of its messages (one publish's token) and enqueues one.
    assert_eq!(
        &got[..5],
        &[Int(2), Int(1), Int(1), Int(1), Int(2)],
        "{got:?}"
    );
    assert_eq!(got[5], List(Vec::new()), "level 0 gets nothing: {got:?}");
    let List(high) = &got[6] else {
        panic!("level 1 is a list: {got:?}")
    };
    assert_eq!(
        high.len(),
        3,
        "the retry, the due entry and the unique publish: {got:?}"
    );
    let List(stream) = &got[7] else {
        panic!("the stream's entries: {got:?}")
    };
    let fields = [
        "rs.id",
        "x",
        "rs.attempt",
        "1",
        "dead-history",
        "max-attempts",
        "payload",
        "{}",
    ];
    assert_eq!(
        stream,
        &[List(fields.iter().map(|f| t(f)).collect())],
        "the dead letter as a stream entry, its reason in its history"
    );
    let Some(redis) = redis().await else {
        return;
    };
    let prefix = format!("rsback-{}-{}", std::process::id(), fastrand_suffix());
    assert_eq!(the_way_back(&redis, &prefix).await, got);
    let _ = redis.quit().await;
}

/// What the concurrency cap's gate let two claims of each kind take: (closed gate, how many
/// taken, how many held back).
type CapRun = Vec<(Option<String>, usize, u64)>;

/// The concurrency cap (`Gate::cap_list`, `Gate::cap_group`) through the typed calls: a list
/// capped at 3 with 2 entries in its processing list takes 1 of 5 and then none (the cap
/// closed, the 4 left held back); a group capped at 2 reads 2 of 5 and then none (3 held back).
async fn typed_cap(client: &Client, prefix: &str) -> CapRun {
    use ruststream_redis::{Call, Gate, Record, StreamRead};
    let key = |s: &str| format!("{{{prefix}}}q{s}");
    let levels = vec![key("")];
    let processing = key(".processing");
    let _: i64 = client
        .rpush(&levels[0], vec!["a", "b", "c", "d", "e"])
        .await
        .unwrap();
    let _: i64 = client.rpush(&processing, vec!["x", "y"]).await.unwrap();
    let record = Record::List {
        processing: processing.clone(),
    };
    let gates = [Gate::cap_list(processing.clone(), 3)];
    let claim = claim_of(&levels, &record, &gates);
    let mut out = Vec::new();
    for _ in 0..2 {
        let got = claim.call(client).await.expect("the claim runs");
        out.push((got.closed, got.values.len(), got.held.entries));
    }
    let stream = key(".stream");
    let _: Value = client
        .custom(
            fred::cmd!("XGROUP"),
            vec!["CREATE", stream.as_str(), "g", "0", "MKSTREAM"],
        )
        .await
        .unwrap();
    for i in 0..5 {
        let _: Value = client
            .custom(
                fred::cmd!("XADD"),
                vec![stream.as_str(), "*", "n", &i.to_string()],
            )
            .await
            .unwrap();
    }
    let gates = [Gate::cap_group(stream.clone(), "g", 2)];
    let read = StreamRead {
        stream: &stream,
        group: "g",
        consumer: "c",
        gates: &gates,
        max: 5,
    };
    for _ in 0..2 {
        let got = read.call(client).await.expect("the read runs");
        let n = match &got.reply {
            Value::Array(streams) => match streams.first() {
                Some(Value::Array(kv)) => match kv.get(1) {
                    Some(Value::Array(entries)) => entries.len(),
                    _ => 0,
                },
                _ => 0,
            },
            _ => 0,
        };
        out.push((got.closed, n, got.held.entries));
    }
    let _: i64 = client
        .del(vec![levels[0].clone(), processing, stream])
        .await
        .unwrap_or(0);
    out
}

#[tokio::test]
async fn the_cap_gate_takes_the_same_on_the_model_and_on_redis() {
    let model = MemoryRedis::new();
    let client = model.client().expect("a model client");
    client.init().await.expect("init");
    let cap = Some("cap".to_owned());
    // A claim the cap cut short counts what stayed queued, up to what it wanted more.
    let expect = vec![(None, 1, 4), (cap.clone(), 0, 4), (None, 2, 3), (cap, 0, 3)];
    assert_eq!(typed_cap(&client, "cap-model").await, expect);
    let Some(redis) = redis().await else {
        return;
    };
    let prefix = format!("rscap-{}-{}", std::process::id(), fastrand_suffix());
    assert_eq!(typed_cap(&redis, &prefix).await, expect);
    let _ = redis.quit().await;
}
