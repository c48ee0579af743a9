//! Short fragments the guide's pages show on their own (deploying, security): compiled here,
//! and each checked to build what the page says.

use std::time::Duration;

use ruststream::prelude::*;

fn app_with_a_shutdown_timeout() -> RustStream {
    // ANCHOR: shutdown_timeout
    RustStream::new(AppInfo::new("images", "0.1.0")).shutdown_timeout(Duration::from_secs(20))
    // ANCHOR_END: shutdown_timeout
}

fn broker_with_a_prefix() -> RedisBroker {
    // ANCHOR: prefix
    let broker = RedisBroker::from_env().prefix("myapp:");
    // ANCHOR_END: prefix
    broker
}

#[test]
fn the_fragments_build_what_their_pages_say() {
    assert_eq!(broker_with_a_prefix().key_prefix(), "myapp:");
    let app = format!("{:?}", app_with_a_shutdown_timeout());
    assert!(app.contains("20s"), "{app}");
}
