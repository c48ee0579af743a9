//! The guide's tests of the image service (`examples/images.rs`), with no server: `TestApp` runs
//! the example's own `app()` (its `redis://localhost:6379` never dialled) on the in-memory Redis
//! model, on a virtual clock, so a minute of `min_idle` passes in microseconds.
//!
//! The tests publish a warmup and an upload and check what the handlers received. One advances
//! the clock past `min_idle` and checks that a rendered job does not come back; its converse
//! checks that a job whose handler never finishes comes back once `min_idle` has passed, not
//! before. One proves that no socket is opened.

#[allow(dead_code)]
mod images {
    include!("../../examples/images.rs");

    mod tests {
        use std::future::Future;
        use std::net::TcpListener;
        use std::time::Duration;

        use fred::prelude::*;
        use ruststream::prelude::*;
        use ruststream::testing::TestApp;
        use ruststream::{Settlement, subscriber};

        use super::*;

        #[tokio::test(start_paused = true)]
        async fn a_warmup_is_handled_once() -> ruststream::Result<()> {
            let tb = TestApp::start(app()).await?;
            let warmup = Warmup {
                page: "/pricing".into(),
            };
            tb.broker::<RedisBroker>()
                .message(&warmup)
                .publish()
                .await?;
            tb.broker::<RedisBroker>()
                .subscriber("cache.warmups")
                .assert_called_once()
                .with(&warmup)
                .settled(HandlerOutcome::ack());
            tb.broker::<RedisBroker>()
                .subscriber("{thumbnails}")
                .assert_not_called();
            tb.shutdown().await
        }

        #[tokio::test(start_paused = true)]
        async fn an_upload_queues_a_job_that_is_rendered() -> ruststream::Result<()> {
            let tb = TestApp::start(app()).await?;
            let upload = Upload {
                image: "cat.png".into(),
            };
            let job = ThumbnailJob {
                image: "cat.png".into(),
            };
            tb.broker::<RedisBroker>()
                .message(&upload)
                .publish()
                .await?;
            let b = tb.broker::<RedisBroker>();
            b.subscriber("uploads")
                .assert_called_once()
                .with(&upload)
                .settled(HandlerOutcome::ack());
            b.published::<ThumbnailJob>("{thumbnails}")
                .assert_called_once()
                .with(&job);
            b.subscriber("{thumbnails}")
                .assert_called_once()
                .with(&job)
                .settled(HandlerOutcome::ack());
            // Acknowledged: out of the processing list and the recovery set.
            let redis = b.client().await?;
            let processing: i64 = redis
                .llen("{thumbnails}.processing")
                .await
                .map_err(broker)?;
            let claims: i64 = redis.zcard("{thumbnails}.claims").await.map_err(broker)?;
            assert_eq!((processing, claims), (0, 0));
            tb.shutdown().await
        }

        #[tokio::test(start_paused = true)]
        async fn a_rendered_job_does_not_come_back() -> ruststream::Result<()> {
            let tb = TestApp::start(app()).await?;
            let upload = Upload {
                image: "dog.png".into(),
            };
            tb.broker::<RedisBroker>()
                .message(&upload)
                .publish()
                .await?;
            tb.broker::<RedisBroker>()
                .subscriber("{thumbnails}")
                .assert_called_once();
            let before = tb.model().now_ms();
            tb.advance(MIN_IDLE * 2).await?;
            assert!(tb.model().now_ms() - before >= 120_000, "the clock moved");
            tb.broker::<RedisBroker>()
                .subscriber("{thumbnails}")
                .assert_called_once()
                .settled(HandlerOutcome::ack());
            tb.shutdown().await
        }

        /// Renders nothing the first time (it hangs, like a worker that died mid-render), and
        /// renders for real when the job comes back.
        struct HangsOnce;

        impl Handle<ThumbnailJob> for HangsOnce {
            fn handle(
                &self,
                _job: &ThumbnailJob,
                _outs: &(),
                ctx: &mut Context<'_>,
            ) -> impl Future<Output = Result<(), HandlerOutcome>> {
                let first = ctx.attempt() == 1;
                async move {
                    if first {
                        std::future::pending::<()>().await;
                    }
                    Ok(())
                }
            }
        }

        /// The example's `app()` with `render` replaced by [`HangsOnce`] on the same source; a
        /// handler still running at shutdown is abandoned at once, as a crash leaves it.
        fn hanging_app() -> RustStream {
            RustStream::new(AppInfo::new("images", "0.1.0"))
                .with_broker(RedisBroker::standalone("redis://localhost:6379"), |b| {
                    b.include(warm_cache);
                    b.include(
                        subscriber(
                            RedisList::new("{thumbnails}")
                                .reliable()
                                .min_idle(MIN_IDLE)
                                .recovery_zset("{thumbnails}.claims"),
                            HangsOnce,
                        )
                        .build(),
                    );
                    b.include(queue_thumbnail)
                        .out_reply(list::Publish::new().ttl(Duration::from_hours(24)));
                })
                .shutdown_timeout(Duration::from_millis(1))
        }

        #[tokio::test(start_paused = true)]
        async fn an_unfinished_job_comes_back_after_min_idle_and_not_before()
        -> ruststream::Result<()> {
            let mut tb = TestApp::start(hanging_app()).await?;
            let job = ThumbnailJob {
                image: "owl.png".into(),
            };
            tb.broker::<RedisBroker>()
                .message(&job)
                .to("{thumbnails}")
                .publish()
                .await?;
            let calls = tb.broker::<RedisBroker>().subscriber("{thumbnails}");
            calls.assert_called_once();
            assert!(
                calls.last().is_some_and(|c| c.settlement.is_none()),
                "still rendering"
            );
            // The worker dies mid-render (a live one would keep its claim alive): a new process
            // of the service starts on the same Redis.
            tb.restart(hanging_app()).await?;

            tb.advance(MIN_IDLE - Duration::from_secs(1)).await?;
            tb.broker::<RedisBroker>()
                .subscriber("{thumbnails}")
                .assert_called_once();

            tb.advance(Duration::from_secs(2)).await?;
            let calls = tb.broker::<RedisBroker>().subscriber("{thumbnails}");
            calls
                .assert_called(2)
                .with(&job)
                .settled(HandlerOutcome::ack())
                .settled(Settlement::Ack);
            assert_eq!(
                calls.last().map(|c| c.attempt),
                Some(2),
                "recovery counts an attempt"
            );

            // Recovered once: the hung claim left the recovery set when it was swept.
            tb.advance(MIN_IDLE * 3).await?;
            tb.broker::<RedisBroker>()
                .subscriber("{thumbnails}")
                .assert_called(2);
            tb.shutdown().await
        }

        /// The proof that nothing dials a server: the broker points at a port where a listener
        /// waits, the app runs, and the listener never sees a connection.
        #[tokio::test(start_paused = true)]
        async fn no_socket_is_opened() -> ruststream::Result<()> {
            let listener = TcpListener::bind("127.0.0.1:0").map_err(io)?;
            listener.set_nonblocking(true).map_err(io)?;
            let port = listener.local_addr().map_err(io)?.port();
            let app = RustStream::new(AppInfo::new("images", "0.1.0")).with_broker(
                RedisBroker::standalone(format!("redis://127.0.0.1:{port}")),
                |b| {
                    b.include(warm_cache);
                    b.include(render);
                    b.include(queue_thumbnail);
                },
            );
            let tb = TestApp::start(app).await?;
            let upload = Upload {
                image: "fox.png".into(),
            };
            tb.broker::<RedisBroker>()
                .message(&upload)
                .publish()
                .await?;
            tb.broker::<RedisBroker>()
                .subscriber("{thumbnails}")
                .assert_called_once();
            tb.advance(MIN_IDLE * 2).await?;
            tb.shutdown().await?;
            match listener.accept() {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
                Ok((_, from)) => {
                    panic!("the in-memory broker connected to the server (from {from})")
                }
                Err(e) => Err(io(e)),
            }
        }

        fn broker(e: fred::error::Error) -> ruststream::Error {
            ruststream::redis::error::core(e)
        }

        fn io(e: std::io::Error) -> ruststream::Error {
            ruststream::Error::broker_from(ruststream::ErrorKind::Connection, e.to_string(), e)
        }
    }
}
