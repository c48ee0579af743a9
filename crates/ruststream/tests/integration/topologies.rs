//! The image service (`examples/images.rs`) on a Redis Cluster, unchanged but for its broker; the
//! slot rule refusing an untagged reliable queue; an app on a Sentinel-managed primary.

use crate::harness;

use std::future::{Future, ready};
use std::time::Duration;

use harness::{Env, Seen, bounded, on, redis_url, stop, unique, wait_until};
use ruststream::prelude::*;

on!(
    [cluster]
    the_image_service_runs_unchanged_on_the_cluster,
    an_untagged_reliable_queue_is_refused_on_the_cluster_with_the_tag_to_use,
);

/// The service's handlers are the harness's recorder: what each saw, sorted.
impl Seen<Warmup> {
    fn get(&self) -> Vec<String> {
        let mut v: Vec<String> = self.seen().iter().map(|w| w.page.clone()).collect();
        v.sort();
        v
    }
}

impl Seen<ThumbnailJob> {
    fn get(&self) -> Vec<String> {
        let mut v: Vec<String> = self.seen().iter().map(|j| j.image.clone()).collect();
        v.sort();
        v
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Warmup {
    page: String,
}
outgoing!(Warmup, "cache.warmups");

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
struct ThumbnailJob {
    image: String,
}
outgoing!(ThumbnailJob);

#[derive(Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
struct Upload {
    image: String,
}
outgoing!(Upload, "uploads");

struct QueueThumbnail;
impl Handle<Upload, ThumbnailJob> for QueueThumbnail {
    fn handle(
        &self,
        u: &Upload,
        _: &(),
        _: &mut Context<'_>,
    ) -> impl Future<Output = Result<ThumbnailJob, HandlerOutcome>> {
        ready(Ok(ThumbnailJob {
            image: u.image.clone(),
        }))
    }
}

fn thumbnails() -> RedisList {
    RedisList::new("{thumbnails}")
        .reliable()
        .min_idle(Duration::from_secs(60))
        .recovery_zset("{thumbnails}.claims")
}

/// The image service as examples/images_manual.rs builds it, on `broker`.
fn images(broker: RedisBroker, pages: &Seen<Warmup>, renders: &Seen<ThumbnailJob>) -> RustStream {
    RustStream::new(AppInfo::new("images", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(2))
        .with_broker(broker, |b| {
            b.include(subscriber(RedisList::new("cache.warmups"), pages.clone()).build());
            b.include(subscriber(thumbnails(), renders.clone()).build());
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

async fn the_image_service_runs_unchanged_on_the_cluster(env: &Env) {
    let (pages, renders) = (Seen::default(), Seen::default());
    let broker = env.broker();
    let running = bounded(
        "start",
        Duration::from_secs(10),
        images(broker.clone(), &pages, &renders).start(),
    )
    .await
    .expect("the image service starts on the cluster");
    // The app's broker knows `uploads` is a stream.
    let publisher = broker.publisher();
    for n in 0..20 {
        let page = Warmup {
            page: format!("/p{n:02}"),
        };
        let upload = Upload {
            image: format!("i{n:02}.png"),
        };
        publisher.message(&page).publish().await.unwrap();
        publisher.message(&upload).publish().await.unwrap();
    }
    // Delayed publishes go through each queue's delayed set, moved by a script that must find
    // the set in the queue's slot.
    publisher
        .message(&Upload {
            image: "late.png".into(),
        })
        .delay(Duration::from_millis(200))
        .publish()
        .await
        .unwrap();
    publisher
        .message(&Warmup {
            page: "/late".into(),
        })
        .delay(Duration::from_millis(200))
        .publish()
        .await
        .unwrap();
    wait_until(
        "every page warmed and thumbnail rendered",
        Duration::from_secs(15),
        || async { pages.get().len() == 21 && renders.get().len() == 21 },
    )
    .await;
    stop(running).await;
    let mut want: Vec<String> = (0..20).map(|n| format!("i{n:02}.png")).collect();
    want.push("late.png".into());
    want.sort();
    assert_eq!(renders.get(), want);
    assert!(pages.get().contains(&"/late".to_owned()));
    println!(
        "cluster: pages={} thumbnails={}",
        pages.get().len(),
        renders.get().len()
    );
}

async fn an_untagged_reliable_queue_is_refused_on_the_cluster_with_the_tag_to_use(env: &Env) {
    let app = RustStream::new(AppInfo::new("images", "0.1.0")).with_broker(
        env.broker_with(|b| b.prefix("x:")),
        |b| {
            b.include(
                subscriber(
                    RedisList::new("thumbnails").reliable(),
                    Seen::<ThumbnailJob>::default(),
                )
                .build(),
            );
        },
    );
    let err = bounded("start", Duration::from_secs(10), app.start())
        .await
        .expect_err("an untagged reliable queue must not start on a cluster");
    let config = harness::config_error(&err);
    assert_eq!(config.option, "key", "{err}");
    assert_eq!(config.subject.as_deref(), Some("thumbnails"), "{err}");
    assert!(config.fix.contains("{thumbnails}"), "the tag to use: {err}");
    assert!(
        config.problem.contains("x:thumbnails")
            && config.problem.contains("x:thumbnails.processing"),
        "{err}"
    );
    // The same queue runs on a standalone server, where slots do not matter.
    let Some(url) = redis_url() else { return };
    let app = RustStream::new(AppInfo::new("images", "0.1.0")).with_broker(
        RedisBroker::standalone(url).prefix(format!("{}:", unique("untagged"))),
        |b| {
            b.include(
                subscriber(
                    RedisList::new("thumbnails").reliable(),
                    Seen::<ThumbnailJob>::default(),
                )
                .build(),
            );
        },
    );
    let running = bounded("start", Duration::from_secs(10), app.start())
        .await
        .expect("an untagged queue is fine on one server");
    stop(running).await;
}

#[tokio::test]
async fn an_app_runs_on_the_primary_the_sentinels_name() {
    let Some((service, hosts)) = harness::sentinel_stand() else {
        return;
    };
    let prefix = format!("{}:", unique("sentinel"));
    let broker = || RedisBroker::sentinel(service.clone(), hosts.clone()).prefix(&prefix);
    let (pages, renders) = (Seen::default(), Seen::default());
    let running = bounded(
        "start",
        Duration::from_secs(10),
        images(broker(), &pages, &renders).start(),
    )
    .await
    .expect("the app starts through the sentinels");
    // A publisher of its own, as another service would have, feeding the reliable queue.
    let publisher = broker();
    publisher.connect().await.unwrap();
    for n in 0..10 {
        publisher
            .publisher()
            .message(&ThumbnailJob {
                image: format!("s{n}.png"),
            })
            .to("{thumbnails}")
            .publish()
            .await
            .unwrap();
    }
    wait_until("10 thumbnails", Duration::from_secs(10), || async {
        renders.get().len() == 10
    })
    .await;
    stop(running).await;
    println!("sentinel: thumbnails={}", renders.get().len());
}
