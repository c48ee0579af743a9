//! How a message is published to a destination: [`PublishPolicy`], and the builder of each
//! transport's policy, which users reach as [`list::Publish`](crate::list::Publish),
//! [`stream::Publish`](crate::stream::Publish) and [`pubsub::Publish`](crate::pubsub::Publish).
//! [`Routes`] holds each destination's policy at run time. Sends no command (`publish` carries
//! the policies out).
//!
//! | file | what |
//! |---|---|
//! | `list.rs` | [`ListPublish`] (`LPUSH`, a ttl, partitions, priority levels) |
//! | `stream.rs` | [`StreamPublish`] (`XADD`, its bound, partitions) |
//! | `channel.rs` | [`ChannelPublish`] (`PUBLISH` or `SPUBLISH`) |
//! | `publish_policy.rs` | [`PublishPolicy`], one of the three |
//! | `routes.rs` | [`Routes`], each destination's policy |

mod channel;
mod list;
mod publish_policy;
mod routes;
mod stream;

pub use self::channel::ChannelPublish;
pub use self::list::{ListPublish, MAX_PRIORITIES};
pub use self::publish_policy::PublishPolicy;
pub(crate) use self::routes::Routes;
pub use self::stream::StreamPublish;
