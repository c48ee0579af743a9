//! Connection, server, scripting and pub/sub commands (`PUBLISH`, `SPUBLISH`, `PUBSUB`).

use super::*;

/// Runs the command `name` (upper case) of this module.
pub(super) fn execute(st: &mut State, now: u64, name: &str, args: &[Bytes]) -> R<Value> {
    let n = args.len();
    let need = |k: usize| if n < k { Err(wrong_args(name)) } else { Ok(()) };
    match name {
        "PING" => Ok(match args.first() {
            Some(m) => bulk(m.clone()),
            None => Value::String("PONG".into()),
        }),
        "ECHO" => {
            need(1)?;
            Ok(bulk(args[0].clone()))
        }
        "QUIT" | "SELECT" | "READONLY" | "READWRITE" | "ASKING" | "RESET" | "AUTH" => Ok(ok()),
        "TIME" => Ok(array([
            Bytes::from((now / 1000).to_string()),
            Bytes::from(((now % 1000) * 1000).to_string()),
        ])),
        "DBSIZE" => Ok(int(st.db.keys.len())),
        "FLUSHALL" | "FLUSHDB" => {
            st.db.keys.clear();
            Ok(ok())
        }
        "INFO" => Ok(bulk(Bytes::from_static(
            b"# Server\r\nredis_version:7.2.0\r\nredis_mode:standalone\r\nruststream_model:1\r\n",
        ))),
        // The model has no replicas; it answers as a server whose asked replicas all hold every
        // write already, so a durable publish succeeds at once (see the crate docs).
        "WAIT" => {
            need(2)?;
            std::str::from_utf8(&args[0])
                .ok()
                .and_then(|n| n.parse::<i64>().ok())
                .map(Value::Integer)
                .ok_or_else(|| err("ERR value is not an integer or out of range"))
        }
        "CLIENT" => {
            need(1)?;
            Ok(client(st, args))
        }
        "SCRIPT" | "EVAL" | "EVALSHA" => super::lua::command(st, now, name, args),
        "PUBLISH" | "SPUBLISH" => {
            need(2)?;
            st.journal.push(Change::Channel {
                channel: args[0].clone(),
                message: args[1].clone(),
            });
            Ok(int(if name == "PUBLISH" {
                st.publish(&args[0], &args[1])
            } else {
                st.spublish(&args[0], &args[1])
            }))
        }
        "PUBSUB" => {
            need(1)?;
            pubsub(st, args)
        }
        _ => Err(unknown(name)),
    }
}

/// `CLIENT <sub> ..`: ids count up per call; the rest answer as a lone client's would.
fn client(st: &mut State, args: &[Bytes]) -> Value {
    match upper(&args[0]).as_str() {
        "ID" => {
            st.next_client_id += 1;
            Value::Integer(st.next_client_id)
        }
        "UNBLOCK" => Value::Integer(0),
        "GETNAME" => Value::Null,
        "LIST" | "INFO" => bulk(Bytes::new()),
        _ => ok(),
    }
}

/// `PUBSUB <sub> ..`, counting the model's live subscribers (plain or sharded).
fn pubsub(st: &State, args: &[Bytes]) -> R<Value> {
    let sub = upper(&args[0]);
    match sub.as_str() {
        "NUMPAT" => Ok(int(st
            .patterns
            .iter()
            .filter(|(_, tx)| tx.receiver_count() > 0)
            .count())),
        "NUMSUB" | "SHARDNUMSUB" => {
            let channels = if sub == "NUMSUB" {
                &st.channels
            } else {
                &st.shards
            };
            Ok(Value::Array(
                args[1..]
                    .iter()
                    .flat_map(|c| {
                        let n = channels.get(c).map_or(0, |tx| tx.receiver_count());
                        [bulk(c.clone()), int(n)]
                    })
                    .collect(),
            ))
        }
        "CHANNELS" | "SHARDCHANNELS" => {
            let channels = if sub == "CHANNELS" {
                &st.channels
            } else {
                &st.shards
            };
            Ok(array(
                channels
                    .iter()
                    .filter(|(c, tx)| {
                        tx.receiver_count() > 0 && args.get(1).is_none_or(|p| glob(p, c))
                    })
                    .map(|(c, _)| c.clone())
                    .collect::<Vec<_>>(),
            ))
        }
        other => Err(err(format!(
            "ERR the in-memory model does not implement 'PUBSUB {other}'"
        ))),
    }
}
