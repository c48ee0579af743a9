//! A payments service on delayed queues. A payment's state is checked three hours after it is
//! created. A notification that could not be sent is sent again 45 minutes later. Failed checks
//! come back at growing intervals. A payment that never settles stops after a bounded number of
//! checks, in the dead-letter list with its reason.
//!
//! `cargo run -p redstream --example payments` runs it on `REDIS_URL`.
//! `crates/ruststream/tests/integration/payments.rs` runs its hours on TestApp's virtual clock,
//! and a short version on Redis.
//!
//! The payment provider and the notifier are stand-ins: a payment whose id starts with `slow`
//! is pending for its first two checks, one starting with `never` never settles, and a user
//! named `offline` cannot be reached on the first try.

use std::process::ExitCode;
use std::time::Duration;

use ruststream::prelude::*;

/// Where new payments are announced.
pub const CREATED: &str = "{payments}.created";
/// Where payment checks wait for their time, then run.
pub const CHECKS: &str = "{payments}.checks";
/// Where notifications to users go.
pub const NOTIFICATIONS: &str = "{notifications}";

/// How long the service waits at each step.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// After a payment is created, when its state is checked.
    pub check_after: Duration,
    /// After a failed check, the first retry (then twice as long each time).
    pub recheck_after: Duration,
    /// Checks of one payment before it goes to the dead-letter list.
    pub max_checks: u32,
    /// After a notification could not be sent, when it is sent again.
    pub resend_after: Duration,
}

impl Timing {
    /// The production timing: three hours, then 10 minutes doubling, 5 checks, 45 minutes.
    pub const PRODUCTION: Self = Self {
        check_after: Duration::from_secs(3 * 3600),
        recheck_after: Duration::from_secs(600),
        max_checks: 5,
        resend_after: Duration::from_secs(45 * 60),
    };
}

/// A payment was created.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct PaymentCreated {
    /// The payment id.
    pub id: String,
    /// Who pays.
    pub user: String,
}

outgoing!(PaymentCreated);

/// Check the state of a payment.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct CheckPayment {
    /// The payment id.
    pub id: String,
    /// Who to notify.
    pub user: String,
}

outgoing!(CheckPayment);

/// Tell a user something.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct Notification {
    /// Who.
    pub user: String,
    /// What.
    pub text: String,
}

outgoing!(Notification);

/// Schedules the check of a new payment, once per payment id (a redelivered announcement does
/// not schedule a second check: the publish carries an id, and the first schedule is kept).
pub struct ScheduleCheck(pub Timing);

impl Handle<PaymentCreated> for ScheduleCheck {
    async fn handle(
        &self,
        payment: &PaymentCreated,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        let check = CheckPayment {
            id: payment.id.clone(),
            user: payment.user.clone(),
        };
        let scheduled = ctx
            .publisher()
            .message(&check)
            .to(CHECKS)
            .delay(self.0.check_after)
            .id(format!("check-{}", payment.id))
            .header("payment", payment.id.as_str())
            .publish()
            .await;
        match scheduled {
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, payment = %payment.id, "check not scheduled; retrying");
                Err(HandlerOutcome::retry())
            }
        }
    }
}

/// Asks the provider for the payment's state: settled payments are notified, pending ones are
/// checked again later (the subscription's backoff), up to `max_checks`.
pub struct Check;

impl Handle<CheckPayment, Notification> for Check {
    async fn handle(
        &self,
        check: &CheckPayment,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> Result<Notification, HandlerOutcome> {
        let pending =
            check.id.starts_with("never") || (check.id.starts_with("slow") && ctx.attempt() <= 2);
        if pending {
            tracing::info!(payment = %check.id, attempt = ctx.attempt(), "payment pending");
            return Err(HandlerOutcome::retry());
        }
        Ok(Notification {
            user: check.user.clone(),
            text: format!("payment {} is settled", check.id),
        })
    }
}

/// Sends notifications; an unreachable user is tried again after `resend_after`.
pub struct Notify(pub Timing);

impl Handle<Notification> for Notify {
    async fn handle(
        &self,
        n: &Notification,
        _outs: &(),
        ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        if n.user == "offline" && ctx.attempt() == 1 {
            return Err(HandlerOutcome::retry_after(self.0.resend_after));
        }
        tracing::info!(user = %n.user, text = %n.text, "notified");
        Ok(())
    }
}

/// The service with the given timing, on `broker`.
pub fn service(broker: RedisBroker, timing: Timing) -> RustStream {
    RustStream::new(AppInfo::new("payments", "0.1.0")).with_broker(broker, |b| {
        b.include(subscriber(RedisList::new(CREATED).reliable(), ScheduleCheck(timing)).build());
        b.include(
            subscriber(
                RedisList::new(CHECKS)
                    .reliable()
                    .retry(Backoff::exponential(timing.recheck_after).jitter(0.0))
                    .max_attempts(timing.max_checks),
                Check,
            )
            .reply()
            .to(NOTIFICATIONS)
            .build(),
        );
        b.include(subscriber(RedisList::new(NOTIFICATIONS).reliable(), Notify(timing)).build());
    })
}

/// The service as it runs in production.
pub fn app() -> impl App {
    service(RedisBroker::from_env(), Timing::PRODUCTION)
}

#[allow(dead_code)]
fn main() -> ExitCode {
    run_main(app)
}
