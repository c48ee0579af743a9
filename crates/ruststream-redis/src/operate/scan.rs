//! Keys found by pattern, for what no index lists (completed jobs' records, open flows): `SCAN
//! MATCH` on a standalone server, on every node of a cluster, stopped after a bound.

use fred::prelude::*;
use futures::{StreamExt, TryStreamExt};
use ruststream_core::Result;

use crate::error::core;

/// At most `most` keys matching `pattern` (a `SCAN MATCH` glob).
pub(super) async fn scan_keys(client: &Client, pattern: String, most: usize) -> Result<Vec<Key>> {
    let keys = if client.is_clustered() {
        client
            .scan_cluster_buffered(pattern, Some(100), None)
            .take(most)
            .try_collect()
            .await
    } else {
        client
            .scan_buffered(pattern, Some(100), None)
            .take(most)
            .try_collect()
            .await
    };
    keys.map_err(core)
}

/// `text` with the glob characters of `SCAN MATCH` escaped, so it matches only itself.
pub(super) fn glob_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escaped("a*b[c]?"), "a\\*b\\[c\\]\\?");
        assert_eq!(glob_escaped("{orders}.flow:"), "{orders}.flow:");
    }
}
