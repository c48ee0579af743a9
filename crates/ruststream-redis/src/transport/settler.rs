//! [`Settle`], one transport's settling of one subscription, and [`RedisSettler`], the settler
//! the core sees whatever the transport. Sends no command itself.

use std::sync::Arc;

use futures::future::BoxFuture;
use ruststream_core::{Result, Settlement, Settler, StepsNote};

use super::token::Token;

/// One transport's settling of one subscription.
pub(crate) trait Settle: Send + Sync + 'static {
    /// Settles a batch in one round trip where the transport can.
    fn settle<'a>(&'a self, batch: &'a [(Token, Settlement)]) -> BoxFuture<'a, Result<()>>;
    /// Where the entries of abandoned settles stay (see [`Settler::unsettled`]).
    fn unsettled(&self) -> String;
}

/// Settles the entries of one subscription, whatever its transport.
#[derive(Clone)]
pub struct RedisSettler(Arc<dyn Settle>);

impl std::fmt::Debug for RedisSettler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettler").finish_non_exhaustive()
    }
}

impl RedisSettler {
    pub(crate) fn new(settle: impl Settle) -> Self {
        Self(Arc::new(settle))
    }
}

impl Settler for RedisSettler {
    type Token = Token;

    async fn settle(&self, batch: &[(Token, Settlement)]) -> Result<()> {
        self.0.settle(batch).await
    }

    fn steps_recorded(&self, token: &mut Token, note: StepsNote) {
        token.steps = Some(note.record);
        token.signal = note.signal;
        token.sleeping = note.sleeping;
    }

    fn unsettled(&self) -> String {
        self.0.unsettled()
    }
}
