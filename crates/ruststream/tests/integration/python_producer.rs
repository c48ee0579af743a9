//! A producer in another language: `examples/python/producer.py` (redis-py) frames messages with
//! an id and headers as the guide's "Wire format" page specifies, and Rust subscribers on the
//! stand's standalone server receive them with that id, those headers and that payload: one on a
//! reliable list (`LPUSH` of a frame, the same bytes as the Rust encoder's), one on a stream
//! group (`XADD` of fields).
//!
//! Runs under `scripts/test`, which starts the server (`RUSTSTREAM_REDIS_URL`) and finds a Python
//! with redis-py (`RUSTSTREAM_PYTHON`, installing `python3-redis` when none has it).

use std::collections::BTreeMap;
use std::future::{Future, ready};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::bytes::Bytes;
use fred::prelude::*;
use ruststream::Headers;
use ruststream::prelude::*;
use ruststream::redis::frame::encode_parts;
use tokio::sync::mpsc;

/// How long any one step may take before the test fails.
const WAIT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Order {
    sku: String,
    qty: u32,
}

outgoing!(Order);

/// One delivery as the handler saw it: id, attempt, headers, message.
type Seen = (String, u32, BTreeMap<String, String>, Order);

/// Sends every delivery to the test.
struct Record(mpsc::UnboundedSender<Seen>);

impl Handle<Order> for Record {
    fn handle(
        &self,
        order: &Order,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        let headers = ctx
            .headers()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // The test may have stopped listening; the delivery is acknowledged either way.
        let _ = self.0.send((
            ctx.message_id().to_owned(),
            ctx.attempt(),
            headers,
            order.clone(),
        ));
        ready(Ok(()))
    }
}

/// Runs the Python producer with `args`, returning the message id it printed.
fn produce(url: &str, args: &[&str]) -> String {
    let python = std::env::var("RUSTSTREAM_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/python/producer.py");
    let out = Command::new(&python)
        .arg(script)
        .args(["--url", url])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    assert!(
        out.status.success(),
        "producer.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

fn headers(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_messages_reach_a_rust_subscriber_with_id_headers_and_payload() {
    let url = std::env::var("RUSTSTREAM_REDIS_URL")
        .expect("RUSTSTREAM_REDIS_URL (run the tests through scripts/test)");
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let tag = format!("pytest-{}-{ms}", std::process::id());
    let queue = format!("{{{tag}}}.orders");
    let stream = format!("{{{tag}}}.events");

    // Sent before the app starts: the list keeps them, the group reads the stream from 0.
    let list_id = produce(
        &url,
        &[
            "--key",
            &queue,
            "--id",
            "order-1",
            "--header",
            "tenant=acme",
            "--header",
            "source=python",
            r#"{"sku": "book", "qty": 2}"#,
        ],
    );
    let stream_id = produce(
        &url,
        &[
            "--stream",
            "--key",
            &stream,
            "--header",
            "tenant=globex",
            r#"{"sku": "pen", "qty": 10}"#,
        ],
    );
    assert_eq!(list_id, "order-1");
    assert!(!stream_id.is_empty(), "a generated id is printed");

    // Python's frame is byte for byte the one the Rust publisher writes for the same message.
    let client = Client::new(Config::from_url(&url).expect("url"), None, None, None);
    client.init().await.expect("connect");
    let entry: Vec<Bytes> = client.lrange(&queue, 0, -1).await.expect("LRANGE");
    let mut hs = Headers::new();
    hs.insert("tenant".into(), "acme".into());
    hs.insert("source".into(), "python".into());
    let rust = encode_parts("order-1", 1, &hs, br#"{"sku":"book","qty":2}"#);
    assert_eq!(entry, [rust]);

    let (tx, mut rx) = mpsc::unbounded_channel();
    let app = RustStream::new(AppInfo::new("python-producer-test", "0.0.0")).with_broker(
        RedisBroker::standalone(url.clone()),
        |b| {
            b.include(subscriber(RedisList::new(&queue).reliable(), Record(tx.clone())).build());
            b.include(subscriber(RedisStream::new(&stream).group("rust"), Record(tx)).build());
        },
    );
    let running = tokio::time::timeout(WAIT, app.start())
        .await
        .expect("the app starts in time")
        .expect("the app starts");

    let mut seen = Vec::new();
    for _ in 0..2 {
        let one = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("a delivery in time")
            .expect("the handler is alive");
        seen.push(one);
    }
    seen.sort_by(|a, b| a.3.sku.cmp(&b.3.sku));
    assert_eq!(
        seen,
        vec![
            (
                "order-1".to_owned(),
                1,
                headers(&[("source", "python"), ("tenant", "acme")]),
                Order {
                    sku: "book".into(),
                    qty: 2
                },
            ),
            (
                stream_id,
                1,
                headers(&[("tenant", "globex")]),
                Order {
                    sku: "pen".into(),
                    qty: 10
                },
            ),
        ]
    );
    tokio::time::timeout(WAIT, running.shutdown())
        .await
        .expect("the app stops in time")
        .expect("the app stops");

    // Acknowledged: nothing is left in flight; then the test's keys go.
    let processing: i64 = client
        .llen(format!("{queue}.processing"))
        .await
        .expect("LLEN");
    assert_eq!(processing, 0, "the list entry was acknowledged");
    let _: i64 = client
        .del(vec![
            queue.clone(),
            format!("{queue}.processing"),
            format!("{queue}.claims"),
            stream,
        ])
        .await
        .expect("DEL");
    client.quit().await.expect("QUIT");
}
