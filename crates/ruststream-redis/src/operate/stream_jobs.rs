//! A stream subscription's jobs: waiting (the entries after its group's last delivered id,
//! `XRANGE key (last + COUNT n`; how many: the group's lag) and running (the group's pending
//! entries, `XPENDING key group - + n`, each with its consumer and idle time, then one
//! `XRANGE key id id` each, in one pipeline, and `TIME` for when each was last delivered). A page is read from the start of its range, so
//! pages past [`STREAM_PAGED`] entries are not listed.

use bytes::Bytes;
use fred::prelude::*;
use ruststream_core::Result;

use super::jobs::{Job, JobPage, JobState};
use crate::error::core;
use crate::keys::SourceKeys;
use crate::reply::{value_bytes, value_frame};
use crate::stream::entries::entry_frames;

/// Most entries of a stream's range a page reads past (its offset plus its length).
pub const STREAM_PAGED: usize = 10_000;

/// The page's bound on entries read: its offset plus its length, at most [`STREAM_PAGED`].
fn read_most(offset: usize, limit: usize) -> i64 {
    i64::try_from(offset.saturating_add(limit).min(STREAM_PAGED)).unwrap_or(0)
}

/// The entries waiting for the group: those after its last delivered id, oldest first.
pub(super) async fn waiting(
    client: &Client,
    q: &SourceKeys,
    offset: usize,
    limit: usize,
) -> Result<JobPage> {
    let Some(group) = &q.group else {
        return Ok(JobPage::empty());
    };
    let state = super::inspect::group_state(client, &q.queue, group).await?;
    let start = if state.last_delivered_id.is_empty() {
        "-".to_owned()
    } else {
        format!("({}", state.last_delivered_id)
    };
    let reply: Value = client
        .custom(
            fred::cmd!("XRANGE"),
            vec![
                Value::from(q.queue.as_str()),
                Value::from(start),
                Value::from_static_str("+"),
                Value::from_static_str("COUNT"),
                Value::Integer(read_most(offset, limit)),
            ],
        )
        .await
        .map_err(core)?;
    let entries = entry_frames(value_frame(reply));
    let read = entries.len() as u64;
    let jobs = entries
        .into_iter()
        .skip(offset)
        .take(limit)
        .map(|(entry, (frame, _))| {
            let mut job = Job::of_decoded(&q.name, JobState::Queued, frame);
            job.entry = Some(String::from_utf8_lossy(&entry).into_owned());
            job
        })
        .collect();
    Ok(JobPage {
        jobs,
        total: state.lag.unwrap_or(read),
    })
}

/// The group's pending entries, oldest first, each with the consumer holding it and how long
/// since it was last delivered.
pub(super) async fn pending(
    client: &Client,
    q: &SourceKeys,
    offset: usize,
    limit: usize,
) -> Result<JobPage> {
    let Some(group) = &q.group else {
        return Ok(JobPage::empty());
    };
    let summary: Value = match client
        .custom(
            fred::cmd!("XPENDING"),
            vec![q.queue.as_str(), group.as_str()],
        )
        .await
    {
        Ok(v) => v,
        Err(e) if no_group(&e) => return Ok(JobPage::empty()),
        Err(e) => return Err(core(e)),
    };
    let total = match &summary {
        Value::Array(items) => items.first().and_then(Value::as_u64).unwrap_or(0),
        _ => 0,
    };
    let rows: Value = client
        .custom(
            fred::cmd!("XPENDING"),
            vec![
                Value::from(q.queue.as_str()),
                Value::from(group.as_str()),
                Value::from_static_str("-"),
                Value::from_static_str("+"),
                Value::Integer(read_most(offset, limit)),
            ],
        )
        .await
        .map_err(core)?;
    let held: Vec<Held> = match rows {
        Value::Array(rows) => rows
            .into_iter()
            .filter_map(held_of)
            .skip(offset)
            .take(limit)
            .collect(),
        _ => Vec::new(),
    };
    if held.is_empty() {
        return Ok(JobPage {
            jobs: Vec::new(),
            total,
        });
    }
    let pipeline = client.pipeline();
    for h in &held {
        let () = pipeline
            .custom(
                fred::cmd!("XRANGE"),
                vec![
                    Value::from(q.queue.as_str()),
                    Value::Bytes(h.entry.clone()),
                    Value::Bytes(h.entry.clone()),
                ],
            )
            .await
            .map_err(core)?;
    }
    let replies: Vec<Value> = pipeline.all().await.map_err(core)?;
    let now = super::inspect::server_ms(client).await?;
    let jobs = held
        .into_iter()
        .zip(replies)
        .map(|(h, reply)| {
            let frame = entry_frames(value_frame(reply))
                .into_iter()
                .next()
                .map(|(_, (frame, _))| frame);
            let mut job = match frame {
                Some(frame) => Job::of_decoded(&q.name, JobState::Running, frame),
                // Deleted while pending (trimmed): it is still settled, with an empty payload.
                None => Job::of_decoded(
                    &q.name,
                    JobState::Running,
                    crate::frame::Frame::decode(Bytes::new()),
                ),
            };
            job.entry = Some(String::from_utf8_lossy(&h.entry).into_owned());
            job.worker = Some(h.consumer);
            job.running_ms = Some(h.idle_ms);
            job.claimed_at_ms = Some(now - i64::try_from(h.idle_ms).unwrap_or(0));
            job.deliveries = Some(h.deliveries);
            job
        })
        .collect();
    Ok(JobPage { jobs, total })
}

/// One row of `XPENDING key group - + n`.
struct Held {
    entry: Bytes,
    consumer: String,
    idle_ms: u64,
    deliveries: u64,
}

fn held_of(row: Value) -> Option<Held> {
    let Value::Array(row) = row else {
        return None;
    };
    let mut row = row.into_iter();
    let entry = value_bytes(row.next()?)?;
    let consumer = row.next()?.as_string().unwrap_or_default();
    let idle_ms = row.next()?.as_u64().unwrap_or(0);
    let deliveries = row.next().and_then(|v| v.as_u64()).unwrap_or(1);
    Some(Held {
        entry,
        consumer,
        idle_ms,
        deliveries,
    })
}

/// Whether `e` says the stream or its group does not exist yet.
fn no_group(e: &fred::error::Error) -> bool {
    crate::error::kind_of(e) == ruststream_core::ErrorKind::NoGroup
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_row_names_its_consumer_idle_time_and_deliveries() {
        let row = Value::Array(vec![
            Value::from("1-0"),
            Value::from("host-1"),
            Value::Integer(1500),
            Value::Integer(3),
        ]);
        let h = held_of(row).expect("a row");
        assert_eq!(
            (&h.entry[..], h.consumer.as_str(), h.idle_ms, h.deliveries),
            (&b"1-0"[..], "host-1", 1500, 3)
        );
        assert!(held_of(Value::Integer(1)).is_none());
        assert_eq!(read_most(0, 50), 50);
        assert_eq!(read_most(usize::MAX, 50), STREAM_PAGED as i64);
    }
}
