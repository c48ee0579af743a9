//! Ad-hoc scripts (not the broker's) sent with `EVAL`, `SCRIPT LOAD` and `EVALSHA` give the
//! replies Redis 7 gives, on the model and on Redis.

use fred::prelude::*;
use fred::types::scripts::Script;
use ruststream_testing::MemoryRedis;

use crate::Reply::{self, Error as E, Int, List, Nil};
use crate::{fastrand_suffix, redis, reply, t};

/// One ad-hoc script: its text, how many of `{k1, k2}` it takes as `KEYS`, its `ARGV`, and the
/// reply Redis 7 gives (`{sha}` in an error stands for the script's SHA-1).
struct Case {
    lua: &'static str,
    keys: usize,
    argv: &'static [&'static [u8]],
    expect: Reply,
    /// Whether it shows how Lua numbers are written (see [`number_format`]).
    number_format: bool,
}

fn case(lua: &'static str, keys: usize, argv: &'static [&'static [u8]], expect: Reply) -> Case {
    Case {
        lua,
        keys,
        argv,
        expect,
        number_format: false,
    }
}

/// A case whose reply shows how a Lua number passed to a command is written: Redis 7's `%.17g`,
/// which the model follows. Valkey writes the shortest form instead (see `valkey_as_redis`).
fn number_format(c: Case) -> Case {
    Case {
        number_format: true,
        ..c
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
        number_format(case(
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
        )),
        number_format(case(
            "redis.call('SET', KEYS[1], -0.0) return redis.call('GET', KEYS[1])",
            1,
            &[],
            t("-0"),
        )),
        // Lua 5.1 itself: -0.0 and 0 are one constant of a function, so the LRANGE below gets
        // "-0", which Redis does not read as an integer.
        number_format(case(
            "redis.call('RPUSH', KEYS[1], -0.0)\nreturn redis.call('LRANGE', KEYS[1], 0, -1)",
            1,
            &[],
            raised("ERR value is not an integer or out of range", 2),
        )),
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

#[tokio::test]
async fn ad_hoc_scripts_give_the_same_replies_on_the_model_and_on_redis() {
    let Some(client) = redis().await else {
        return;
    };
    let run = format!("rslua-{}-{}", std::process::id(), fastrand_suffix());
    let valkey = crate::is_valkey(&client).await;
    let mut failures = Vec::new();
    for (i, c) in cases().iter().enumerate() {
        if valkey && c.number_format {
            continue;
        }
        let prefix = format!("{run}-{i}");
        let mut on_redis = on_redis(&client, c, &prefix).await;
        let mut on_model = on_model(c, &prefix);
        if valkey {
            on_redis = crate::valkey_as_redis(on_redis);
            on_model = crate::valkey_as_redis(on_model);
        }
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
