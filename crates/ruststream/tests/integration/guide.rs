//! The guide's examples (`docs/guide`), run on TestApp with no server. Each page's code is in
//! the files under `tests/integration/guide/`, between `ANCHOR` comments. The page shows the
//! same code inline, and `scripts/guide-code --check` (run by the test below and by CI) fails
//! when a page and its file differ. The image and payments services of `examples/` are run by
//! `tests/integration/images*.rs` and `tests/integration/payments.rs`; the first service is
//! built as a new project by `scripts/fresh-project`.

use std::path::Path;
use std::process::Command;

#[path = "guide/batch.rs"]
mod batch;
#[path = "guide/cancel.rs"]
mod cancel;
#[path = "guide/consumer_groups.rs"]
mod consumer_groups;
#[path = "guide/deadlines.rs"]
mod deadlines;
#[path = "guide/flows.rs"]
mod flows;
#[path = "guide/fragments.rs"]
mod fragments;
#[path = "guide/groups.rs"]
mod groups;
#[path = "guide/jobs.rs"]
mod jobs;
#[path = "guide/partitions.rs"]
mod partitions;
#[path = "guide/pubsub.rs"]
mod pubsub;
#[path = "guide/steps.rs"]
mod steps;
#[path = "guide/testing.rs"]
mod testing;

/// Every code block of the guide's pages equals the source file part it names.
#[test]
fn the_pages_show_the_code_the_tests_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("python3")
        .arg(root.join("scripts/guide-code"))
        .arg("--check")
        .output()
        .expect("python3 runs scripts/guide-code");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
