//! The operator's subcommands of [`run_main`](crate::run_main): `inspect`, `dead`, `delayed`,
//! `pause`, `resume`, `cancel` and `job`, on the app's own subscriptions, and `periodic`, the periodic jobs
//! registered under the app's brokers' prefixes (see `ruststream_redis::operate`).
//!
//! Exit codes: 0 done; 1 Redis or the app failed; 2 a usage error (an unknown subscription, a
//! purge without `--yes` when nobody can confirm); 3 nothing matched (`--id` names no entry).
//!
//! `commands.rs` holds the commands as parsed, `print.rs` how results are printed, `flow.rs`
//! what `flow show` prints, `job.rs` what `job show` and `job list` do, `rates.rs` the rates `inspect --metrics-url` reads.

mod commands;
pub(crate) mod flow;
mod job;
pub(crate) mod print;
#[cfg(feature = "prometheus")]
pub mod rates;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use ruststream_redis::operate::Operator;
use ruststream_redis::{RedisBroker, RedisSource};

#[cfg(not(feature = "prometheus"))]
use std::collections::HashMap;

pub(crate) use self::commands::{ChangeArgs, Dead, Delayed, Flow, JobCommand, Operate};
use self::print::{Row, inspect_text, ms_text, periodic_text, pretty, print_out};
use crate::{Error, Result, RustStream};

/// One subscription's message rates over a short window (`inspect --metrics-url`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Rates {
    /// Messages acknowledged per second.
    pub handled_per_s: f64,
    /// Messages retried, dropped, dead-lettered or ignored per second.
    pub failed_per_s: f64,
}

/// Exit code: nothing matched.
const NOTHING_MATCHED: u8 = 3;
/// Exit code: a usage error.
const USAGE: u8 = 2;

/// The operators of every Redis broker of `app`, each with its subscriptions.
pub fn operators(app: &RustStream) -> Vec<Operator> {
    app.broker_sources()
        .filter_map(|(broker, sources)| {
            let broker = broker.downcast_ref::<RedisBroker>()?;
            let sources: Vec<RedisSource> = sources
                .into_iter()
                .filter_map(|s| s.downcast_ref::<RedisSource>().cloned())
                .collect();
            Some(broker.operator(&sources))
        })
        .collect()
}

/// The operator's commands alone, for [`run_args`].
#[derive(Debug, clap::Parser)]
#[command(name = "operate")]
struct OperateCli {
    #[command(subcommand)]
    command: Operate,
}

/// Runs one operator command given as words (`["dead", "list", "jobs", "--json"]`) on `app`'s
/// subscriptions, as `run_main` does for `app dead list jobs --json`: for a CLI of your own, or
/// a test. Prints what the command prints; returns its exit code (see the [module docs](self)).
pub async fn run_args<I, T>(app: RustStream, args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let words = std::iter::once(std::ffi::OsString::from("operate"))
        .chain(args.into_iter().map(Into::into));
    let cli = match <OperateCli as clap::Parser>::try_parse_from(words) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(USAGE);
        }
    };
    match run(app, cli.command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs an operator command on `app`'s subscriptions.
pub(crate) async fn run(app: RustStream, command: Operate) -> Result<ExitCode> {
    let ops = operators(&app);
    if let Operate::Periodic { json } = command {
        return periodic(&ops, json).await;
    }
    if let Operate::Job(command) = command {
        return job::run(&ops, command).await;
    }
    let name = subscription_of(&command).map(str::to_owned);
    let targets: Vec<&Operator> = match &name {
        None => ops.iter().collect(),
        Some(n) => match ops
            .iter()
            .find(|o| o.find(n).is_some() || !o.partitions_of(n).is_empty())
        {
            Some(o) => vec![o],
            None => {
                let known: Vec<&str> = ops
                    .iter()
                    .flat_map(|o| o.subscriptions().iter().map(|s| s.name.as_str()))
                    .collect();
                eprintln!(
                    "error: no subscription named `{n}`; this app has: {}",
                    known.join(", ")
                );
                return Ok(ExitCode::from(USAGE));
            }
        },
    };
    for o in &targets {
        o.connect().await?;
    }
    match command {
        Operate::Inspect {
            json,
            #[cfg(feature = "prometheus")]
            metrics_url,
            ..
        } => {
            let mut all = Vec::new();
            for o in targets {
                all.extend(o.inspect(name.as_deref()).await?);
            }
            #[cfg(feature = "prometheus")]
            let rates = match metrics_url {
                Some(url) => Some(rates::sample(&url).await?),
                None => None,
            };
            #[cfg(not(feature = "prometheus"))]
            let rates: Option<HashMap<String, Rates>> = None;
            let rows: Vec<Row<'_>> = all
                .iter()
                .map(|i| Row {
                    inspection: i,
                    rates: rates
                        .as_ref()
                        .map(|r| r.get(&i.keys.name).copied().unwrap_or_default()),
                })
                .collect();
            print_out(json, &rows, || inspect_text(&rows))?;
            Ok(ExitCode::SUCCESS)
        }
        Operate::Pause {
            subscription,
            group: Some(group),
            ..
        } => {
            targets[0].pause_group(&subscription, &group).await?;
            println!(
                "paused group `{group}` of `{subscription}`: its workers pass it over until `resume {subscription} --group {group}`"
            );
            Ok(ExitCode::SUCCESS)
        }
        Operate::Resume {
            subscription,
            group: Some(group),
        } => {
            targets[0].resume_group(&subscription, &group).await?;
            println!("resumed group `{group}` of `{subscription}`");
            Ok(ExitCode::SUCCESS)
        }
        Operate::Pause {
            subscription, note, ..
        } => {
            targets[0].pause(&subscription, &note).await?;
            println!(
                "paused `{subscription}`: its workers claim nothing until `resume {subscription}`"
            );
            Ok(ExitCode::SUCCESS)
        }
        Operate::Resume { subscription, .. } => {
            targets[0].resume(&subscription).await?;
            println!("resumed `{subscription}`");
            Ok(ExitCode::SUCCESS)
        }
        Operate::Cancel { subscription, id } => {
            let outcome = targets[0].cancel_message(&subscription, &id).await?;
            println!("cancel `{id}` of `{subscription}`: {outcome}");
            Ok(match outcome {
                ruststream_core::CancelOutcome::NotFound => ExitCode::from(NOTHING_MATCHED),
                _ => ExitCode::SUCCESS,
            })
        }
        Operate::Flow(Flow::Show {
            id,
            subscription,
            json,
        }) => {
            let found = match &subscription {
                Some(sub) => targets[0]
                    .flow(sub, &id)
                    .await?
                    .map(|state| (sub.clone(), state)),
                None => {
                    let mut found = None;
                    for o in &targets {
                        found = o.find_flow(&id).await?;
                        if found.is_some() {
                            break;
                        }
                    }
                    found
                }
            };
            match found {
                Some((queue, state)) => {
                    print_out(json, &flow::FlowView::of(&state, &queue), || {
                        flow::flow_text(&state, &queue)
                    })?;
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    let on = subscription.map_or_else(
                        || "on any list or stream of this app".to_owned(),
                        |s| format!("on `{s}`"),
                    );
                    eprintln!("no flow `{id}` {on} (never published, or expired)");
                    Ok(ExitCode::from(NOTHING_MATCHED))
                }
            }
        }
        Operate::Dead(d) => dead(targets[0], d).await,
        Operate::Delayed(d) => delayed(targets[0], d).await,
        Operate::Periodic { json } => periodic(&ops, json).await,
        Operate::Job(command) => job::run(&ops, command).await,
    }
}

/// `periodic`: the jobs of every broker's key space.
async fn periodic(ops: &[Operator], json: bool) -> Result<ExitCode> {
    let mut jobs = Vec::new();
    for o in ops {
        o.connect().await?;
        jobs.extend(o.periodic().await?);
    }
    print_out(json, &jobs, || periodic_text(&jobs))?;
    Ok(ExitCode::SUCCESS)
}

/// The subscription a command names; `None` for those that look in every app's queues.
fn subscription_of(command: &Operate) -> Option<&str> {
    match command {
        Operate::Inspect { subscription, .. } | Operate::Flow(Flow::Show { subscription, .. }) => {
            subscription.as_deref()
        }
        Operate::Pause { subscription, .. }
        | Operate::Resume { subscription, .. }
        | Operate::Cancel { subscription, .. } => Some(subscription),
        Operate::Periodic { .. } | Operate::Job(_) => None,
        Operate::Dead(Dead::List(a)) | Operate::Delayed(Delayed::List(a)) => Some(&a.subscription),
        Operate::Dead(Dead::Show(a)) => Some(&a.subscription),
        Operate::Dead(Dead::Requeue(a) | Dead::Purge(a))
        | Operate::Delayed(Delayed::Promote(a) | Delayed::Cancel(a)) => Some(&a.subscription),
    }
}

async fn dead(o: &Operator, command: Dead) -> Result<ExitCode> {
    match command {
        Dead::List(a) => {
            let letters = o.dead_letters(&a.subscription, a.limit).await?;
            print_out(a.json, &letters, || {
                letters
                    .iter()
                    .map(|d| {
                        format!(
                            "{}  attempt {}  reason {}  {}\n",
                            d.id,
                            d.attempt,
                            d.reason.as_deref().unwrap_or("-"),
                            d.payload
                        )
                    })
                    .collect()
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Dead::Show(a) => match o.dead_letter(&a.subscription, &a.id).await? {
            Some(d) => {
                print_out(a.json, &d, || pretty(&d))?;
                Ok(ExitCode::SUCCESS)
            }
            None => not_found(&a.subscription, &a.id, "dead letter"),
        },
        Dead::Requeue(a) => {
            let n = o.requeue(&a.subscription, &a.select()).await?;
            changed(&a, n, "requeued", "dead letters")
        }
        Dead::Purge(a) => {
            if !confirm(&a, "delete dead letters of")? {
                return Ok(ExitCode::from(USAGE));
            }
            let n = o.purge(&a.subscription, &a.select()).await?;
            changed(&a, n, "purged", "dead letters")
        }
    }
}

async fn delayed(o: &Operator, command: Delayed) -> Result<ExitCode> {
    match command {
        Delayed::List(a) => {
            let entries = o.delayed(&a.subscription, a.limit).await?;
            print_out(a.json, &entries, || {
                entries
                    .iter()
                    .map(|e| {
                        format!(
                            "{}  due in {}  attempt {}  {}\n",
                            e.id,
                            ms_text(e.due_in_ms),
                            e.attempt,
                            e.payload
                        )
                    })
                    .collect()
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Delayed::Promote(a) => {
            let n = o.promote(&a.subscription, &a.select()).await?;
            changed(&a, n, "promoted", "delayed entries")
        }
        Delayed::Cancel(a) => {
            if !confirm(&a, "cancel delayed entries of")? {
                return Ok(ExitCode::from(USAGE));
            }
            let n = o.cancel(&a.subscription, &a.select()).await?;
            changed(&a, n, "cancelled", "delayed entries")
        }
    }
}

/// Prints what a change did; exit code 3 when `--id` matched nothing.
fn changed(a: &ChangeArgs, n: usize, done: &str, what: &str) -> Result<ExitCode> {
    if a.json {
        println!("{}", serde_json::json!({ done: n }));
    } else {
        println!("{done} {n} {what} of `{}`", a.subscription);
    }
    if n == 0 && a.id.is_some() {
        return Ok(ExitCode::from(NOTHING_MATCHED));
    }
    Ok(ExitCode::SUCCESS)
}

fn not_found(subscription: &str, id: &str, what: &str) -> Result<ExitCode> {
    eprintln!("no {what} `{id}` in `{subscription}`");
    Ok(ExitCode::from(NOTHING_MATCHED))
}

/// Asks on the terminal unless `--yes`; refuses when nobody can answer.
fn confirm(a: &ChangeArgs, action: &str) -> Result<bool> {
    if a.yes {
        return Ok(true);
    }
    let which =
        a.id.as_ref()
            .map_or_else(|| "all".to_owned(), |id| format!("`{id}`"));
    if !std::io::stdin().is_terminal() {
        eprintln!(
            "error: about to {action} `{}` ({which}); add --yes to confirm without a terminal",
            a.subscription
        );
        return Ok(false);
    }
    eprint!("{action} `{}` ({which})? type yes: ", a.subscription);
    std::io::stderr().flush().map_err(io)?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).map_err(io)?;
    if line.trim() == "yes" {
        Ok(true)
    } else {
        eprintln!("not confirmed: nothing changed");
        Ok(false)
    }
}

fn io(e: std::io::Error) -> Error {
    Error::broker_from(
        crate::ErrorKind::Other,
        format!("cannot talk to the terminal: {e}"),
        e,
    )
}
