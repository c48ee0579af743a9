use std::future::{Future, ready};
use std::process::ExitCode;
use std::time::Duration;

use ruststream::prelude::*;

// ANCHOR: simple
#[derive(Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[schemars(crate = "ruststream::schemars")]
struct Warmup {
    page: String,
}

outgoing!(Warmup, "cache.warmups");

struct WarmCache;

impl Handle<Warmup> for WarmCache {
    fn handle(
        &self,
        warmup: &Warmup,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        tracing::info!(warmup.page, "page cached");
        ready(Ok(()))
    }
}
// ANCHOR_END: simple

// ANCHOR: reliable
/// How long a crashed worker's jobs wait before another worker takes them back.
const MIN_IDLE: Duration = Duration::from_secs(60);

#[derive(Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[schemars(crate = "ruststream::schemars")]
struct ThumbnailJob {
    image: String,
}

outgoing!(ThumbnailJob);

struct Render;

impl Handle<ThumbnailJob> for Render {
    fn handle(
        &self,
        job: &ThumbnailJob,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        tracing::info!(job.image, "thumbnail rendered");
        ready(Ok(()))
    }
}

fn thumbnails() -> RedisList {
    RedisList::new("{thumbnails}")
        .reliable()
        .min_idle(MIN_IDLE)
        .recovery_zset("{thumbnails}.claims")
}
// ANCHOR_END: reliable

// ANCHOR: feed
#[derive(Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[schemars(crate = "ruststream::schemars")]
struct Upload {
    image: String,
}

outgoing!(Upload, "uploads");

struct QueueThumbnail;

impl Handle<Upload, ThumbnailJob> for QueueThumbnail {
    fn handle(
        &self,
        upload: &Upload,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<ThumbnailJob, HandlerOutcome>> {
        ready(Ok(ThumbnailJob {
            image: upload.image.clone(),
        }))
    }
}
// ANCHOR_END: feed

// ANCHOR: app
fn app() -> impl App {
    RustStream::new(AppInfo::new("images", "0.1.0")).with_broker(
        RedisBroker::standalone("redis://localhost:6379"),
        |b| {
            b.include(subscriber(RedisList::new("cache.warmups"), WarmCache).build());
            b.include(subscriber(thumbnails(), Render).build());
            // A queue nobody fed for a day expires, with whatever is left in it.
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
        },
    )
}

fn main() -> ExitCode {
    run_main(app)
}
// ANCHOR_END: app
