//! The integration tests of `ruststream` that run processes of their own for long, or install
//! what would change the other tests, in one test binary (`--test processes`): the ledger
//! (`ledger`), the fault tests (`faults`: workers and servers killed), the command line (`cli`)
//! and OpenTelemetry (`otel`: its global tracer provider adds `traceparent` to every message
//! published in the process). Their worker processes are this binary run again
//! with one `#[ignore]`d test selected by its full name (`harness::process`). A test's name starts
//! with its module: `cargo test -p redstream --test processes faults::`.
//!
//! **Adding a file**: as in `tests/integration/main.rs`.

#[path = "../harness/mod.rs"]
mod harness;

mod cli;
mod failover;
mod faults;
mod flows;
mod groups;
mod ledger;
mod otel;
mod steps;
