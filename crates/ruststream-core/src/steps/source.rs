//! The start's check that a subscriber whose handler uses steps reads a source that redelivers
//! ([`check_source`]). A step the check cannot see (a handler not marked as using steps) fails
//! at run time instead, with `StepError::Record`.

use crate::{ConfigError, Result, Retries};

/// Refuses, as a configuration error, steps on the source `key` whose retries are `retries`:
/// only a source that redelivers replays a step record.
pub(crate) fn check_source(key: &str, retries: Retries) -> Result<()> {
    let why = match retries {
        Retries::Redeliver => return Ok(()),
        Retries::Ignored => "it pops each message before its handler runs",
        Retries::DeadLetter(_) => "it delivers each message once and keeps nothing",
    };
    Err(ConfigError::new(
        "steps",
        format!(
            "the handler uses durable steps (ctx.step, sleep, wait_for, checkpoint or resume_from), but its source cannot redeliver: {why}, so a step record would never be replayed"
        ),
        "read it as a reliable list (`.reliable()`) or a stream group (`RedisStream::new(..).group(..)`)",
    )
    .on(key)
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn only_a_source_that_redelivers_takes_steps() {
        assert!(check_source("jobs", Retries::Redeliver).is_ok());
        for retries in [Retries::Ignored, Retries::DeadLetter("no-redelivery")] {
            let e = check_source("jobs", retries).expect_err("refused");
            assert_eq!(e.kind(), ErrorKind::Configuration);
            let config = e.config_error().expect("a configuration error");
            assert_eq!(config.option, "steps");
            assert_eq!(config.subject.as_deref(), Some("jobs"));
            assert!(config.fix.contains(".reliable()"), "{e}");
        }
    }
}
