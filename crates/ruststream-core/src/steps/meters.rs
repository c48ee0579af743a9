//! The steps' metrics: `ruststream_steps_total{queue, outcome}`, each step a handler reached
//! (`run`: its closure ran and its result was recorded; `replayed`: its recorded result was
//! returned; `failed`: its closure failed or its record could not be read or written), and
//! `ruststream_sleeps_total{queue}`, each durable sleep begun. Counted only by handlers that use
//! steps; sends no command.

/// Counts one step of a message read from `queue`.
pub(crate) fn step(queue: &str, outcome: &'static str) {
    metrics::counter!("ruststream_steps_total", "queue" => queue.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// Counts one durable sleep begun by a message read from `queue`.
pub(crate) fn sleep(queue: &str) {
    metrics::counter!("ruststream_sleeps_total", "queue" => queue.to_owned()).increment(1);
}
