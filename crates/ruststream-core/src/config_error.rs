//! [`ConfigError`]: a configuration that cannot run, said as which option, on what, what is
//! wrong and what to do, so that code matches on the option and a person reads the fix.

use std::borrow::Cow;
use std::fmt;

/// A configuration that cannot run: which option, on what, what is wrong and what to do.
///
/// Carried by [`Error::Config`](crate::Error::Config); match on [`option`](Self::option) and
/// [`subject`](Self::subject), not on the text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    /// The option as the user writes it: `max_attempts`, `redis url`, `#[subscriber(steps)]`.
    pub option: Cow<'static, str>,
    /// The subscription, publisher, job or key the option belongs to, when there is one.
    pub subject: Option<String>,
    /// What is wrong.
    pub problem: Cow<'static, str>,
    /// What to do.
    pub fix: Cow<'static, str>,
}

impl ConfigError {
    /// The option `option` is wrong in the way `problem` says; `fix` says what to do.
    pub fn new(
        option: impl Into<Cow<'static, str>>,
        problem: impl Into<Cow<'static, str>>,
        fix: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self {
            option: option.into(),
            subject: None,
            problem: problem.into(),
            fix: fix.into(),
        }
    }

    /// The same error, on `subject` (the subscription, publisher, job or key).
    #[must_use]
    pub fn on(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }
}

/// "`max_attempts` of `orders`: must be at least 1; set it to 1 or more".
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`", self.option)?;
        if let Some(subject) = &self.subject {
            write!(f, " of `{subject}`")?;
        }
        write!(f, ": {}; {}", self.problem, self.fix)
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for crate::Error {
    fn from(e: ConfigError) -> Self {
        Self::Config(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Error, ErrorKind};

    #[test]
    fn it_says_the_option_its_subject_the_problem_and_the_fix() {
        let e = ConfigError::new("max_attempts", "must be at least 1", "set it to 1 or more");
        assert_eq!(
            e.to_string(),
            "`max_attempts`: must be at least 1; set it to 1 or more"
        );
        let e = e.on("orders");
        assert_eq!(
            e.to_string(),
            "`max_attempts` of `orders`: must be at least 1; set it to 1 or more"
        );
        let e = Error::from(e);
        assert_eq!(e.kind(), ErrorKind::Configuration);
        let config = e.config_error().expect("a configuration error");
        assert_eq!(config.option, "max_attempts");
        assert_eq!(config.subject.as_deref(), Some("orders"));
        assert_eq!(
            e.to_string(),
            "configuration: `max_attempts` of `orders`: must be at least 1; set it to 1 or more"
        );
    }
}
