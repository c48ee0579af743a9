//! How a message is published to a destination: [`PublishPolicy`], and the builder of each
//! transport's policy, which users reach as [`list::Publish`](crate::list::Publish),
//! [`stream::Publish`](crate::stream::Publish) and [`pubsub::Publish`](crate::pubsub::Publish).
//! [`Routes`] holds each destination's policy at run time. Sends no command (`publish` carries
//! the policies out).
//!
//! | file | what |
//! |---|---|
//! | `list.rs` | [`ListPublish`] (`LPUSH`, a ttl, its layout) |
//! | `layout.rs` | the layout of a list (partitions, priority levels, fair groups), which a [`RedisList`](crate::RedisList) and its route share, and its setters |
//! | `stream.rs` | [`StreamPublish`] (`XADD`, its bound, partitions) |
//! | `setters.rs` | the setters written once for several builders: `partitions`, `durable` |
//! | `channel.rs` | [`ChannelPublish`] (`PUBLISH` or `SPUBLISH`) |
//! | `publish_policy.rs` | [`PublishPolicy`], one of the three |
//! | `routes.rs` | [`Routes`], each destination's policy |

mod channel;
mod layout;
mod list;
mod publish_policy;
mod routes;
mod setters;
mod stream;

pub use self::channel::ChannelPublish;
pub use self::layout::MAX_PRIORITIES;
pub(crate) use self::layout::{ListLayout, list_layout_setters};
pub use self::list::ListPublish;
pub use self::publish_policy::PublishPolicy;
pub(crate) use self::routes::Routes;
pub(crate) use self::setters::partitions_setter;
pub use self::stream::StreamPublish;
