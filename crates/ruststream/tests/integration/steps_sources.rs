//! A subscriber whose handler uses steps is refused at startup on a source that cannot
//! redeliver (a simple list, Pub/Sub), with a configuration error that names it and says what
//! to use instead. `#[subscriber]` sees the steps in the function's body; a hand-written
//! subscriber says so with `.uses_steps()`. A reliable list and a stream group start.

use crate::harness;

use harness::{Env, on};
use ruststream::prelude::*;
use ruststream::{ErrorKind, IntoSubscriber, subscriber};

use super::steps::Order;

on!([memory] steps_are_refused_at_startup_where_nothing_redelivers, steps_start_on_a_reliable_list_and_a_stream);

#[subscriber(RedisList::new("{refused}"))]
async fn import_on_a_simple_list(_: &Order, ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
    let from = ctx.resume_from::<u32>().await?.unwrap_or(0);
    ctx.checkpoint(&(from + 1)).await?;
    Ok(())
}

#[subscriber(RedisChannel::new("{refused}"))]
async fn charge_on_a_channel(_: &Order, ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
    ctx.step("charge", || async { Ok::<_, String>(1) }).await?;
    Ok(())
}

/// No step: `tokio::time::sleep` and `step_key` are not steps.
#[subscriber(RedisChannel::new("{refused}"))]
async fn nap_on_a_channel(_: &Order, ctx: &mut Context<'_>) -> HandlerOutcome {
    let _key = ctx.step_key("charge");
    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    HandlerOutcome::ack()
}

#[subscriber(RedisList::new("{started}").reliable())]
async fn import_on_a_reliable_list(_: &Order, ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
    ctx.checkpoint(&1_u32).await?;
    Ok(())
}

#[subscriber(RedisStream::new("{started}").group("g"))]
async fn import_on_a_stream(_: &Order, ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
    ctx.checkpoint(&1_u32).await?;
    Ok(())
}

/// A hand-written handler that takes a step.
#[derive(Clone)]
struct Charge;

impl Handle<Order> for Charge {
    async fn handle(&self, _: &Order, _: &(), ctx: &mut Context<'_>) -> Result<(), HandlerOutcome> {
        ctx.step("charge", || async { Ok::<_, String>(1) }).await?;
        Ok(())
    }
}

/// The error the app of `mounted` alone is refused with at startup, checked to be a
/// configuration error that names `key` and the way out.
async fn refused(
    env: &Env,
    mounted: impl IntoSubscriber<Broker = RedisBroker> + 'static,
    key: &str,
) {
    let app = env.app(move |b| {
        b.include(mounted);
    });
    let e = match env.try_start(app).await {
        Ok(_) => panic!("the app started; steps on `{key}` should be refused"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), ErrorKind::Configuration, "{e}");
    let config = e.config_error().expect("a configuration error");
    assert_eq!(config.option, "steps", "{e}");
    assert_eq!(config.subject.as_deref(), Some(key), "{e}");
    assert!(config.problem.contains("cannot redeliver"), "{e}");
    for said in [".reliable()", "stream group"] {
        assert!(config.fix.contains(said), "says {said:?}: {e}");
    }
}

async fn steps_are_refused_at_startup_where_nothing_redelivers(env: &Env) {
    refused(env, import_on_a_simple_list, "{refused}").await;
    refused(env, charge_on_a_channel, "{refused}").await;
    refused(
        env,
        subscriber(RedisList::new("{refused}"), Charge)
            .uses_steps()
            .build(),
        "{refused}",
    )
    .await;
    refused(
        env,
        subscriber(RedisChannel::new("{refused}"), Charge)
            .uses_steps()
            .build(),
        "{refused}",
    )
    .await;
    // Without the mark, the hand-written subscriber starts: its first step fails at run time.
    let running = env
        .start_with(|b| {
            b.include(subscriber(RedisList::new("{refused}"), Charge).build());
            b.include(nap_on_a_channel);
        })
        .await;
    env.stop(running).await;
}

async fn steps_start_on_a_reliable_list_and_a_stream(env: &Env) {
    let running = env
        .start_with(|b| {
            b.include(import_on_a_reliable_list);
            b.include(import_on_a_stream);
            b.include(
                subscriber(RedisList::new("{started}.hand").reliable(), Charge)
                    .uses_steps()
                    .build(),
            );
        })
        .await;
    env.stop(running).await;
}
