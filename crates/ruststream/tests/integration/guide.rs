//! The guide's examples (`docs/guide`), run on TestApp with no server. Each page's code is one of
//! the files under `tests/integration/guide/`, which the page prints with mdBook's `{{#include}}` (the
//! `ANCHOR` comments mark the printed parts), so the code exists once and what the guide shows is
//! what is compiled and run here. The pages that show an example of `examples/` (the image
//! service, the payments service) are run by `tests/integration/images*.rs` and `tests/integration/payments.rs`; the
//! first service is built as a new project by `scripts/fresh-project`.

#[path = "guide/batch.rs"]
mod batch;
#[path = "guide/consumer_groups.rs"]
mod consumer_groups;
#[path = "guide/deadlines.rs"]
mod deadlines;
#[path = "guide/flows.rs"]
mod flows;
#[path = "guide/groups.rs"]
mod groups;
#[path = "guide/jobs.rs"]
mod jobs;
#[path = "guide/partitions.rs"]
mod partitions;
#[path = "guide/pubsub.rs"]
mod pubsub;
#[path = "guide/testing.rs"]
mod testing;
