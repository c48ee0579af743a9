//! The integration tests of `ruststream`, in one test binary (`--test integration`): one module a
//! feature, each the file of the same name beside this one, all on the shared harness
//! (`tests/harness/`, compiled once for all of them). A test's name starts with its module:
//! `cargo test -p redstream --test integration lists::` runs the list tests,
//! `... --test integration reliable_acks_in_order::cluster` one test on one topology.
//!
//! The tests share one process, so what is process-wide is installed once and shared: the log
//! capture (`harness::logs`) and the Prometheus recorder (`harness::metrics`). Each test reads
//! only what names its own keys, ids or subscriptions. Tests that change a server's settings,
//! kill or restart it use servers of their own (`harness::stand`). The tests that run processes
//! of their own for long (the ledger, the fault tests, the command line) or install what would
//! change the other tests (the global tracer provider, which adds `traceparent` to every message)
//! are the `processes` binary (`tests/processes/`); the compile-fail tests are `compile_fail`
//! (`tests/compile_fail.rs`).
//!
//! **Adding a file**: `tests/integration/foo.rs`, with `use crate::harness;` where a test file of
//! its own would have `mod harness;` (`use harness::..` lines stay), one more `../` in its
//! `include!`, `include_str!` and `#[path]` paths, and `mod foo;` below. Its tests are then
//! `foo::...`; a worker process it re-runs is named with `harness::process::test_name`.

#[path = "../harness/mod.rs"]
mod harness;

mod batch;
mod bounded;
mod cancel;
mod cap;
mod combinations;
mod conformance;
mod dashboard;
mod dashboard_pages;
mod deadline;
mod delayed;
mod dispatch;
mod durable;
mod flows;
mod flows_kinds;
mod flows_repair;
mod groups;
mod guide;
// `images::images`, `payments::payments`: the example included in its own test module.
#[allow(clippy::module_inception)]
mod images;
mod images_testapp;
mod leases;
mod lists;
mod macros;
mod metrics;
mod native;
mod operate;
mod partitions;
mod payloads;
#[allow(clippy::module_inception)]
mod payments;
mod periodic;
mod priorities;
mod pubsub;
mod python_producer;
mod rate_limit;
mod recovery;
mod redis_setup;
mod reliability;
mod results;
mod routing;
mod runtime;
mod scheduling;
mod security;
mod servers;
mod sharded;
mod snooze;
mod steps;
mod steps_checkpoints;
mod steps_kept;
mod steps_records;
mod steps_signals;
mod steps_sources;
mod steps_stop;
mod streams;
mod testapp;
mod topologies;
mod unique;
