//! Telling a subscription's [`Observer`](crate::observe::Observer), if it has one, of each
//! call and settlement.

use super::Subscription;
use crate::observe::Call;
use crate::{Broker, Delivery, HandlerOutcome, Settlement};

impl<B: Broker> Subscription<B> {
    /// Tells the observer, if any, that `d` is handed to the handler.
    pub(crate) fn observe_called<T>(&self, d: &Delivery<T>) {
        if let Some(o) = &self.observer {
            o.called(&self.call(d));
        }
    }

    /// Tells the observer, if any, how `d` was settled.
    pub(crate) fn observe_settled<T>(
        &self,
        d: &Delivery<T>,
        outcome: Option<HandlerOutcome>,
        settlement: &Settlement,
    ) {
        if let Some(o) = &self.observer {
            o.settled(&self.call(d), outcome, settlement);
        }
    }

    fn call<'a, T>(&'a self, d: &'a Delivery<T>) -> Call<'a> {
        Call {
            subscription: &self.name,
            info: &d.info,
            payload: &d.payload,
        }
    }
}
