//! [`TestApp`]: runs an app with every `RedisBroker` on an in-memory
//! [`MemoryRedis`](crate::MemoryRedis), records its handler calls, and moves the clock.
//!
//! | file | what |
//! |---|---|
//! | `test_app.rs` | [`TestApp`]: starting, restarting and stopping the app on the models |
//! | `settle.rs` | moving the clock and waiting until the app has settled |
//! | `broker.rs` | [`TestBroker`], one broker of the app: publish to it, assert on it |
//! | `publish.rs` | [`TestPublish`], a publish that returns once the app has settled |

mod broker;
mod publish;
mod settle;
mod test_app;

pub use self::broker::{InMemoryBroker, TestBroker};
pub use self::publish::TestPublish;
pub use self::test_app::TestApp;
