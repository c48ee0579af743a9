//! Durable steps across a crash: a worker process SIGKILLed after its charge step's record was
//! written, its handler stuck in the next step. Another worker recovers the message after
//! `min_idle` and replays the charge from its record: the external charge counter stays at 1.

use crate::harness;

use std::time::Duration;

use fred::prelude::*;
use harness::process::{WorkerProcess, serve_until_sigterm, test_name, worker_runtime};
use harness::{Env, WAIT, on, wait_until};
use ruststream::prelude::*;
use ruststream::subscriber;

on!([standalone] multi_thread: a_worker_killed_after_the_charge_does_not_charge_again);

const QUEUE: &str = "{pcharge}";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Order {
    n: u32,
}

outgoing!(Order);

/// Charges (`HINCRBY <prefix>charges <step key> 1`: the external effect), then ships
/// (`HINCRBY .. shipped 1`); with `hang`, shipping never returns.
struct Checkout {
    client: Client,
    charges: String,
    hang: bool,
}

impl Handle<Order> for Checkout {
    async fn handle(&self, _: &Order, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        let key = ctx.step_key("charge");
        ctx.step("charge", || async {
            self.client
                .hincrby::<i64, _, _>(&self.charges, key.as_str(), 1)
                .await
                .map_err(|e| e.to_string())
        })
        .await?;
        ctx.step("ship", || async {
            if self.hang {
                std::future::pending::<()>().await;
            }
            self.client
                .hincrby::<i64, _, _>(&self.charges, "shipped", 1)
                .await
                .map_err(|e| e.to_string())
        })
        .await?;
        Ok(())
    }
}

fn list() -> RedisList {
    RedisList::new(QUEUE)
        .reliable()
        .min_idle(Duration::from_millis(500))
}

/// The worker: a checkout whose shipping hangs, on `RUSTSTREAM_STEP_WORKER` with the prefix
/// `RUSTSTREAM_STEP_PREFIX`. Stops on SIGTERM (the test kills it).
#[test]
#[ignore = "the worker process of the steps test, which runs it; does nothing on its own"]
fn step_worker_process() {
    let Ok(url) = std::env::var("RUSTSTREAM_STEP_WORKER") else {
        return;
    };
    let prefix = std::env::var("RUSTSTREAM_STEP_PREFIX").unwrap_or_default();
    worker_runtime().block_on(async move {
        let client = Builder::from_config(Config::from_url(&url).unwrap())
            .build()
            .unwrap();
        client.init().await.unwrap();
        let handler = Checkout {
            client,
            charges: format!("{prefix}charges"),
            hang: true,
        };
        serve_until_sigterm(
            RustStream::new(AppInfo::new("step-worker", "0")).with_broker(
                RedisBroker::standalone(url).prefix(&prefix),
                |b| {
                    b.include(subscriber(list(), handler).build());
                },
            ),
        )
        .await;
    });
}

async fn a_worker_killed_after_the_charge_does_not_charge_again(env: &Env) {
    let url = env.url().expect("standalone").to_owned();
    let log = std::env::temp_dir().join(format!(
        "{}steps-worker.log",
        env.prefix.trim_end_matches(':')
    ));
    let mut worker = WorkerProcess::spawn(
        &test_name(module_path!(), "step_worker_process"),
        &[
            ("RUSTSTREAM_STEP_WORKER", url),
            ("RUSTSTREAM_STEP_PREFIX", env.prefix.clone()),
        ],
        Some(log.clone()),
    );
    worker.ready(WAIT).await;
    env.broker()
        .publisher()
        .message(&Order { n: 1 })
        .to(QUEUE)
        .id("order-1")
        .publish()
        .await
        .expect("publish");
    let record = format!("{QUEUE}.steps:order-1");
    // The record holds the step's result and its timing (`t:charge`).
    wait_until("charged and recorded", WAIT, async || {
        env.hlen("charges").await == 1 && env.hlen(&record).await == 2
    })
    .await;
    worker.kill();
    assert_eq!(
        env.llen(&format!("{QUEUE}.processing")).await,
        1,
        "left claimed"
    );
    let handler = Checkout {
        client: env.client.clone(),
        charges: env.key("charges"),
        hang: false,
    };
    let running = env
        .start_with(move |b| {
            b.include(subscriber(list(), handler).build());
        })
        .await;
    wait_until("recovered and shipped", WAIT, async || {
        env.hlen("charges").await == 2 && env.llen(&format!("{QUEUE}.processing")).await == 0
    })
    .await;
    env.stop(running).await;
    let charged: Option<i64> = env
        .client
        .hget(env.key("charges"), "order-1:charge")
        .await
        .expect("HGET");
    assert_eq!(charged, Some(1), "charged once, across the crash");
    assert!(!env.exists(&record).await, "the ack removed the record");
    let _ = std::fs::remove_file(log);
}
