//! Keys found by pattern, for what no index lists (completed jobs' records, open flows): `SCAN
//! MATCH` on a standalone server, on every node of a cluster, stopped after a bound.

use fred::prelude::*;
use fred::types::scan::Scanner;
use futures::StreamExt;
use ruststream_core::Result;

use crate::error::core;

/// Keys each `SCAN` call asks a node for.
const SCAN_COUNT: u32 = 1000;

/// Most `SCAN` calls one search makes, over every node: so a large keyspace with few matching
/// keys costs a bounded number of calls (about 300,000 keys looked at), not a walk of it all.
pub const SCAN_CALLS: usize = 300;

/// At most `most` keys matching `pattern` (a `SCAN MATCH` glob), among what at most
/// [`SCAN_CALLS`] calls find. Each page is continued or cancelled explicitly (a page dropped
/// would continue its node's scan), and pages still arriving once enough is found are
/// cancelled, so no scan runs on after the search.
pub(super) async fn scan_keys(client: &Client, pattern: String, most: usize) -> Result<Vec<Key>> {
    let mut pages = if client.is_clustered() {
        client.scan_cluster(pattern, Some(SCAN_COUNT), None).boxed()
    } else {
        client.scan(pattern, Some(SCAN_COUNT), None).boxed()
    };
    let mut keys = Vec::new();
    let mut calls = 0;
    let mut failed = None;
    while let Some(page) = pages.next().await {
        let mut page = match page {
            Ok(page) => page,
            Err(e) => {
                failed.get_or_insert(e);
                continue;
            }
        };
        calls += 1;
        if failed.is_none() && keys.len() < most {
            keys.extend(page.take_results().unwrap_or_default());
        }
        if failed.is_some() || keys.len() >= most || calls >= SCAN_CALLS {
            page.cancel();
        } else {
            page.next();
        }
    }
    if let Some(e) = failed {
        return Err(core(e));
    }
    keys.truncate(most);
    Ok(keys)
}
