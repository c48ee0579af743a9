//! [`Schedule`]: a cron expression in an explicit time zone, and its ticks as epoch milliseconds.

use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;

use crate::{ConfigError, Result};

/// A cron expression with seconds (`sec min hour day-of-month month day-of-week [year]`, as the
/// [`cron`] crate reads it) in a named time zone: `0 0 9 * * Mon-Fri` in `Europe/Paris` ticks at
/// 09:00 Paris time, summer and winter.
///
/// ```
/// use ruststream_core::periodic::{Schedule, Tz};
/// let every_5_min = Schedule::new("0 */5 * * * *", Tz::UTC).unwrap();
/// assert_eq!(every_5_min.next_after(0), Some(300_000));
/// assert!(Schedule::new("*/5 * * * *", Tz::UTC).is_err()); // no seconds field
/// ```
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: cron::Schedule,
    tz: Tz,
}

impl Schedule {
    /// Parses `expr` in the zone `tz`; the error says what a valid expression looks like.
    pub fn new(expr: &str, tz: Tz) -> Result<Self> {
        Ok(Self::read(expr, tz)?)
    }

    /// [`new`](Self::new), with the error as a [`ConfigError`] on no job yet.
    pub(crate) fn read(expr: &str, tz: Tz) -> std::result::Result<Self, ConfigError> {
        let cron = cron::Schedule::from_str(expr.trim()).map_err(|e| {
            ConfigError::new(
                "cron",
                format!("`{expr}` is not a cron expression{}", detail(&e)),
                "write six or seven fields, seconds first: \
                 `sec min hour day-of-month month day-of-week [year]`, e.g. `0 */5 * * * *` \
                 for every five minutes",
            )
        })?;
        Ok(Self { cron, tz })
    }

    /// Parses `expr` in the IANA zone named `tz` (`Europe/Paris`, `UTC`).
    pub fn parse(expr: &str, tz: &str) -> Result<Self> {
        Self::new(expr, parse_tz(tz)?)
    }

    /// The expression as written.
    pub fn expr(&self) -> &str {
        self.cron.source()
    }

    /// The time zone.
    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// The first tick strictly after `ms` (epoch milliseconds); `None` when there is none (an
    /// expression whose years are over).
    pub fn next_after(&self, ms: u64) -> Option<u64> {
        let at = self.at(ms)?;
        self.cron.after(&at).next().and_then(|t| to_ms(&t))
    }

    /// The latest tick at or before `now` and strictly after `after` (epoch milliseconds), if any.
    pub fn latest_between(&self, after: u64, now: u64) -> Option<u64> {
        let end = self.at(now.checked_add(1)?)?;
        self.cron
            .after(&end)
            .next_back()
            .and_then(|t| to_ms(&t))
            .filter(|&t| t > after)
    }

    fn at(&self, ms: u64) -> Option<DateTime<Tz>> {
        let ms = i64::try_from(ms).ok()?;
        Utc.timestamp_millis_opt(ms)
            .single()
            .map(|t| t.with_timezone(&self.tz))
    }
}

/// ` (why)` when the parser's reason fits on one line (its syntax errors quote the input over
/// several lines instead), else nothing.
fn detail(e: &cron::error::Error) -> String {
    let text = e.to_string();
    if text.contains('\n') {
        String::new()
    } else {
        format!(" ({text})")
    }
}

/// The zone named `name`, or an error saying how to name one.
pub fn parse_tz(name: &str) -> Result<Tz> {
    Ok(tz_named(name)?)
}

/// [`parse_tz`], with the error as a [`ConfigError`] on no job yet.
pub(crate) fn tz_named(name: &str) -> std::result::Result<Tz, ConfigError> {
    name.parse::<Tz>().map_err(|_| {
        ConfigError::new(
            "tz",
            format!("`{name}` is not a time zone"),
            "use an IANA name such as `UTC` or `Europe/Paris`",
        )
    })
}

fn to_ms<Z: TimeZone>(t: &DateTime<Z>) -> Option<u64> {
    u64::try_from(t.timestamp_millis()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_follow_the_zone() {
        // 2026-07-01 00:00:00 UTC; 09:00 in Paris (summer) is 07:00 UTC.
        let start = 1_782_864_000_000;
        let paris = Schedule::parse("0 0 9 * * *", "Europe/Paris").unwrap();
        assert_eq!(paris.next_after(start), Some(start + 7 * 3_600_000));
        let utc = Schedule::parse("0 0 9 * * *", "UTC").unwrap();
        assert_eq!(utc.next_after(start), Some(start + 9 * 3_600_000));
    }

    #[test]
    fn latest_between_is_inclusive_of_now_and_exclusive_of_after() {
        let s = Schedule::new("*/10 * * * * *", Tz::UTC).unwrap();
        assert_eq!(s.latest_between(0, 25_000), Some(20_000));
        assert_eq!(s.latest_between(0, 20_000), Some(20_000));
        assert_eq!(s.latest_between(20_000, 29_999), None);
        assert_eq!(s.next_after(20_000), Some(30_000));
    }

    #[test]
    fn bad_input_says_how_to_fix_it() {
        let e = Schedule::new("every 5 minutes", Tz::UTC).unwrap_err();
        let cron = e.config_error().expect("a configuration error");
        assert_eq!(cron.option, "cron");
        assert!(cron.fix.contains("seconds first"), "{e}");
        let e = parse_tz("Paris").unwrap_err();
        let tz = e.config_error().expect("a configuration error");
        assert_eq!(tz.option, "tz");
        assert!(tz.fix.contains("Europe/Paris"), "{e}");
    }
}
