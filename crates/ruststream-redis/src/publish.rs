//! Publishing to Redis: `LPUSH` (several values in one command), the `PUSH_TTL` script for a list
//! with an expiry, the `SCHEDULE` script for delayed messages, `XADD` for streams, `PUBLISH` for
//! Pub/Sub channels (a batch in one pipeline). Messages for different keys go out concurrently on
//! the pool, which pipelines them.

use fred::prelude::*;
use futures::future::{BoxFuture, try_join_all};
use ruststream_core::{Due, OutMessage, PublishBackend, Result};

use crate::broker::{Inner, PublishPolicy, poisoned};
use crate::error::{PubSubError, core};
use crate::frame::encode_parts;
use crate::stream::{ATTEMPT_FIELD, ID_FIELD, PAYLOAD_FIELD};
use crate::{list, scripts};

/// The publish backend of a [`RedisBroker`](crate::RedisBroker).
pub(crate) struct RedisPublisher {
    pub(crate) inner: std::sync::Arc<Inner>,
}

impl PublishBackend for RedisPublisher {
    fn publish(&self, messages: Vec<OutMessage>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            // A publisher taken from a broker that no app started connects on first use.
            if self.inner.pool().is_err() {
                crate::RedisBroker {
                    inner: self.inner.clone(),
                }
                .connect()
                .await?;
            }
            publish(&self.inner, messages, None).await
        })
    }
}

/// A new message id: a UUIDv7, so ids sort by creation time.
pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Messages for one key with one policy.
struct Batch {
    key: String,
    policy: PublishPolicy,
    now: Vec<Value>,
    later: Vec<Value>,
    stream: Vec<Vec<Value>>,
}

/// Publishes `messages`, each with `policy` or its destination's default.
pub(crate) async fn publish(
    inner: &Inner,
    messages: Vec<OutMessage>,
    policy: Option<PublishPolicy>,
) -> Result<()> {
    let pool = inner.pool()?;
    let mut batches: Vec<Batch> = Vec::new();
    {
        let routes = inner.routes.read().map_err(poisoned)?;
        for m in messages {
            let policy = policy
                .or_else(|| routes.get(&m.destination).copied())
                .unwrap_or(PublishPolicy::List(list::Publish::new()));
            let key = inner.key(&m.destination);
            let idx = match batches
                .iter()
                .position(|b| b.key == key && b.policy == policy)
            {
                Some(i) => i,
                None => {
                    batches.push(Batch {
                        key,
                        policy,
                        now: Vec::new(),
                        later: Vec::new(),
                        stream: Vec::new(),
                    });
                    batches.len() - 1
                }
            };
            if policy == PublishPolicy::PubSub && m.due.is_some() {
                return Err(PubSubError::CannotDelay {
                    channel: m.destination,
                }
                .into());
            }
            add(&mut batches[idx], m)?;
        }
    }
    try_join_all(batches.into_iter().map(|b| send(&pool, inner, b))).await?;
    Ok(())
}

fn add(b: &mut Batch, m: OutMessage) -> Result<()> {
    let id = m.id.unwrap_or_else(new_id);
    match b.policy {
        // Checked by `publish`: a channel message is never delayed.
        PublishPolicy::PubSub => {
            b.now
                .push(Value::Bytes(encode_parts(&id, 1, &m.headers, &m.payload)));
        }
        PublishPolicy::List(_) => {
            let frame = encode_parts(&id, 1, &m.headers, &m.payload);
            match m.due {
                None => b.now.push(Value::Bytes(frame)),
                Some(due) => {
                    let (kind, ms) = due_arg(due);
                    b.later.extend([
                        Value::from_static_str(kind),
                        Value::Integer(ms),
                        Value::from(id),
                        Value::Bytes(frame),
                    ]);
                }
            }
        }
        PublishPolicy::Stream => {
            if let Some(due) = m.due {
                // Waits in the delayed set as a frame; the mover turns it into stream fields.
                let (kind, ms) = due_arg(due);
                let frame = encode_parts(&id, 1, &m.headers, &m.payload);
                b.later.extend([
                    Value::from_static_str(kind),
                    Value::Integer(ms),
                    Value::from(id),
                    Value::Bytes(frame),
                ]);
                return Ok(());
            }
            let mut fields = Vec::with_capacity(4 + 2 * m.headers.len());
            fields.push(Value::from_static_str(PAYLOAD_FIELD));
            fields.push(Value::Bytes(m.payload));
            fields.push(Value::from_static_str(ID_FIELD));
            fields.push(Value::from(id));
            for (k, v) in m.headers {
                if k == PAYLOAD_FIELD || k == ID_FIELD || k == ATTEMPT_FIELD {
                    continue;
                }
                fields.push(Value::from(k));
                fields.push(Value::from(v));
            }
            b.stream.push(fields);
        }
    }
    Ok(())
}

fn due_arg(due: Due) -> (&'static str, i64) {
    match due {
        Due::In(d) => ("in", i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        Due::At(t) => (
            "at",
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        ),
    }
}

async fn send(pool: &Pool, inner: &Inner, b: Batch) -> Result<()> {
    let client = pool.next();
    if !b.now.is_empty() {
        match b.policy {
            PublishPolicy::PubSub => {
                crate::pubsub::publish(client, &b.key, b.now).await?;
            }
            PublishPolicy::List(list::Publish { ttl: Some(ttl) }) => {
                let mut args = Vec::with_capacity(b.now.len() + 1);
                args.push(Value::Integer(
                    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1),
                ));
                args.extend(b.now);
                let _: i64 = scripts::PUSH_TTL
                    .evalsha_with_reload(client, vec![b.key.clone()], args)
                    .await
                    .map_err(core)?;
            }
            _ => {
                let _: i64 = client.lpush(&b.key, b.now).await.map_err(core)?;
            }
        }
    }
    if !b.later.is_empty() {
        let (zset, hash) = inner.delayed_keys(&b.key);
        let _: i64 = scripts::SCHEDULE
            .evalsha_with_reload(client, vec![zset, hash], b.later)
            .await
            .map_err(core)?;
    }
    if !b.stream.is_empty() {
        // One pipeline rather than a future per entry: the batch fill of a stream ran at
        // ~130k/s, its profile a third task switches.
        let pipeline = client.pipeline();
        for fields in b.stream {
            let mut args = Vec::with_capacity(fields.len() + 2);
            args.push(Value::from(b.key.as_str()));
            args.push(Value::from_static_str("*"));
            args.extend(fields);
            let () = pipeline
                .custom(fred::cmd!("XADD"), args)
                .await
                .map_err(core)?;
        }
        let _: Vec<Value> = pipeline.all().await.map_err(core)?;
    }
    Ok(())
}
