//! Periodic jobs: a message published to a destination on every tick of a cron schedule,
//! exactly once per tick however many instances of the service run.
//!
//! A [`Periodic`] is declared with [`Periodic::new`], with [`Publisher::every`], or with the
//! `#[periodic]` macro, and mounted with `b.periodic(..)` (see [`Mount::periodic`](crate::Mount::periodic)). Every
//! instance computes the same ticks from the schedule; each tick is published with the message
//! id `<name>@<tick in epoch ms>` and [`unique_for`](crate::PublishBuilder::unique_for) a window
//! of twice the period (at least a minute), so the broker enqueues the first publish of a tick
//! and drops the others. The tick time is the idempotency key, so a resent publish is dropped
//! as well.
//!
//! The broker keeps each job's last fired tick and its definition ([`PeriodicStore`]): the
//! [`CatchUp`] policy decides what happens to ticks missed while no instance ran, and operator
//! tools list the jobs. The wait between ticks is on the tokio clock and the tick times come
//! from the broker's clock ([`PeriodicStore::now_ms`]), so a test on a paused clock
//! (`TestApp`) drives the schedule in virtual time.
//!
//! The core sends no command: the broker's store does (on Redis: `ruststream_redis`'s
//! `periodic` module).
//!
//! ```no_run
//! # use ruststream_core::*;
//! # use ruststream_core::periodic::{CatchUp, Periodic, Tz};
//! # fn demo<B: Broker>(broker: B, report: impl Fn() -> Vec<u8> + Send + Sync + 'static) -> RustStream {
//! RustStream::new(AppInfo::new("reports", "0.1.0")).with_broker(broker, |b| {
//!     b.periodic(
//!         Periodic::new("nightly", "0 0 2 * * *", Tz::Europe__Paris)
//!             .to("reports")
//!             .message(report)
//!             .catch_up(CatchUp::RunOnce),
//!     );
//! })
//! # }
//! ```

mod schedule;
mod ticker;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

pub use self::schedule::{Schedule, parse_tz};
pub(crate) use self::ticker::spawn;
use crate::{ConfigError, Enqueued, Error, MessageType, OutMessage, Publisher, Result};
/// IANA time zones (`Tz::UTC`, `Tz::Europe__Paris`), re-exported from `chrono-tz`.
pub use chrono_tz::Tz;

/// What becomes of ticks missed while no instance ran (or while the broker could not be
/// reached): counted from the last tick any instance fired, which the broker keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum CatchUp {
    /// Fire none of them; wait for the next tick (the default).
    #[default]
    Skip,
    /// Fire the latest missed tick once, at once (with its own tick time as its id, so
    /// instances starting together enqueue it once), then follow the schedule.
    RunOnce,
}

/// One periodic job as the broker's registry keeps it, for operator tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PeriodicInfo {
    /// The job's name, unique per broker prefix: the first half of every tick's message id.
    pub name: String,
    /// The cron expression.
    pub cron: String,
    /// The IANA time zone.
    pub tz: String,
    /// Where its messages go (`None`: the message type's own name, which may be a template).
    pub destination: Option<String>,
    /// Its catch-up policy.
    pub catch_up: CatchUp,
}

/// Where a broker keeps periodic jobs' state, shared by every instance: each job's last fired
/// tick and its definition. A broker that can run periodic jobs returns one from
/// [`Broker::periodic_store`](crate::Broker::periodic_store).
pub trait PeriodicStore: Send + Sync + 'static {
    /// Now, in ms since the epoch, on the clock ticks are counted on (the broker's: virtual in
    /// a test on a paused clock).
    fn now_ms(&self) -> u64;

    /// Writes `job` into the registry (replacing an older definition of that name) and returns
    /// the last tick fired for it by any instance, if any.
    fn register<'a>(&'a self, job: &'a PeriodicInfo) -> BoxFuture<'a, Result<Option<u64>>>;

    /// Records that `tick` (epoch ms) of the job `name` was published, unless a later tick is
    /// recorded already (so a late or resent call never moves it back).
    fn fired<'a>(&'a self, name: &'a str, tick: u64) -> BoxFuture<'a, Result<()>>;
}

/// What one tick publishes: the id, window and tick time the producer needs.
pub(crate) struct Shot {
    pub(crate) id: String,
    pub(crate) to: Option<String>,
    pub(crate) window: Duration,
    pub(crate) tick: SystemTime,
}

/// Publishes one tick's message (encoding errors included).
type Fire = Arc<dyn Fn(Publisher, Shot) -> BoxFuture<'static, Result<Enqueued>> + Send + Sync>;

/// A periodic job: a name, a schedule, a destination and how to make the message.
///
/// A bad expression, zone or name is not an error here: the app refuses to start with a message
/// that says how to fix it.
#[must_use]
pub struct Periodic {
    pub(crate) name: String,
    pub(crate) expr: String,
    pub(crate) tz: std::result::Result<Tz, ConfigError>,
    pub(crate) to: Option<String>,
    pub(crate) doc: Option<crate::MessageDoc>,
    pub(crate) fire: Option<Fire>,
    pub(crate) catch_up: CatchUp,
    pub(crate) publisher: Option<Publisher>,
}

impl std::fmt::Debug for Periodic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Periodic")
            .field("name", &self.name)
            .field("cron", &self.expr)
            .field("tz", &self.tz)
            .field("to", &self.to)
            .field("catch_up", &self.catch_up)
            .finish_non_exhaustive()
    }
}

impl Periodic {
    /// A job named `name` (its ticks' message ids start with it: keep it stable across
    /// deploys) on the cron expression `cron` (seconds first: `0 */5 * * * *`) in the zone `tz`.
    pub fn new(name: impl Into<String>, cron: impl Into<String>, tz: Tz) -> Self {
        Self {
            name: name.into(),
            expr: cron.into(),
            tz: Ok(tz),
            to: None,
            doc: None,
            fire: None,
            catch_up: CatchUp::Skip,
            publisher: None,
        }
    }

    /// Names the job (see [`new`](Self::new)); needed after [`Publisher::every`].
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The time zone.
    pub fn tz(mut self, tz: Tz) -> Self {
        self.tz = Ok(tz);
        self
    }

    /// The time zone by its IANA name (`Europe/Paris`); an unknown name stops the app at
    /// startup.
    pub fn tz_named(mut self, name: &str) -> Self {
        self.tz = schedule::tz_named(name);
        self
    }

    /// The destination key; without it the message type's outgoing name is used.
    pub fn to(mut self, destination: impl Into<String>) -> Self {
        self.to = Some(destination.into());
        self
    }

    /// What happens to ticks missed while no instance ran ([`CatchUp::Skip`] by default).
    pub fn catch_up(mut self, policy: CatchUp) -> Self {
        self.catch_up = policy;
        self
    }

    /// The message of each tick, made by `make`.
    pub fn message<T, F>(self, make: F) -> Self
    where
        T: MessageType,
        F: Fn() -> T + Send + Sync + 'static,
    {
        self.message_async(move |_| std::future::ready(make()))
    }

    /// The message of each tick, made by the async `make` from the tick's time.
    pub fn message_async<T, F, Fut>(mut self, make: F) -> Self
    where
        T: MessageType,
        F: Fn(SystemTime) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let make = Arc::new(make);
        self.doc = Some(crate::MessageDoc::of::<T>());
        let fire: Fire = Arc::new(move |publisher: Publisher, shot: Shot| {
            let value = make(shot.tick);
            Box::pin(async move {
                let value = value.await;
                let destination = match shot.to {
                    Some(to) => to,
                    None => value
                        .destination()?
                        .ok_or(Error::NoDestination {
                            type_name: std::any::type_name::<T>(),
                        })?
                        .into_owned(),
                };
                let mut message = OutMessage::new(destination, value.encode()?);
                message.id = Some(shot.id);
                message.unique_for = Some(shot.window);
                publisher.send(vec![message]).await
            })
        });
        self.fire = Some(fire);
        self
    }

    /// The job's name.
    pub fn job_name(&self) -> &str {
        &self.name
    }

    /// Publishes through `publisher` instead of the broker's own (see [`Publisher::every`]).
    pub fn via(mut self, publisher: Publisher) -> Self {
        self.publisher = Some(publisher);
        self
    }

    /// Checks the declaration; the error says what to change.
    pub(crate) fn validate(&self) -> Result<Schedule> {
        if self.name.trim().is_empty() || self.name.contains('@') {
            let e = ConfigError::new(
                "name",
                format!(
                    "the periodic job on `{}` needs a name without `@` (its ticks' ids are `<name>@<tick>`)",
                    self.expr
                ),
                "add `.name(\"report\")`",
            );
            return Err(match self.name.trim() {
                "" => e,
                name => e.on(name),
            }
            .into());
        }
        let tz = self.tz.clone().map_err(|e| e.on(&self.name))?;
        let schedule = Schedule::read(&self.expr, tz).map_err(|e| e.on(&self.name))?;
        if self.fire.is_none() {
            return Err(no_message(&self.name).into());
        }
        Ok(schedule)
    }

    /// The schedule in words, for the AsyncAPI document: `0 */5 * * * * (Europe/Paris)`.
    pub(crate) fn describe(&self) -> String {
        match &self.tz {
            Ok(tz) => format!("`{}` ({})", self.expr, tz.name()),
            Err(_) => format!("`{}`", self.expr),
        }
    }

    /// The registry's view of this job.
    pub(crate) fn info(&self, schedule: &Schedule) -> PeriodicInfo {
        PeriodicInfo {
            name: self.name.clone(),
            cron: self.expr.clone(),
            tz: schedule.tz().name().to_owned(),
            destination: self.to.clone(),
            catch_up: self.catch_up,
        }
    }
}

/// The error of a periodic job that makes no message.
pub(crate) fn no_message(job: &str) -> ConfigError {
    ConfigError::new("message", "no message", "add `.message(|| ..)`").on(job)
}

/// The error of periodic jobs mounted on a broker that cannot keep their state.
pub(crate) fn no_store() -> ConfigError {
    ConfigError::new(
        "periodic",
        "this broker cannot keep periodic jobs' state",
        "mount them on a broker that does (the Redis broker does)",
    )
}

/// Checks every job of one broker: each declaration, distinct names, and a broker that can keep
/// their state (`has_store`).
pub(crate) fn validate_all(jobs: &[Periodic], has_store: bool) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    if !has_store {
        return Err(no_store().into());
    }
    let mut names = std::collections::HashSet::new();
    for job in jobs {
        job.validate()?;
        if !names.insert(job.name.as_str()) {
            return Err(ConfigError::new(
                "name",
                "two periodic jobs of one broker have this name",
                "give each job its own name",
            )
            .on(&job.name)
            .into());
        }
    }
    Ok(())
}

/// Anything `b.periodic(..)` mounts: a [`Periodic`], or the item `#[periodic]` generates.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a periodic job",
    note = "mount a `Periodic::new(name, cron, tz)`, `publisher.every(cron)`, or a fn marked `#[periodic(\"..\")]`"
)]
pub trait IntoPeriodic {
    /// The job.
    fn into_periodic(self) -> Periodic;
}

impl IntoPeriodic for Periodic {
    fn into_periodic(self) -> Periodic {
        self
    }
}

impl Publisher {
    /// A periodic job on the cron expression `cron` (seconds first) that publishes through this
    /// publisher; give it a name, a zone and a message, then mount it with `b.periodic(..)`:
    ///
    /// ```no_run
    /// # use ruststream_core::*;
    /// # use ruststream_core::periodic::Tz;
    /// # fn demo<B: Broker>(broker: B) -> RustStream {
    /// let publisher = broker.publisher();
    /// RustStream::new(AppInfo::new("reports", "0.1.0")).with_broker(broker, |b| {
    ///     b.periodic(
    ///         publisher
    ///             .every("0 */5 * * * *")
    ///             .name("ping")
    ///             .tz(Tz::UTC)
    ///             .to("pings")
    ///             .message(|| b"ping".to_vec()),
    ///     );
    /// })
    /// # }
    /// ```
    ///
    /// The zone must be set: a job without one is refused at startup.
    pub fn every(&self, cron: impl Into<String>) -> Periodic {
        let mut p = Periodic::new("", cron, Tz::UTC).via(self.clone());
        p.tz = Err(ConfigError::new(
            "tz",
            "no time zone",
            "add `.tz(Tz::UTC)` or the zone the schedule means",
        ));
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_declaration_names_the_option_and_the_job() {
        let job = |tz: &str| {
            Periodic::new("report", "0 0 2 * * *", Tz::UTC)
                .tz_named(tz)
                .to("reports")
                .message(|| b"go".to_vec())
        };
        assert!(job("Europe/Paris").validate().is_ok());
        let e = job("Paris").validate().expect_err("refused");
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "tz", "{e}");
        assert_eq!(config.subject.as_deref(), Some("report"), "{e}");
        let e = Periodic::new("report", "every day", Tz::UTC)
            .message(|| b"go".to_vec())
            .validate()
            .expect_err("refused");
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "cron", "{e}");
        assert_eq!(config.subject.as_deref(), Some("report"), "{e}");
    }
}
