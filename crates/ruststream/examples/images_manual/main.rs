//! The image service of the guide "Work queues on lists", hand-written form: `Handle` impls,
//! `outgoing!`, and `subscriber(..).build()` instead of the macros.
//!
//! ```text
//! cargo run --example images_manual              # run it (Redis on localhost:6379)
//! cargo run --example images_manual -- asyncapi  # print its AsyncAPI document
//! ```
//!
//! The code is in `examples/images_manual.rs`, exactly as the guide prints it;
//! `tests/integration/images.rs` runs the same file against Redis.

include!("../images_manual.rs");
