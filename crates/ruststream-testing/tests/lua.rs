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
async fn typed_claim(client: &Client, prefix: &str) -> Vec<(Option<String>, Vec<Vec<u8>>)> {
    use ruststream_redis::{Gate, Record};
    let key = |s: &str| format!("{{{prefix}}}q{s}");
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
        let got = claim.call(client).await.expect("the claim runs");
        out.push((got.closed, got.values.iter().map(|v| v.to_vec()).collect()));
        if unpause {
            let _: i64 = client.del(&paused).await.unwrap();
        }
    }
    let mut keys = claim.keys();
    keys.push(key(".processing"));
    let _: i64 = client.del(keys).await.unwrap_or(0);
    out
}

#[tokio::test]
async fn the_typed_claim_call_gives_the_same_claims_on_the_model_and_on_redis() {
    let model = MemoryRedis::new();
    let client = model.client().expect("a model client");
    client.init().await.expect("init");
    let expect = vec![
        (Some("paused".to_owned()), Vec::new()),
        (None, vec![b"c".to_vec(), b"b".to_vec(), b"a".to_vec()]),
    ];
    assert_eq!(typed_claim(&client, "claim-model").await, expect);
    let Some(redis) = redis().await else {
        return;
    };
    let prefix = format!("rsclaim-{}-{}", std::process::id(), fastrand_suffix());
    assert_eq!(typed_claim(&redis, &prefix).await, expect);
    let _ = redis.quit().await;
}

/// What the concurrency cap's gate let two claims of each kind take: (closed gate, how many
/// taken, how many held back).
type CapRun = Vec<(Option<String>, usize, u64)>;

/// The concurrency cap (`Gate::cap_list`, `Gate::cap_group`) through the typed calls: a list
/// capped at 3 with 2 entries in its processing list takes 1 of 5 and then none (the cap
/// closed, the 4 left held back); a group capped at 2 reads 2 of 5 and then none (3 held back).
async fn typed_cap(client: &Client, prefix: &str) -> CapRun {
    use ruststream_redis::{Gate, Record, StreamRead};
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
    // A claim the cap cut short counts what stayed queued past what it took (claim.lua).
    let expect = vec![(None, 1, 3), (cap.clone(), 0, 4), (None, 2, 3), (cap, 0, 3)];
    assert_eq!(typed_cap(&client, "cap-model").await, expect);
    let Some(redis) = redis().await else {
        return;
    };
    let prefix = format!("rscap-{}-{}", std::process::id(), fastrand_suffix());
    assert_eq!(typed_cap(&redis, &prefix).await, expect);
    let _ = redis.quit().await;
}
