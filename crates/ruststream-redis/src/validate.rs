//! Startup checks of a subscription's configuration: each error names the key and says what to set.

use ruststream_core::{Error, Result};

use crate::RedisSource;
use crate::list::Mode;

/// Checks one source.
pub(crate) fn source(s: &RedisSource) -> Result<()> {
    match s {
        RedisSource::List(l) => {
            let key = &l.key;
            if key.is_empty() {
                return Err(Error::config("a RedisList has an empty key: name the list"));
            }
            if l.opts.concurrency == 0 {
                return Err(Error::config(format!(
                    "list `{key}`: concurrency must be at least 1"
                )));
            }
            if l.opts.max_attempts == 0 {
                return Err(Error::config(format!(
                    "list `{key}`: max_attempts must be at least 1"
                )));
            }
            if l.block.is_zero() {
                return Err(Error::config(format!(
                    "list `{key}`: block must be longer than zero (it would block forever)"
                )));
            }
            if l.mode == Mode::Simple && (l.processing.is_some() || l.recovery_zset.is_some()) {
                return Err(Error::config(format!(
                    "list `{key}`: processing and recovery_zset need a reliable list; add `.reliable()`"
                )));
            }
            if l.mode == Mode::Reliable && l.processing_key() == *key {
                return Err(Error::config(format!(
                    "list `{key}`: the processing list must differ from the queue"
                )));
            }
            Ok(())
        }
        RedisSource::Stream(st) => {
            let key = &st.key;
            if st.group.as_deref().is_none_or(str::is_empty) {
                return Err(Error::config(format!(
                    "stream `{key}` has no consumer group: add `.group(\"name\")`"
                )));
            }
            if st.opts.concurrency == 0 || st.opts.max_attempts == 0 {
                return Err(Error::config(format!(
                    "stream `{key}`: concurrency and max_attempts must be at least 1"
                )));
            }
            if st.block.is_zero() {
                return Err(Error::config(format!(
                    "stream `{key}`: block must be longer than zero"
                )));
            }
            Ok(())
        }
    }
}
