//! Composing the scripts from their `.lua` files: a script's own file, with the shared Lua it
//! uses (`guard.lua`, `frame.lua`, `list/levels.lua`, the claim's parts in `claim/`,
//! `delayed/schedule_retry.lua`) put after
//! its first line when that line is a `#!lua` shebang (Redis reads a script's flags from its
//! first line only).
//! Sends no command.

use fred::types::scripts::Script;

/// Checks made before a script's first write (`wrong_types`, `MAX_UNPACK`).
pub(crate) const GUARD: &str = include_str!("guard.lua");

/// The Lua that trims a stream to its publish policy's bound after a script re-adds to it
/// (`bound_error(spec)`, `bound(key, spec)`).
pub(crate) const BOUND: &str = include_str!("stream/bound.lua");

/// The Lua of the scripts that put entries onto a list with priority levels (`levels_of`,
/// `level_of`, `push_onto`, `push_level`, `level_checks`); needs `frame.lua` before it.
pub(crate) const LEVELS: &str = include_str!("list/levels.lua");

/// A script of `main` with `libs` put in front of its body (after its shebang, if any).
pub(crate) fn script(main: &str, libs: &[&str]) -> Script {
    let (shebang, body) = match main.split_once('\n') {
        Some((first, rest)) if first.starts_with("#!") => (first, rest),
        _ => ("", main),
    };
    let mut text =
        String::with_capacity(main.len() + libs.iter().map(|l| l.len()).sum::<usize>() + 8);
    if !shebang.is_empty() {
        text.push_str(shebang);
        text.push('\n');
    }
    for lib in libs {
        text.push_str(lib);
        text.push('\n');
    }
    text.push_str(body);
    Script::from_lua(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shebang_stays_first() {
        let s = script("#!lua flags=allow-oom\nreturn 1\n", &["local a = 1"]);
        assert_eq!(
            s.lua().map(|l| l.to_string()).as_deref(),
            Some("#!lua flags=allow-oom\nlocal a = 1\nreturn 1\n")
        );
        let plain = script("return 1", &["local a = 1"]);
        assert_eq!(
            plain.lua().map(|l| l.to_string()).as_deref(),
            Some("local a = 1\nreturn 1")
        );
    }
}
