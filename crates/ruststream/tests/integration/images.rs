//! The image service of the guide, both forms (`examples/images.rs`, `examples/images_manual.rs`),
//! end to end on a real Redis, and its AsyncAPI document against the official 3.0.0 schema.
//!
//! The examples hard-code `redis://localhost:6379` and unprefixed keys, so the tests include each
//! example's file into a module (its subscribers, message types and `app()` as written) and mount
//! the same subscribers on the stand's standalone server with the test's own prefix (see
//! `harness`): runs never share keys. That the mount matches the example's `app()` is checked by comparing their
//! AsyncAPI documents.
//!
//! A job that the render subscriber claims the instant it lands cannot be seen on its queue, so the
//! upload is handled in two steps: first an app without the render subscriber (the queue's expiry
//! can be read while the job waits), then the full app, which renders and acknowledges it.

use crate::harness;

use std::time::Duration;

use fred::prelude::*;
use harness::{Env, on, wait_until};
use ruststream::prelude::*;
use ruststream::{RustStream, asyncapi};
use serde_json::{Value, json};

#[allow(dead_code)]
mod images {
    include!("../../examples/images.rs");

    /// `app()`'s subscribers, mounted as `app()` mounts them, on `broker`.
    pub(super) fn app_on(broker: RedisBroker) -> RustStream {
        RustStream::new(AppInfo::new("images", "0.1.0")).with_broker(broker, |b| {
            b.include(warm_cache);
            b.include(render);
            b.include(queue_thumbnail)
                .out_reply(list::Publish::new().ttl(Duration::from_hours(24)));
        })
    }

    /// `app_on` without the render subscriber: thumbnail jobs stay on their queue.
    pub(super) fn producers_on(broker: RedisBroker) -> RustStream {
        RustStream::new(AppInfo::new("images", "0.1.0")).with_broker(broker, |b| {
            b.include(warm_cache);
            b.include(queue_thumbnail)
                .out_reply(list::Publish::new().ttl(Duration::from_hours(24)));
        })
    }

    pub(super) fn example_app() -> RustStream {
        app().into_rust_stream()
    }

    pub(super) async fn publish_warmup(p: &Publisher, page: &str) -> ruststream::Result<()> {
        p.message(&Warmup { page: page.into() }).publish().await?;
        Ok(())
    }
}

#[allow(dead_code)]
mod images_manual {
    include!("../../examples/images_manual.rs");

    pub(super) fn app_on(broker: RedisBroker) -> RustStream {
        RustStream::new(AppInfo::new("images", "0.1.0")).with_broker(broker, |b| {
            b.include(subscriber(RedisList::new("cache.warmups"), WarmCache).build());
            b.include(subscriber(thumbnails(), Render).build());
            b.include(
                subscriber(
                    RedisStream::new("uploads").group("thumbnailer"),
                    QueueThumbnail,
                )
                .reply()
                .to("{thumbnails}")
                .build(),
            )
            .out_reply(list::Publish::new().ttl(Duration::from_hours(24)));
        })
    }

    pub(super) fn producers_on(broker: RedisBroker) -> RustStream {
        RustStream::new(AppInfo::new("images", "0.1.0")).with_broker(broker, |b| {
            b.include(subscriber(RedisList::new("cache.warmups"), WarmCache).build());
            b.include(
                subscriber(
                    RedisStream::new("uploads").group("thumbnailer"),
                    QueueThumbnail,
                )
                .reply()
                .to("{thumbnails}")
                .build(),
            )
            .out_reply(list::Publish::new().ttl(Duration::from_hours(24)));
        })
    }

    pub(super) fn example_app() -> RustStream {
        app().into_rust_stream()
    }

    pub(super) async fn publish_warmup(p: &Publisher, page: &str) -> ruststream::Result<()> {
        p.message(&Warmup { page: page.into() }).publish().await?;
        Ok(())
    }
}

/// One form of the service, as the tests drive it.
struct Form {
    name: &'static str,
    app_on: fn(RedisBroker) -> RustStream,
    producers_on: fn(RedisBroker) -> RustStream,
    example_app: fn() -> RustStream,
}

const MACRO: Form = Form {
    name: "macro",
    app_on: images::app_on,
    producers_on: images::producers_on,
    example_app: images::example_app,
};

const MANUAL: Form = Form {
    name: "manual",
    app_on: images_manual::app_on,
    producers_on: images_manual::producers_on,
    example_app: images_manual::example_app,
};

/// The longest a condition may take: the service's steps under a loaded machine.
const WAIT: Duration = Duration::from_secs(20);

on!([standalone] multi_thread: macro_form_end_to_end, manual_form_end_to_end);

// ---------------------------------------------------------------------------------------------
// What the handlers log: the examples' handlers only log, so the tests read their events.

/// Installs the harness's log capture, which keeps each event's message and fields.
fn capture_events() {
    harness::logs::capture();
}

/// Whether an event with `message` and `field = value` was logged.
fn logged(message: &str, field: &str, value: &str) -> bool {
    !harness::logs::events(message, field, value).is_empty()
}

fn count_logged(message: &str, field: &str, value: &str) -> usize {
    harness::logs::events(message, field, value).len()
}

// ---------------------------------------------------------------------------------------------

async fn service_end_to_end(env: &Env, form: &Form) {
    capture_events();
    let redis = &env.client;
    let k = &|key: &str| env.key(key);
    // A broker of its own for each app, as separate deployments would have.
    let broker = || env.broker_with(|b| b);

    // The mount under test is the example's: same subscribers, sources and replies.
    assert_eq!(
        asyncapi::document(&(form.app_on)(broker())),
        asyncapi::document(&(form.example_app)()),
        "{}: the test mounts what the example's app() mounts",
        form.name
    );

    // Step 1: everything but the render subscriber.
    let producers = broker();
    let publisher = producers.publisher();
    let running = env.start((form.producers_on)(producers)).await;

    // A warmup published to `cache.warmups` (the type's outgoing name) is handled.
    let page = &format!("/pages/{}-warm", form.name);
    let publish = match form.name {
        "macro" => images::publish_warmup(&publisher, page).await,
        _ => images_manual::publish_warmup(&publisher, page).await,
    };
    publish.expect("warmup published");
    wait_until("the warmup is handled", WAIT, async || {
        logged("page cached", "warmup.page", page)
    })
    .await;
    assert_eq!(
        env.llen("cache.warmups").await,
        0,
        "the simple queue popped the warmup"
    );

    // An upload added to the stream becomes a thumbnail job on `{thumbnails}`, which expires
    // in 24 hours unless fed.
    let image = &format!("{}-{}.png", form.name, std::process::id());
    let _: String = redis
        .custom(
            fred::cmd!("XADD"),
            vec![
                k("uploads"),
                "*".to_owned(),
                "payload".to_owned(),
                json!({ "image": image }).to_string(),
            ],
        )
        .await
        .expect("XADD uploads");
    // Nothing takes the job off its queue while the render subscriber is not running.
    wait_until("the thumbnail job is queued", WAIT, async || {
        env.llen("{thumbnails}").await > 0
    })
    .await;
    let entries = env.lrange("{thumbnails}").await;
    assert_eq!(entries.len(), 1, "one upload, one job: {entries:?}");
    let frame = ruststream_redis::frame::Frame::decode(entries[0].clone());
    let job: Value = serde_json::from_slice(&frame.payload).expect("the job is JSON");
    assert_eq!(job, json!({ "image": image }));
    let pttl = env.pttl("{thumbnails}").await;
    let day = 24 * 60 * 60 * 1000;
    assert!(
        (day - 60 * 1000..=day).contains(&pttl),
        "the queue expires in ~24 h: PTTL = {pttl} ms"
    );
    // The upload itself was acknowledged once the reply was out.
    wait_until("the upload is acknowledged", WAIT, async || {
        let summary: fred::types::Value = redis
            .custom(
                fred::cmd!("XPENDING"),
                vec![k("uploads"), "thumbnailer".to_owned()],
            )
            .await
            .expect("XPENDING");
        summary
            .into_array()
            .first()
            .and_then(fred::types::Value::as_i64)
            == Some(0)
    })
    .await;
    env.stop(running).await;
    assert!(
        !logged("thumbnail rendered", "job.image", image),
        "nothing rendered before the render subscriber runs"
    );

    // Step 2: the whole service renders the job and acknowledges it.
    let running = env.start((form.app_on)(broker())).await;
    wait_until("the job is rendered", WAIT, async || {
        logged("thumbnail rendered", "job.image", image)
    })
    .await;
    // Acknowledged: not queued, claimed, waiting for a retry, nor dead.
    wait_until(
        "the job is acknowledged: queue, processing list, claims, delayed set and dead letters are empty",
        WAIT,
        async || {
            env.llen("{thumbnails}").await == 0
                && env.llen("{thumbnails}.processing").await == 0
                && env.zcard("{thumbnails}.claims").await == 0
                && env.zcard("{thumbnails}.delayed").await == 0
                && env.llen("{thumbnails}.dead").await == 0
        },
    )
    .await;
    env.stop(running).await;
    assert_eq!(
        count_logged("thumbnail rendered", "job.image", image),
        1,
        "rendered once"
    );
    assert_eq!(
        count_logged("page cached", "warmup.page", page),
        1,
        "warmed once"
    );
}

async fn macro_form_end_to_end(env: &Env) {
    service_end_to_end(env, &MACRO).await;
}

async fn manual_form_end_to_end(env: &Env) {
    service_end_to_end(env, &MANUAL).await;
}

// ---------------------------------------------------------------------------------------------
// AsyncAPI

fn asyncapi_validator() -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(include_str!("../asyncapi/3.0.0.json"))
        .expect("the vendored AsyncAPI schema is JSON");
    jsonschema::draft7::new(&schema).expect("the AsyncAPI 3.0.0 schema compiles")
}

/// Every `$ref` in `doc` that points into the document resolves.
fn dangling_refs(doc: &Value) -> Vec<String> {
    fn walk(root: &Value, v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, child) in map {
                    if k == "$ref"
                        && let Value::String(r) = child
                    {
                        let found = r
                            .strip_prefix('#')
                            .and_then(|pointer| root.pointer(pointer));
                        if found.is_none() {
                            out.push(r.clone());
                        }
                    } else {
                        walk(root, child, out);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(root, i, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(doc, doc, &mut out);
    out
}

#[test]
fn asyncapi_document_is_valid() {
    let validator = asyncapi_validator();
    for form in [&MACRO, &MANUAL] {
        let doc = asyncapi::document(&(form.example_app)());
        let errors: Vec<String> = validator
            .iter_errors(&doc)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{}: the document breaks the AsyncAPI 3.0.0 schema:\n{}\n{doc:#}",
            form.name,
            errors.join("\n")
        );
        assert_eq!(dangling_refs(&doc), Vec::<String>::new(), "{}", form.name);
    }
}

#[test]
fn asyncapi_validator_rejects_a_broken_document() {
    // The validator is no rubber stamp: an operation without an action is refused.
    let validator = asyncapi_validator();
    let mut doc = asyncapi::document(&(MACRO.example_app)());
    let ops = doc["operations"].as_object_mut().expect("operations");
    let first = ops.values_mut().next().expect("an operation");
    first.as_object_mut().expect("object").remove("action");
    assert!(!validator.is_valid(&doc));
}

#[test]
fn both_forms_document_the_same_service() {
    // `#[derive(Outgoing)]`'s schema equals `#[derive(JsonSchema)]` + `outgoing!`'s.
    assert_eq!(
        asyncapi::document(&(MACRO.example_app)()),
        asyncapi::document(&(MANUAL.example_app)())
    );
}

#[test]
fn asyncapi_document_describes_the_service() {
    let doc = asyncapi::document(&(MACRO.example_app)());
    assert_eq!(doc["asyncapi"], "3.0.0");
    assert_eq!(
        doc["info"],
        json!({ "title": "images", "version": "0.1.0" })
    );
    let channels = doc["channels"].as_object().expect("channels");
    let by_address = |address: &str| {
        channels
            .values()
            .find(|c| c["address"] == address)
            .unwrap_or_else(|| panic!("a channel for {address}: {doc:#}"))
    };
    assert_eq!(by_address("cache.warmups")["x-redis"]["mode"], "simple");
    let thumbnails = by_address("{thumbnails}");
    assert_eq!(thumbnails["x-redis"]["mode"], "reliable");
    assert_eq!(thumbnails["x-redis"]["recoveryZset"], "{thumbnails}.claims");
    assert_eq!(by_address("uploads")["x-redis"]["group"], "thumbnailer");

    // The upload consumer replies with a ThumbnailJob on `{thumbnails}`.
    let ops = doc["operations"].as_object().expect("operations");
    let upload_op = ops
        .values()
        .find(|o| {
            o["channel"]["$ref"]
                .as_str()
                .is_some_and(|r| r.ends_with("/uploads"))
        })
        .expect("an operation on uploads");
    assert_eq!(upload_op["action"], "receive");
    let reply_channel = upload_op["reply"]["channel"]["$ref"]
        .as_str()
        .and_then(|r| doc.pointer(r.trim_start_matches('#')))
        .expect("the reply channel resolves");
    assert_eq!(reply_channel["address"], "{thumbnails}");
    let job = &doc["components"]["messages"]["ThumbnailJob"]["payload"];
    assert_eq!(job["type"], "object");
    assert_eq!(job["properties"]["image"]["type"], "string");
    assert_eq!(job["required"], json!(["image"]));
}

#[test]
fn asyncapi_yaml_says_the_same() {
    let doc = asyncapi::document(&(MACRO.example_app)());
    let yaml = ruststream::cli::render(&doc, ruststream::cli::Format::Yaml).expect("YAML");
    assert!(yaml.starts_with("asyncapi: \"3.0.0\"\n"), "{yaml}");
    assert!(yaml.contains("address: \"{thumbnails}\""), "{yaml}");
    let json = ruststream::cli::render(&doc, ruststream::cli::Format::Json).expect("JSON");
    let back: Value = serde_json::from_str(&json).expect("JSON parses");
    assert_eq!(back, doc);
}
