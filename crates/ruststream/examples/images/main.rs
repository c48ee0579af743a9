//! The image service of the guide "Work queues on lists", macro form: a simple queue that warms
//! a page cache, a reliable queue that renders thumbnails, and a stream consumer that turns
//! uploads into thumbnail jobs.
//!
//! ```text
//! cargo run --example images              # run it (Redis on localhost:6379)
//! cargo run --example images -- asyncapi  # print its AsyncAPI document
//! ```
//!
//! The code is in `examples/images.rs`, exactly as the guide prints it;
//! `tests/integration/images.rs` runs the same file against Redis.

include!("../images.rs");
