//! One embedded Lua 5.1 state running scripts as Redis runs them: each script's text compiled
//! once (as `@user_script`, so errors read `user_script:3: ...`), and each run in a fresh
//! environment (see `prelude.lua`) under a message handler that turns any error into Redis's
//! error reply, `<message> script: <sha1>, on @user_script:<line>.`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fred::types::Value;
use mlua::{
    Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Value as LuaValue, VmState,
};

use super::convert;
use super::structlib::{self, Arg};

/// The chunk name of every script: Redis's, so error messages and lines read the same.
const CHUNK: &str = "@user_script";

/// How long a script may run (real time) before the model stops it: a test must not hang on a
/// script that never ends (Redis would go on running it, answering other clients `BUSY`).
const TIME_LIMIT: Duration = Duration::from_secs(5);

/// What a script run gives: its reply, or an error reply's text.
pub(crate) type Outcome = Result<Value, String>;

/// A Redis error reply raised by `redis.call`: uncaught, its text is the script's error reply
/// (with no `ERR` added, as Redis does).
#[derive(Debug)]
struct ReplyError(String);

impl std::fmt::Display for ReplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReplyError {}

/// The model's Lua: the state, the prelude's environment builder, and compiled scripts.
pub(crate) struct Engine {
    lua: Lua,
    new_env: Function,
    xpcall: Function,
    on_error: Function,
    compiled: HashMap<String, Function>,
    /// When the running script started, for the time limit.
    started: Arc<Mutex<Option<Instant>>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("compiled", &self.compiled.len())
            .finish_non_exhaustive()
    }
}

/// SHA-1 of a script's text, in lower-case hex: the name Redis gives it.
pub(crate) fn sha1_hex(text: &[u8]) -> String {
    use sha1::Digest as _;
    let digest = sha1::Sha1::digest(text);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl Engine {
    /// A Lua 5.1 state with the libraries Redis loads and the model's prelude.
    pub(crate) fn new() -> mlua::Result<Self> {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )?;
        let new_env: Function = lua
            .load(include_str!("prelude.lua"))
            .set_name("=ruststream-model prelude")
            .call((
                lua.create_function(pack)?,
                lua.create_function(unpack)?,
                lua.create_function(|lua, text: mlua::LuaString| {
                    lua.create_string(sha1_hex(&text.as_bytes()))
                })?,
                lua.create_function(|_, (level, message): (i64, mlua::LuaString)| {
                    tracing::debug!(level, message = %message.to_string_lossy(), "redis.log");
                    Ok(())
                })?,
                lua.create_function(|_, e: LuaValue| Ok(error_text(&e)))?,
            ))?;
        let xpcall = lua.globals().get("xpcall")?;
        let on_error = lua.create_function(on_error)?;
        let started = Arc::new(Mutex::new(None::<Instant>));
        let clock = started.clone();
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(100_000),
            move |_, _| {
                let since = *clock.lock().unwrap_or_else(PoisonError::into_inner);
                if since.is_some_and(|s| s.elapsed() > TIME_LIMIT) {
                    return Err(mlua::Error::RuntimeError(format!(
                        "the script ran for over {TIME_LIMIT:?}: the in-memory Redis model does not implement long-running scripts (Redis would answer BUSY to other clients meanwhile)"
                    )));
                }
                Ok(VmState::Continue)
            },
        )?;
        Ok(Self {
            lua,
            new_env,
            xpcall,
            on_error,
            compiled: HashMap::new(),
            started,
        })
    }

    /// Compiles `text` (a no-op when `sha` is compiled already); `Err` is the error reply.
    pub(crate) fn compile(&mut self, sha: &str, text: &[u8]) -> Result<(), String> {
        if self.compiled.contains_key(sha) {
            return Ok(());
        }
        let body = shebang_body(text)?;
        let f = self
            .lua
            .load(&*body)
            .set_name(CHUNK)
            .into_function()
            .map_err(|e| {
                let message = match &e {
                    mlua::Error::SyntaxError { message, .. } => message.clone(),
                    other => describe(other),
                };
                format!("ERR Error compiling script (new function): {message}")
            })?;
        self.compiled.insert(sha.to_owned(), f);
        Ok(())
    }

    /// Forgets every compiled script (`SCRIPT FLUSH`).
    pub(crate) fn flush(&mut self) {
        self.compiled.clear();
    }

    /// Runs the compiled script `sha` with `keys` and `argv`; `command` runs each `redis.call`
    /// and returns the reply or the error reply's text.
    pub(crate) fn run(
        &mut self,
        sha: &str,
        keys: &[Bytes],
        argv: &[Bytes],
        command: impl FnMut(&[Bytes]) -> Result<Value, String>,
    ) -> Outcome {
        let Some(script) = self.compiled.get(sha) else {
            return Err("NOSCRIPT No matching script. Please use EVAL.".to_owned());
        };
        *self.started.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        let command = RefCell::new(command);
        let run_command = |args: &MultiValue| -> Result<Value, String> {
            let words = arguments(args)?;
            let mut command = command
                .try_borrow_mut()
                .map_err(|_| "ERR redis.call re-entered".to_owned())?;
            (*command)(&words)
        };
        let ran = self.lua.scope(|scope| {
            let lua = &self.lua;
            let call = scope.create_function(|lua, args: MultiValue| match run_command(&args) {
                Ok(reply) => convert::reply_to_lua(lua, reply),
                Err(message) => Err(mlua::Error::external(ReplyError(message))),
            })?;
            let pcall =
                scope.create_function(|lua, args: MultiValue| match run_command(&args) {
                    Ok(reply) => convert::reply_to_lua(lua, reply),
                    Err(message) => convert::error_table(lua, &message),
                })?;
            let env: Table =
                self.new_env
                    .call((call, pcall, strings(lua, keys)?, strings(lua, argv)?))?;
            script.set_environment(env)?;
            let result: MultiValue = self.xpcall.call((script, &self.on_error))?;
            Ok(outcome(sha, &result))
        });
        *self.started.lock().unwrap_or_else(PoisonError::into_inner) = None;
        ran.unwrap_or_else(|e| Err(format!("ERR {}", describe(&e))))
    }
}

/// A Lua table of byte strings, 1-based.
fn strings(lua: &Lua, items: &[Bytes]) -> mlua::Result<Table> {
    let table = lua.create_table_with_capacity(items.len(), 0)?;
    for item in items {
        table.raw_push(lua.create_string(item)?)?;
    }
    Ok(table)
}

/// The arguments of `redis.call`: the command's words.
fn arguments(args: &MultiValue) -> Result<Vec<Bytes>, String> {
    if args.is_empty() {
        return Err("ERR Please specify at least one argument for this redis lib call".to_owned());
    }
    args.iter()
        .map(|a| {
            convert::argument(a).ok_or_else(|| {
                "ERR Lua redis lib command arguments must be strings or integers".to_owned()
            })
        })
        .collect()
}

/// What `xpcall(script, on_error)` returned, as the script's reply.
fn outcome(sha: &str, result: &MultiValue) -> Outcome {
    let mut values = result.iter();
    let ok = matches!(values.next(), Some(LuaValue::Boolean(true)));
    let value = values.next().cloned().unwrap_or(LuaValue::Nil);
    if ok {
        return convert::lua_to_reply(&value);
    }
    let LuaValue::Table(failure) = &value else {
        return Err(format!("ERR {} script: {sha}", lua_text(&value)));
    };
    let message = failure
        .raw_get::<String>("message")
        .unwrap_or_else(|_| "ERR unknown error".to_owned());
    Err(
        match failure.raw_get::<Option<usize>>("line").ok().flatten() {
            Some(line) => format!("{message} script: {sha}, on {CHUNK}:{line}."),
            None => format!("{message} script: {sha}"),
        },
    )
}

/// The message handler of a script run: the error's reply text and the script line it was
/// raised at (the innermost frame of the script's own code, not the prelude's `redis.call`).
fn on_error(lua: &Lua, error: LuaValue) -> mlua::Result<Table> {
    let message = match &error {
        LuaValue::Table(t) => match t.raw_get::<LuaValue>("err") {
            Ok(LuaValue::String(e)) => e.to_string_lossy(),
            _ => "ERR the script raised an error table without an 'err' field".to_owned(),
        },
        LuaValue::Error(e) => match e.downcast_ref::<ReplyError>() {
            Some(reply) => reply.0.clone(),
            None => format!("ERR {}", describe(e)),
        },
        other => format!("ERR {}", lua_text(other)),
    };
    let failure = lua.create_table()?;
    failure.raw_set("message", message)?;
    failure.raw_set("line", script_line(lua))?;
    Ok(failure)
}

/// The current line of the innermost frame running the script's code.
fn script_line(lua: &Lua) -> Option<usize> {
    for level in 0..200 {
        let frame = lua.inspect_stack(level, |d| {
            (d.source().source.as_deref() == Some(CHUNK)).then(|| d.current_line())
        })?;
        if let Some(line) = frame {
            return line;
        }
    }
    None
}

/// An error value as Lua's `tostring` would show it (an mlua error: its message).
fn lua_text(v: &LuaValue) -> String {
    match v {
        LuaValue::Nil => "nil".to_owned(),
        LuaValue::Boolean(b) => b.to_string(),
        LuaValue::String(s) => s.to_string_lossy(),
        #[allow(clippy::cast_precision_loss)]
        LuaValue::Integer(i) => convert::format_number(*i as f64),
        LuaValue::Number(n) => convert::format_number(*n),
        LuaValue::Error(e) => describe(e),
        other => other.type_name().to_owned(),
    }
}

/// An error caught by the script's `pcall`, as its message.
fn error_text(e: &LuaValue) -> String {
    match e {
        LuaValue::Error(e) => match e.downcast_ref::<ReplyError>() {
            Some(reply) => reply.0.clone(),
            None => describe(e),
        },
        other => lua_text(other),
    }
}

/// Where the function calling the running Rust function is, as Lua's `luaL_where` writes it
/// (`user_script:3: `), for errors raised as C functions raise them.
fn caller_position(lua: &Lua) -> String {
    lua.inspect_stack(1, |d| {
        let line = d.current_line()?;
        let source = d.source().short_src?.into_owned();
        Some(format!("{source}:{line}: "))
    })
    .flatten()
    .unwrap_or_default()
}

/// An mlua error's message, without mlua's wrapping (callback frames, tracebacks).
fn describe(e: &mlua::Error) -> String {
    match e {
        mlua::Error::CallbackError { cause, .. } => describe(cause),
        mlua::Error::RuntimeError(m) => m.clone(),
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// A Lua error with the caller's position, as `luaL_error` raises it.
fn raise(lua: &Lua, message: &str) -> mlua::Error {
    mlua::Error::RuntimeError(format!("{}{message}", caller_position(lua)))
}

/// `struct.pack(format, values...)`.
fn pack(lua: &Lua, args: MultiValue) -> mlua::Result<mlua::LuaString> {
    let mut args = args.into_iter();
    let format = format_arg(lua, args.next(), "pack")?;
    let values: Vec<Arg> = args.map(|v| number_arg(lua, v)).collect();
    match format.and_then(|f| structlib::pack(&f, &values)) {
        Ok(packed) => lua.create_string(packed),
        Err(message) => Err(raise(lua, &message)),
    }
}

/// `struct.unpack(format, data [, init])`: the values, then the position after them.
fn unpack(lua: &Lua, args: MultiValue) -> mlua::Result<MultiValue> {
    let mut args = args.into_iter();
    let format = format_arg(lua, args.next(), "unpack")?;
    let data = match args.next() {
        Some(LuaValue::String(s)) => Ok(s.as_bytes().to_vec()),
        other => Err(format!(
            "bad argument #2 to 'unpack' (string expected, got {})",
            other.as_ref().map_or("no value", LuaValue::type_name)
        )),
    };
    let init = match args.next() {
        None | Some(LuaValue::Nil) => Ok(1),
        Some(v) => match number_arg(lua, v) {
            #[allow(clippy::cast_possible_truncation)]
            Arg::Number(n) => Ok(n as i64),
            Arg::Other(t) => Err(format!(
                "bad argument #3 to 'unpack' (number expected, got {t})"
            )),
        },
    };
    let unpacked =
        format.and_then(|f| data.and_then(|d| init.and_then(|i| structlib::unpack(&f, &d, i))));
    let (values, next) = unpacked.map_err(|message| raise(lua, &message))?;
    let mut out: Vec<LuaValue> = values.into_iter().map(LuaValue::Number).collect();
    #[allow(clippy::cast_precision_loss)]
    out.push(LuaValue::Number(next as f64));
    Ok(MultiValue::from_iter(out))
}

/// The format argument: a string (a number reads as its text, as in Lua).
fn format_arg(
    lua: &Lua,
    v: Option<LuaValue>,
    function: &str,
) -> mlua::Result<Result<Vec<u8>, String>> {
    let type_name = v.as_ref().map_or("no value", LuaValue::type_name);
    Ok(
        match v.map(|v| lua.coerce_string(v)).transpose()?.flatten() {
            Some(s) => Ok(s.as_bytes().to_vec()),
            None => Err(format!(
                "bad argument #1 to '{function}' (string expected, got {type_name})"
            )),
        },
    )
}

/// A number argument as Lua reads one (numeric strings included).
fn number_arg(lua: &Lua, v: LuaValue) -> Arg {
    let type_name = v.type_name();
    match lua.coerce_number(v) {
        Ok(Some(n)) => Arg::Number(n),
        _ => Arg::Other(type_name),
    }
}

/// The code of a script: Redis 7 reads a first line `#!lua [flags=a,b]` as the script's engine
/// and flags and does not run it; it becomes an empty line here, so line numbers stay. The
/// model accepts the flags Redis knows and does not act on them (it has no maxmemory, replicas
/// or cluster nodes).
fn shebang_body(text: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    const FLAGS: [&str; 5] = [
        "no-writes",
        "allow-oom",
        "allow-stale",
        "no-cluster",
        "allow-cross-slot-keys",
    ];
    if !text.starts_with(b"#!") {
        return Ok(std::borrow::Cow::Borrowed(text));
    }
    let end = text.iter().position(|&b| b == b'\n').unwrap_or(text.len());
    let line = String::from_utf8_lossy(&text[2..end]);
    let mut words = line.split_whitespace();
    if words.next() != Some("lua") {
        return Err("ERR Could not find engine in script shebang".to_owned());
    }
    for word in words {
        let flags = word
            .strip_prefix("flags=")
            .ok_or_else(|| "ERR Unknown lua shebang option".to_owned())?;
        for flag in flags.split(',').filter(|f| !f.is_empty()) {
            if !FLAGS.contains(&flag) {
                return Err(format!("ERR Unexpected flag in script shebang: {flag}"));
            }
        }
    }
    Ok(std::borrow::Cow::Owned(text[end..].to_vec()))
}
