//! Procedural macros of RustStream, re-exported by the `ruststream` crate: use them from there.
//!
//! Each entry point parses and expands; the behaviour lives in the runtime crates, so what a macro
//! generates is what a user could write by hand (`Handle` impls, `subscriber(..).build()`,
//! `MessageType` impls, `run_main`). Errors are `syn::Error`s turned into `compile_error!`s that say
//! how to fix the code.

// The library's API: every item reachable from outside is `pub`, every other one `pub(crate)`;
// every public type can be printed.
#![warn(unreachable_pub, missing_debug_implementations)]

use proc_macro::TokenStream;

mod app;
mod outgoing;
mod periodic;
mod subscriber;

/// Turns an `async fn` into a subscriber that `b.include(..)` mounts.
///
/// ```
/// use ruststream::prelude::*;
/// # #[derive(Deserialize, Serialize, Outgoing)]
/// # struct Warmup { page: String }
/// # #[derive(Deserialize, Serialize, Outgoing)]
/// # struct Upload { image: String }
/// # #[derive(Deserialize, Serialize, Outgoing)]
/// # struct ThumbnailJob { image: String }
///
/// #[subscriber(RedisList::new("cache.warmups"))]
/// async fn warm_cache(warmup: &Warmup) -> HandlerOutcome {
///     if warmup.page.is_empty() {
///         return HandlerOutcome::drop();
///     }
///     HandlerOutcome::ack()
/// }
///
/// #[subscriber(RedisStream::new("uploads").group("thumbnailer"), reply("{thumbnails}"))]
/// async fn queue_thumbnail(upload: &Upload, ctx: &mut Context<'_>) -> ThumbnailJob {
///     let _first_try = ctx.attempt() == 1;
///     ThumbnailJob { image: upload.image.clone() }
/// }
///
/// let app = RustStream::new(AppInfo::new("images", "0.1.0"))
///     .with_broker(RedisBroker::from_env(), |b| {
///         b.include(warm_cache);
///         b.include(queue_thumbnail);
///     });
/// # drop(app);
/// ```
///
/// - The source is written `Type::ctor(..)` followed by builder methods; `Type` names the broker.
/// - Options after the source: `reply` (publish the return value to its type's outgoing name) or
///   `reply("key")` (publish it to `key`).
/// - `timeout = d` (a `std::time::Duration` expression, e.g. `timeout = Duration::from_secs(30)`)
///   bounds each call: it is the source's `.timeout(d)`, so past it the call is stopped and the
///   message retried (dead-lettered `timeout` once its attempts are spent).
/// - The function takes the message as `&T` and optionally `ctx: &mut Context<'_>`, and returns
///   `HandlerOutcome`, `()`, `Result<(), E>`, `Result<HandlerOutcome, E>`, or with `reply` the
///   reply type or `Result<Reply, E>`.
/// - A body that calls `step`, `sleep`, `sleep_until`, `wait_for`, `checkpoint` or `resume_from`
///   on its context uses durable steps: the subscriber is built with `.uses_steps()`, and the app
///   refuses to start on a source that cannot redeliver. Steps in a helper function are not seen.
///
/// It expands to a unit struct named like the function, implementing `Handle` (the body becomes an
/// associated `async fn` of the same name) and `IntoSubscriber` through
/// `subscriber(source, handler).build()`, exactly as a hand-written subscriber.
#[proc_macro_attribute]
pub fn subscriber(attr: TokenStream, item: TokenStream) -> TokenStream {
    subscriber::expand(attr.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Turns a `fn` (or `async fn`) without arguments into a periodic job that `b.periodic(..)`
/// mounts: on every tick of the cron schedule, what it returns is published once, however many
/// instances run (see `ruststream::periodic`).
///
/// ```
/// use ruststream::prelude::*;
/// # #[derive(Deserialize, Serialize, Outgoing)]
/// # struct Report { kind: String }
///
/// /// Every five minutes, Paris time; ticks missed while no instance ran are skipped.
/// #[periodic("0 */5 * * * *", tz = "Europe/Paris", to = "reports")]
/// fn report() -> Report {
///     Report { kind: "usage".into() }
/// }
///
/// /// At 02:00 UTC; after a night with no instance up, the missed tick runs once at start.
/// #[periodic("0 0 2 * * *", tz = "UTC", to = "reports", name = "nightly", catch_up = "run-once")]
/// async fn nightly() -> Report {
///     Report { kind: "nightly".into() }
/// }
///
/// let app = RustStream::new(AppInfo::new("reports", "0.1.0"))
///     .with_broker(RedisBroker::from_env(), |b| {
///         b.periodic(report).periodic(nightly);
///     });
/// # drop(app);
/// ```
///
/// - The first argument is the cron expression with seconds (`sec min hour day-of-month month
///   day-of-week [year]`); `tz` is the IANA time zone, required. Both are checked at compile
///   time.
/// - `to` is the destination (default: the message type's outgoing name), `name` the job's name
///   (default: the function's; it keys every tick's message id, so keep it stable), `catch_up`
///   `"skip"` (default) or `"run-once"`.
///
/// It expands to a unit struct named like the function, implementing `IntoPeriodic` through
/// `Periodic::new(..)`, exactly as a hand-written job.
#[proc_macro_attribute]
pub fn periodic(attr: TokenStream, item: TokenStream) -> TokenStream {
    periodic::expand(attr.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Implements `MessageType` for a serde type: JSON on the wire, its default destination, and its JSON
/// schema (the type needs no `JsonSchema` derive).
///
/// ```
/// use ruststream::prelude::*;
///
/// #[derive(Deserialize, Serialize, Outgoing)]
/// #[outgoing(name = "orders.{tenant}")] // braces read the `tenant` field
/// struct Order {
///     tenant: String,
/// }
///
/// let order = Order { tenant: "acme".into() };
/// assert_eq!(order.destination().unwrap().as_deref(), Some("orders.acme"));
/// assert_eq!(order.encode().unwrap(), r#"{"tenant":"acme"}"#);
/// assert_eq!(<Order as ruststream::MessageType>::schema().get("title").unwrap(), "Order");
/// ```
///
/// The schema comes from a hidden copy of the type with the same fields and the same `#[serde]`
/// (and `#[schemars]`) attributes that derives `JsonSchema`. Field types must implement
/// `JsonSchema`. Generic types are not supported: use `outgoing!` on a concrete type instead.
#[proc_macro_derive(Outgoing, attributes(outgoing, schemars))]
pub fn derive_outgoing(item: TokenStream) -> TokenStream {
    outgoing::expand(item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Marks the function that builds the application and generates `main` from it.
///
/// ```no_run
/// use ruststream::prelude::*;
///
/// #[ruststream::app]
/// fn app() -> impl App {
///     RustStream::new(AppInfo::new("images", "0.1.0"))
///         .with_broker(RedisBroker::from_env(), |_b| { /* b.include(..) */ })
/// }
/// ```
///
/// The function stays as written; `fn main() -> ExitCode { ruststream::run_main(app) }` is added.
#[proc_macro_attribute]
pub fn app(attr: TokenStream, item: TokenStream) -> TokenStream {
    app::expand(attr.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
