//! Scripts: `SCRIPT LOAD|EXISTS|FLUSH`, `EVAL` and `EVALSHA` run the Lua text the client sent
//! on an embedded Lua 5.1, the version Redis embeds, as Redis runs it (see `engine` and
//! `prelude.lua`): a script is stored under the SHA-1 of its text, `EVALSHA` of one not loaded
//! fails with `NOSCRIPT` (which fred's `evalsha_with_reload` answers with `SCRIPT LOAD`), and
//! each `redis.call` runs through the model's command executor against the same state, inside
//! the same lock, so a script is atomic. The model knows nothing of which scripts the broker
//! has: changing a script's Lua changes what the model does.

mod convert;
mod engine;
mod structlib;

use bytes::Bytes;
use fred::types::Value;

use super::data::{R, err};
use super::{State, commands, publishes};
pub(crate) use engine::Engine;
use engine::sha1_hex;

/// Commands a script may not send, as on Redis: scripts, transactions, subscriptions, and the
/// blocking commands.
const NOT_IN_SCRIPTS: &[&str] = &[
    "EVAL",
    "EVALSHA",
    "EVAL_RO",
    "EVALSHA_RO",
    "SCRIPT",
    "FCALL",
    "FCALL_RO",
    "FUNCTION",
    "MULTI",
    "EXEC",
    "DISCARD",
    "WATCH",
    "UNWATCH",
    "SUBSCRIBE",
    "PSUBSCRIBE",
    "SSUBSCRIBE",
    "UNSUBSCRIBE",
    "PUNSUBSCRIBE",
    "SUNSUBSCRIBE",
    "BLPOP",
    "BRPOP",
    "BLMOVE",
    "BRPOPLPUSH",
    "BLMPOP",
    "BZPOPMIN",
    "BZPOPMAX",
    "BZMPOP",
];

/// `SCRIPT ..`, `EVAL` or `EVALSHA` (`name` upper case).
pub(crate) fn command(st: &mut State, now: u64, name: &str, args: &[Bytes]) -> R<Value> {
    match name {
        "SCRIPT" => script(st, args),
        _ => eval(st, now, name, args),
    }
}

fn wrong_args(name: &str) -> fred::error::Error {
    err(format!(
        "ERR wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    ))
}

/// The model's Lua state, taken out of `st` while a script runs (so its `redis.call` can borrow
/// `st`); made on first use, and again should a run ever have lost it.
fn take_engine(st: &mut State) -> R<Engine> {
    match st.lua.take() {
        Some(engine) => Ok(engine),
        None => Engine::new().map_err(|e| {
            err(format!(
                "ERR the in-memory Redis model could not start Lua: {e}"
            ))
        }),
    }
}

/// Compiles `text` and stores it under its SHA-1, which it returns.
fn load(st: &mut State, text: &Bytes) -> R<String> {
    let sha = sha1_hex(text);
    let mut engine = take_engine(st)?;
    let compiled = engine.compile(&sha, text);
    st.lua = Some(engine);
    compiled.map_err(err)?;
    st.scripts.insert(sha.clone(), text.clone());
    Ok(sha)
}

fn script(st: &mut State, args: &[Bytes]) -> R<Value> {
    let sub = args
        .first()
        .map(|s| String::from_utf8_lossy(s).to_ascii_uppercase())
        .ok_or_else(|| wrong_args("SCRIPT"))?;
    match sub.as_str() {
        "LOAD" => {
            let [_, text] = args else {
                return Err(wrong_args("SCRIPT|LOAD"));
            };
            Ok(Value::Bytes(Bytes::from(load(st, text)?)))
        }
        "EXISTS" => Ok(Value::Array(
            args[1..]
                .iter()
                .map(|s| {
                    let sha = String::from_utf8_lossy(s).to_ascii_lowercase();
                    Value::Integer(i64::from(st.scripts.contains_key(&sha)))
                })
                .collect(),
        )),
        "FLUSH" => {
            st.scripts.clear();
            if let Some(engine) = st.lua.as_mut() {
                engine.flush();
            }
            Ok(Value::String("OK".into()))
        }
        other => Err(err(format!("ERR unknown subcommand 'SCRIPT {other}'"))),
    }
}

/// `EVAL text numkeys key.. arg..` or `EVALSHA sha1 numkeys key.. arg..`.
fn eval(st: &mut State, now: u64, name: &str, args: &[Bytes]) -> R<Value> {
    let [script, numkeys, rest @ ..] = args else {
        return Err(wrong_args(name));
    };
    let numkeys = commands::parse_i64(numkeys)?;
    let numkeys =
        usize::try_from(numkeys).map_err(|_| err("ERR Number of keys can't be negative"))?;
    if numkeys > rest.len() {
        return Err(err(
            "ERR Number of keys can't be greater than number of args",
        ));
    }
    let (keys, argv) = rest.split_at(numkeys);
    let sha = if name == "EVAL" {
        load(st, script)?
    } else {
        String::from_utf8_lossy(script).to_ascii_lowercase()
    };
    let Some(text) = st.scripts.get(&sha).cloned() else {
        return Err(err("NOSCRIPT No matching script. Please use EVAL."));
    };
    commands::check_slot(st, &keys.iter().map(|k| &k[..]).collect::<Vec<_>>())?;
    let mut engine = take_engine(st)?;
    let outcome = engine
        .compile(&sha, &text)
        .and_then(|()| engine.run(&sha, keys, argv, |words| redis_call(st, now, words)));
    st.lua = Some(engine);
    publishes::record_script(st);
    outcome.map_err(err)
}

/// One `redis.call` of a script: the reply, or the error reply's text.
fn redis_call(st: &mut State, now: u64, words: &[Bytes]) -> Result<Value, String> {
    let (name, args) = words.split_first().ok_or_else(|| {
        "ERR Please specify at least one argument for this redis lib call".to_owned()
    })?;
    let name = String::from_utf8_lossy(name).to_ascii_uppercase();
    if NOT_IN_SCRIPTS.contains(&name.as_str()) {
        return Err("ERR This Redis command is not allowed from script".to_owned());
    }
    publishes::note_script_command(st, &name);
    commands::execute(st, now, &name, args).map_err(|e| {
        let details = e.details();
        if details.starts_with("ERR wrong number of arguments") {
            "ERR Wrong number of args calling Redis command from script".to_owned()
        } else {
            details.to_owned()
        }
    })
}
