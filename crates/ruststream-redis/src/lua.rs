//! Composing the scripts from their `.lua` files: a script's own file, with the shared parts it
//! needs (its `-- needs:` header line, read and ordered by [`compose`]) put after its first line
//! when that line is a `#!lua` shebang (Redis reads a script's flags from its first line only),
//! and [`Call`], the one shape of every script's typed call.
//!
//! Commands: `EVALSHA` of a call's script (`SCRIPT LOAD` on `NOSCRIPT`), through [`Call::call`]
//! or, for the calls whose replies are read as frames, [`call_frame`].

use std::future::Future;

use fred::prelude::*;
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand};
use ruststream_core::{ErrorKind, Result};

use crate::error::{core, is_noscript};
use crate::reply::{Reply, frame_error};

mod compose;

/// One call of a script. Each script has one type implementing this: it builds the script's
/// KEYS and ARGV and reads its reply, so the script's header and that type are the only two
/// places its arguments are written (the readers, the settlers, the operator and the Lua tests
/// of `ruststream-testing` all call it through the type).
pub trait Call {
    /// What the script's reply is read as.
    type Reply;

    /// The script this calls.
    fn script(&self) -> &'static Script;

    /// The script's KEYS and ARGV.
    fn build(&self) -> (Vec<String>, Vec<Value>);

    /// Reads the script's reply.
    fn parse(&self, reply: Value) -> Self::Reply;

    /// Runs the script on `client` (`EVALSHA`, loading it on `NOSCRIPT`).
    ///
    /// # Errors
    /// The script's error reply or the connection's, as a typed broker error.
    fn call(&self, client: &Client) -> impl Future<Output = Result<Self::Reply>> + Send
    where
        Self: Sync,
    {
        async move {
            let (keys, args) = self.build();
            let reply: Value = self
                .script()
                .evalsha_with_reload(client, keys, args)
                .await
                .map_err(|e| script_error(self.script(), e))?;
            Ok(self.parse(reply))
        }
    }
}

/// Runs `call`'s script on `client` ([`evalsha_frame_with`], with [`once`]'s options when
/// `once`): the reply's RESP frame, for the calls that read their replies in one pass.
///
/// # Errors
/// The script's error reply or the connection's, as a typed broker error.
pub(crate) async fn call_frame(
    call: &(impl Call + Sync),
    client: &Client,
    once: bool,
) -> Result<Reply> {
    let (keys, args) = call.build();
    let options = once.then(self::once);
    evalsha_frame_with(client, options.as_ref(), call.script(), keys, args).await
}

/// fred's options for a command that must run when it is sent or not at all: one that was in
/// flight when its connection dropped fails rather than being sent again after the reconnect,
/// and one sent while fred knows the connection is down fails at once rather than waiting for
/// it. A claim that sweeps is one: run after an outage, it would find the leases of live
/// workers aged by the outage (`crate::rejoin`). Not for a client of the in-memory model,
/// which fred never marks connected (`ReadConn::sweeps_once`).
pub(crate) fn once() -> Options {
    Options {
        fail_fast: true,
        ..Options::default()
    }
}

/// Runs `script` on `client` (`EVALSHA`, `SCRIPT LOAD` and once more on `NOSCRIPT`) with fred's
/// per-command `options` (e.g. [`once`]; `None` for the client's), and returns its reply's RESP
/// frame as fred received it, not read into [`Value`]s: for the calls on the consume path, which
/// read their replies in one pass (a claim's entries, a stream read's). The command is routed by
/// its first key (all of a script's keys share a slot).
///
/// # Errors
/// The script's error reply or the connection's, as a typed broker error.
pub(crate) async fn evalsha_frame_with(
    client: &Client,
    options: Option<&Options>,
    script: &Script,
    keys: Vec<String>,
    args: Vec<Value>,
) -> Result<Reply> {
    let hash = keys
        .first()
        .map_or(ClusterHash::Random, |k| crate::keys::slot_of(k));
    let cmd = CustomCommand::new_static("EVALSHA", hash, false);
    let mut argv: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
    argv.push(script.sha1().clone().into());
    argv.push(int(keys.len()));
    argv.extend(keys.into_iter().map(Value::from));
    argv.extend(args);
    let reply = match custom_raw(client, options, cmd.clone(), argv.clone()).await {
        Ok(f) if frame_error(&f).is_some_and(|e| is_noscript(&e)) => None,
        Err(e) if is_noscript(e.details()) => None,
        other => Some(other),
    };
    let reply = match reply {
        Some(r) => r,
        None => {
            script
                .load(client)
                .await
                .map_err(|e| script_error(script, e))?;
            custom_raw(client, options, cmd, argv).await
        }
    }
    .map_err(|e| script_error(script, e))?;
    match frame_error(&reply) {
        Some(e) => Err(script_error(
            script,
            fred::error::Error::new(fred::error::ErrorKind::Unknown, e),
        )),
        None => Ok(reply),
    }
}

/// The core's error for `e`, which running or loading `script` failed with. A script the
/// server refuses for good ([`ErrorKind::Unsupported`]) is named, with the servers it needs.
pub(crate) fn script_error(script: &Script, e: fred::error::Error) -> ruststream_core::Error {
    if crate::error::kind_of(&e) != ErrorKind::Unsupported {
        return core(e);
    }
    let message = format!(
        "the server refused the script {}: {}; RustStream needs Redis {} or newer (or Valkey 7.2 or newer)",
        name_of(script),
        crate::error::redact(e.details()),
        crate::version::MINIMUM,
    );
    crate::error::core_as(e, message)
}

/// The name `script` gives itself (its file's first comment, `-- CLAIM: ...`), as [`script`]
/// keeps it on the line after the shebang; `a script` when it has none.
pub(crate) fn name_of(script: &Script) -> String {
    script
        .lua()
        .and_then(|text| {
            text.lines()
                .take(2)
                .find_map(|l| l.strip_prefix(NAME_LINE))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "a script".to_owned())
}

/// How [`script`] starts the line that names a script.
const NAME_LINE: &str = "-- script: ";

/// The name a script's file gives itself on its first comment line (its `-- needs:` line left
/// out): `CLAIM` of `-- CLAIM: claims ...`.
fn own_name(body: &str) -> Option<&str> {
    let first = body
        .lines()
        .find(|l| l.starts_with("--") && compose::needs_of(l).next().is_none())?;
    let (name, _) = first.trim_start_matches("--").trim().split_once(':')?;
    name.bytes()
        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        .then_some(name)
        .filter(|n| !n.is_empty())
}

/// `cmd` with `argv` on `client`, with `options` when given, its reply as fred received it.
async fn custom_raw(
    client: &Client,
    options: Option<&Options>,
    cmd: CustomCommand,
    argv: Vec<Value>,
) -> Result<fred::types::Resp3Frame, fred::error::Error> {
    match options {
        Some(o) => client.with_options(o).custom_raw(cmd, argv).await,
        None => client.custom_raw(cmd, argv).await,
    }
}

/// `n` as a script argument.
pub(crate) fn int(n: usize) -> Value {
    Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

/// A reply's signed integer (0 for anything else).
pub(crate) fn reply_i64(v: &Value) -> i64 {
    match v {
        Value::Integer(n) => *n,
        _ => 0,
    }
}

/// A reply's integer (0 for anything else, or a negative).
pub(crate) fn reply_u64(v: &Value) -> u64 {
    match v {
        Value::Integer(n) => u64::try_from(*n).unwrap_or(0),
        _ => 0,
    }
}

/// The script of `main`: the parts its header names (and theirs, [`compose`]) put in front of
/// its body (after its shebang, if any), and a line naming it (`-- script: CLAIM`) first after
/// the shebang, for errors to name it. A header that names a missing part or a cycle (which the
/// unit tests refuse) gives a script that answers every call with an error saying so.
pub(crate) fn script(main: &str) -> Script {
    script_of(main, compose::PARTS)
}

/// [`script`] with the parts of `table`.
fn script_of(main: &str, table: &[compose::Part]) -> Script {
    let (shebang, body) = match main.split_once('\n') {
        Some((first, rest)) if first.starts_with("#!") => (first, rest),
        _ => ("", main),
    };
    let mut text = String::new();
    let name = own_name(body);
    let parts = match compose::parts_of(main, table) {
        Ok(parts) => parts,
        Err(e) => return refused(name, &e),
    };
    text.reserve(main.len() + parts.iter().map(|l| l.len() + 1).sum::<usize>() + 32);
    if !shebang.is_empty() {
        text.push_str(shebang);
        text.push('\n');
    }
    if let Some(name) = name {
        text.push_str(NAME_LINE);
        text.push_str(name);
        text.push('\n');
    }
    for part in parts {
        text.push_str(part);
        text.push('\n');
    }
    text.push_str(body);
    Script::from_lua(text)
}

/// A script named `name` that answers every call with `e`.
fn refused(name: Option<&str>, e: &compose::PartError) -> Script {
    let message =
        format!("ERR RustStream could not compose this script: {e}").replace(['\\', '\''], " ");
    Script::from_lua(format!(
        "{NAME_LINE}{}\nreturn redis.error_reply('{message}')\n",
        name.unwrap_or("a script")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shebang_stays_first() {
        let table: &[compose::Part] = &[("a.lua", "local a = 1"), ("guard.lua", "-- GUARD: x")];
        let s = script_of("#!lua flags=allow-oom\n-- needs: a.lua\nreturn 1\n", table);
        assert_eq!(
            s.lua().map(|l| l.to_string()).as_deref(),
            Some("#!lua flags=allow-oom\nlocal a = 1\n-- needs: a.lua\nreturn 1\n")
        );
        let named = script_of(
            "#!lua\n-- needs: guard.lua\n-- CLAIM_2: claims\nreturn 1\n",
            table,
        );
        assert_eq!(
            named.lua().map(|l| l.to_string()).as_deref(),
            Some(
                "#!lua\n-- script: CLAIM_2\n-- GUARD: x\n-- needs: guard.lua\n-- CLAIM_2: claims\nreturn 1\n"
            )
        );
        assert_eq!(name_of(&named), "CLAIM_2");
        assert_eq!(name_of(&s), "a script");
        let plain = script_of("-- needs: a.lua\nreturn 1", table);
        assert_eq!(
            plain.lua().map(|l| l.to_string()).as_deref(),
            Some("local a = 1\n-- needs: a.lua\nreturn 1")
        );
    }

    #[test]
    fn a_script_that_does_not_compose_answers_with_an_error() {
        let s = script_of("-- JOB: j\n-- needs: gone.lua\nreturn 1", &[]);
        assert_eq!(
            s.lua().map(|l| l.to_string()).as_deref(),
            Some(
                "-- script: JOB\nreturn redis.error_reply('ERR RustStream could not compose this script: the script needs the Lua part gone.lua, which is not in lua::compose::PARTS')\n"
            )
        );
        assert_eq!(name_of(&s), "JOB");
    }
}
