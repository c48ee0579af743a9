//! Which parts a script is built from, and in what order. A `.lua` file names the parts it
//! needs on one header line, `-- needs: frame.lua claim/gates.lua` (paths from the crate's
//! `src/`), among its leading comment lines; a file without that line needs nothing.
//! [`parts_of`] gives a script's main part the parts it needs, directly or through another
//! part, each once and each after the parts it needs itself (a part's `local` functions see
//! only what stands before them). A name no part has, or a part that needs itself through
//! others, is refused. The unit test below composes every `.lua` file of the crate and checks
//! each file's header against the functions it calls, so a wrong header fails `cargo test`.
//!
//! A new shared part is a `.lua` file with its own header, and a line in [`PARTS`].

use std::fmt;

/// A part: its path from `src/` (as headers name it) and its text.
pub(crate) type Part = (&'static str, &'static str);

/// Every part a script may need.
pub(crate) const PARTS: &[Part] = &[
    ("guard.lua", include_str!("../guard.lua")),
    ("frame.lua", include_str!("../frame.lua")),
    ("back.lua", include_str!("../back.lua")),
    ("stream/bound.lua", include_str!("../stream/bound.lua")),
    ("claim/gates.lua", include_str!("../claim/gates.lua")),
    ("claim/paused.lua", include_str!("../claim/paused.lua")),
    ("claim/limit.lua", include_str!("../claim/limit.lua")),
    ("claim/cap.lua", include_str!("../claim/cap.lua")),
    ("claim/cancels.lua", include_str!("../claim/cancels.lua")),
    ("list/take.lua", include_str!("../list/take.lua")),
    ("list/groups.lua", include_str!("../list/groups.lua")),
    ("list/marks.lua", include_str!("../list/marks.lua")),
    (
        "delayed/schedule_retry.lua",
        include_str!("../delayed/schedule_retry.lua"),
    ),
    ("cancel/settled.lua", include_str!("../cancel/settled.lua")),
    ("cancel/record.lua", include_str!("../cancel/record.lua")),
    ("dead/trim.lua", include_str!("../dead/trim.lua")),
    (
        "periodic/forget.lua",
        include_str!("../periodic/forget.lua"),
    ),
    ("unique/claim.lua", include_str!("../unique/claim.lua")),
];

/// How a part's header line starts.
const NEEDS: &str = "-- needs:";

/// Why a script could not be composed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PartError {
    /// `by` needs `part`, which is not in the parts.
    Missing {
        /// The part named.
        part: String,
        /// The part (or script) whose header names it.
        by: String,
    },
    /// These parts need one another, each the next, the last the first.
    Cycle(Vec<String>),
}

impl fmt::Display for PartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { part, by } => write!(
                f,
                "{by} needs the Lua part {part}, which is not in lua::compose::PARTS"
            ),
            Self::Cycle(parts) => {
                write!(f, "the Lua parts need one another: {}", parts.join(" -> "))
            }
        }
    }
}

/// The parts a file's header names, in its order.
pub(crate) fn needs_of(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .take_while(|l| l.starts_with("--") || l.starts_with("#!"))
        .filter_map(|l| l.strip_prefix(NEEDS))
        .flat_map(str::split_whitespace)
}

/// The texts of the parts `main` needs, of `parts`, in the order they go in front of it.
///
/// # Errors
/// [`PartError`] when a header names a part `parts` does not have, or parts need one another.
pub(crate) fn parts_of(main: &str, parts: &[Part]) -> Result<Vec<&'static str>, PartError> {
    let mut done = Vec::new();
    let mut path = Vec::new();
    for need in needs_of(main) {
        visit(need, "the script", parts, &mut path, &mut done)?;
    }
    Ok(done.into_iter().map(|(_, text)| text).collect())
}

/// Puts `name` in `done` after the parts it needs; `path` holds the parts being visited.
fn visit(
    name: &str,
    by: &str,
    parts: &[Part],
    path: &mut Vec<&'static str>,
    done: &mut Vec<Part>,
) -> Result<(), PartError> {
    let Some(&(key, text)) = parts.iter().find(|(k, _)| *k == name) else {
        return Err(PartError::Missing {
            part: name.to_owned(),
            by: by.to_owned(),
        });
    };
    if done.iter().any(|(k, _)| *k == key) {
        return Ok(());
    }
    if let Some(at) = path.iter().position(|k| *k == key) {
        let mut cycle: Vec<String> = path[at..].iter().map(|k| (*k).to_owned()).collect();
        cycle.push(key.to_owned());
        return Err(PartError::Cycle(cycle));
    }
    path.push(key);
    for need in needs_of(text) {
        visit(need, key, parts, path, done)?;
    }
    path.pop();
    done.push((key, text));
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    #[test]
    fn a_part_comes_after_what_it_needs_and_once() {
        let parts: &[Part] = &[
            ("a.lua", "-- needs: b.lua c.lua\nA"),
            ("b.lua", "-- B: the b part\n-- needs: c.lua\nB"),
            ("c.lua", "C"),
        ];
        let main = "#!lua\n-- MAIN: m\n-- needs: a.lua c.lua\nM";
        assert_eq!(
            parts_of(main, parts),
            Ok(vec![
                "C",
                "-- B: the b part\n-- needs: c.lua\nB",
                "-- needs: b.lua c.lua\nA"
            ])
        );
        assert_eq!(parts_of("return 1", parts), Ok(vec![]));
    }

    #[test]
    fn a_missing_part_or_a_cycle_is_refused() {
        let parts: &[Part] = &[
            ("a.lua", "-- needs: b.lua\nA"),
            ("b.lua", "-- needs: a.lua\nB"),
            ("c.lua", "-- needs: d.lua\nC"),
        ];
        let cycle = parts_of("-- needs: a.lua\n", parts);
        assert_eq!(
            cycle,
            Err(PartError::Cycle(vec![
                "a.lua".into(),
                "b.lua".into(),
                "a.lua".into()
            ]))
        );
        let missing = parts_of("-- needs: c.lua\n", parts);
        assert_eq!(
            missing.map_err(|e| e.to_string()),
            Err("c.lua needs the Lua part d.lua, which is not in lua::compose::PARTS".to_owned())
        );
    }

    #[test]
    fn a_header_below_the_first_code_line_is_not_read() {
        assert_eq!(needs_of("local a = 1\n-- needs: b.lua\n").count(), 0);
    }

    /// Every `.lua` file under `dir`, by its path from `src`.
    fn lua_files(src: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                lua_files(src, &path, out);
            } else if path.extension().is_some_and(|e| e == "lua") {
                let name = path.strip_prefix(src).unwrap_or(&path);
                let name = name.to_string_lossy().replace('\\', "/");
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                out.push((name, text));
            }
        }
    }

    /// The names `text` defines at its top level: (name, whether it is a function).
    fn defined(text: &str) -> Vec<(&str, bool)> {
        let word = |s: &str| -> usize {
            s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(s.len())
        };
        text.lines()
            .filter_map(|l| {
                let l = l.strip_prefix("local ").unwrap_or(l);
                if let Some(f) = l.strip_prefix("function ") {
                    return Some((&f[..word(f)], true));
                }
                let name = &l[..word(l)];
                let constant = name.starts_with(|c: char| c.is_ascii_uppercase())
                    && l[name.len()..].trim_start().starts_with('=');
                constant.then_some((name, false))
            })
            .collect()
    }

    /// Whether `code` (comments left out) calls `name` (a function) or names it (a constant).
    fn uses(code: &str, name: &str, function: bool) -> bool {
        code.lines()
            .map(|l| l.split("--").next().unwrap_or_default())
            .any(|l| {
                l.match_indices(name).any(|(at, _)| {
                    let before = l[..at].chars().next_back();
                    let after = l[at + name.len()..].trim_start();
                    !before.is_some_and(|c| c.is_ascii_alphanumeric() || "_.:".contains(c))
                        && !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                        && (!function || after.starts_with('('))
                })
            })
    }

    /// Every `.lua` file composes, and every file that calls a part's function (or names its
    /// constant) needs that part, directly or through the parts it needs.
    #[test]
    fn every_script_composes_and_needs_what_it_uses() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        lua_files(&src, &src, &mut files);
        assert!(files.len() > 40, "found {} .lua files", files.len());
        for (name, _) in PARTS {
            assert!(files.iter().any(|(f, _)| f == name), "{name} is no file");
        }
        for (name, text) in &files {
            let composed = parts_of(text, PARTS).unwrap_or_else(|e| panic!("{name}: {e}"));
            for (part, part_text) in PARTS.iter().filter(|(p, _)| p != name) {
                for (def, function) in defined(part_text) {
                    if defined(text).iter().any(|(d, _)| *d == def) {
                        continue;
                    }
                    assert!(
                        !uses(text, def, function) || composed.contains(part_text),
                        "{name} uses {def} of {part} but does not need it (its `-- needs:` line)"
                    );
                }
            }
        }
    }
}
