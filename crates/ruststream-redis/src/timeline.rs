//! A message's history, the `rs.history` header ([`HISTORY_HEADER`]): the last
//! [`HISTORY_EVENTS`] times it went back to its queue (a retry, a snooze, a durable sleep, a
//! wait for a signal) or to the dead letters, each with its time, the attempt it ended and why.
//! The settle writes it into the frame it already rewrites for a retry or a dead letter, so it
//! costs no command, and a first delivery's ack writes nothing. Sends no command.
//!
//! One event a line: `<unix ms> <kind> <attempt> <reason>`, the time on the worker's clock, the
//! reason cut to [`REASON_BYTES`] bytes, its line breaks made spaces.

use ruststream_core::{Headers, Why};
use serde::Serialize;

/// The header that holds a message's history.
pub const HISTORY_HEADER: &str = "rs.history";

/// Most events the header keeps: the newest.
pub const HISTORY_EVENTS: usize = 10;

/// Most bytes of an event's reason (cut at a character's boundary).
pub const REASON_BYTES: usize = 200;

/// One event of a job's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Event {
    /// When, in ms since the epoch; `None` when it is not known.
    pub at_ms: Option<i64>,
    /// `published`, `claimed`, `retry`, `snooze`, `sleep`, `wait` or `dead`.
    pub kind: String,
    /// The attempt it happened on, when known.
    pub attempt: Option<u32>,
    /// Why (a reason), or who (a claim's worker); empty when nothing was said.
    pub detail: String,
}

impl Event {
    /// An event of `kind` at `at_ms` on `attempt`, for `detail`.
    pub fn new(at_ms: Option<i64>, kind: &str, attempt: Option<u32>, detail: &str) -> Self {
        Self {
            at_ms,
            kind: kind.to_owned(),
            attempt,
            detail: detail.to_owned(),
        }
    }
}

impl Event {
    /// Its time for people, `2026-01-31 09:15:02.250 UTC`, or `time not known`.
    pub fn at_text(&self) -> String {
        self.at_ms
            .and_then(utc_text)
            .unwrap_or_else(|| "time not known".to_owned())
    }
}

/// A time in ms since the epoch for people, in UTC to the ms: `2026-01-31 09:15:02.250 UTC`;
/// `None` outside the range a date can show.
pub fn utc_text(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string())
}

/// `headers` with the event `why` on `attempt` appended to their history, now on this clock,
/// the oldest events dropped past [`HISTORY_EVENTS`].
pub(crate) fn with_event(headers: &Headers, why: &Why, attempt: u32) -> Headers {
    let line = format!("{} {} {attempt} {}", now_ms(), why.kind, cut(&why.reason));
    let mut lines: Vec<&str> = headers
        .get(HISTORY_HEADER)
        .map(|h| h.lines().filter(|l| !l.is_empty()).collect())
        .unwrap_or_default();
    lines.push(line.trim_end());
    let keep = lines.len().saturating_sub(HISTORY_EVENTS);
    let value = lines[keep..].join("\n");
    let mut headers = headers.clone();
    headers.insert(HISTORY_HEADER.to_owned(), value);
    headers
}

/// The events of a history header's `value`, oldest first; a line that does not read as an
/// event is kept whole as the detail of an event of kind `?`.
pub fn events(value: &str) -> Vec<Event> {
    value
        .lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            let mut parts = line.splitn(4, ' ');
            let at = parts.next().and_then(|t| t.parse::<i64>().ok());
            let kind = parts.next().filter(|k| !k.is_empty());
            let attempt = parts.next().and_then(|a| a.parse::<u32>().ok());
            match (at, kind, attempt) {
                (Some(at), Some(kind), Some(attempt)) => {
                    Event::new(Some(at), kind, Some(attempt), parts.next().unwrap_or(""))
                }
                _ => Event::new(None, "?", None, line),
            }
        })
        .collect()
}

/// When the message `id` was published, in ms since the epoch: the first 48 bits of a UUIDv7
/// (the ids the library makes); `None` for any other id.
pub fn published_ms(id: &str) -> Option<i64> {
    let u = uuid::Uuid::try_parse(id).ok()?;
    if u.get_version_num() != 7 {
        return None;
    }
    let b = u.as_bytes();
    Some(b[..6].iter().fold(0_i64, |ms, &x| ms * 256 + i64::from(x)))
}

/// `reason` on one line, cut to [`REASON_BYTES`] bytes at a character's boundary.
fn cut(reason: &str) -> String {
    let mut end = reason.len().min(REASON_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].replace(['\n', '\r'], " ")
}

/// Now on this machine's clock, in ms since the epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_keeps_the_newest_events_with_their_reasons_on_one_line() {
        let mut h = Headers::new();
        for n in 1..=30 {
            h = with_event(&h, &Why::snooze(format!("busy {n}\nretry later")), 1);
        }
        let e = events(&h[HISTORY_HEADER]);
        assert_eq!(e.len(), HISTORY_EVENTS);
        assert_eq!(e[0].detail, "busy 21 retry later");
        assert_eq!(e[9].detail, "busy 30 retry later");
        assert!(e.iter().all(|e| e.kind == "snooze" && e.attempt == Some(1)));
        assert!(e[9].at_ms.is_some_and(|t| t > 1_600_000_000_000));
    }

    #[test]
    fn a_long_reason_is_cut_at_a_character_boundary() {
        let h = with_event(&Headers::new(), &Why::retry("é".repeat(150)), 2);
        let e = events(&h[HISTORY_HEADER]);
        assert_eq!(e[0].detail.len(), REASON_BYTES);
        assert_eq!(e[0].kind, "retry");
        let empty = with_event(&Headers::new(), &Why::retry(""), 3);
        assert_eq!(events(&empty[HISTORY_HEADER])[0].detail, "");
        assert_eq!(events("garbage here")[0].kind, "?");
    }

    #[test]
    fn only_a_uuid_v7_says_when_it_was_published() {
        let id = uuid::Uuid::now_v7().to_string();
        let at = published_ms(&id).expect("a UUIDv7");
        assert!((now_ms() - at).abs() < 60_000, "{at}");
        assert_eq!(
            published_ms(
                &uuid::Builder::from_random_bytes([7; 16])
                    .into_uuid()
                    .to_string()
            ),
            None
        );
        assert_eq!(published_ms("order-7"), None);
        let e = Event::new(Some(1_700_000_000_250), "published", None, "");
        assert_eq!(e.at_text(), "2023-11-14 22:13:20.250 UTC");
        assert_eq!(
            Event::new(None, "dead", None, "").at_text(),
            "time not known"
        );
    }
}
