//! Compile-time mistakes with the macros, and the messages that say how to fix them
//! (`tests/ui/*.rs` and their `.stderr`). Regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p redstream --test compile_fail` and review the diff.

#[test]
fn macro_mistakes_are_explained() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
