//! Log capture: one `tracing` subscriber for a whole test process (a process has one), installed
//! by the first test that asks for it, writing every event at DEBUG and above (fred's `log`
//! records included; nothing in RustStream logs at TRACE) without colours into one buffer, and
//! keeping each event's message and fields for tests that read structured events. Every test of
//! the binary logs into it once it is installed, so a test looks only for lines or events that
//! name its own keys, ids or subscriptions. `RUSTSTREAM_TEST_LOGS=1` also echoes the lines to
//! stderr.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The formatted lines: what [`captured`] returns.
type Buffer = Arc<Mutex<Vec<u8>>>;

/// One event, structured: its message and its other fields (values as `Display` for strings,
/// `Debug` for the rest).
#[derive(Debug, Clone)]
pub struct Event {
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

fn buffer() -> &'static Buffer {
    static LOGS: OnceLock<Buffer> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Buffer::default();
        let sink = buf.clone();
        let echo = std::env::var_os("RUSTSTREAM_TEST_LOGS").is_some();
        tracing_subscriber::registry()
            .with(tracing_subscriber::filter::LevelFilter::DEBUG)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(move || Sink(sink.clone(), echo)),
            )
            .with(Events)
            .try_init()
            .expect("the only subscriber of this test process");
        buf
    })
}

fn events_store() -> &'static Mutex<Vec<Event>> {
    static EVENTS: OnceLock<Mutex<Vec<Event>>> = OnceLock::new();
    EVENTS.get_or_init(Mutex::default)
}

/// Everything logged in this test process so far; installs the subscriber on first use.
pub fn captured() -> Buffer {
    buffer().clone()
}

/// Installs the subscriber (once per process): what a test calls before the events it reads.
pub fn capture() {
    buffer();
}

/// What [`captured`] holds, as text.
pub fn text() -> String {
    String::from_utf8_lossy(&buffer().lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
}

/// The captured lines that contain every one of `parts`.
pub fn lines_with(parts: &[&str]) -> Vec<String> {
    let out = buffer().lock().unwrap_or_else(PoisonError::into_inner);
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .map(str::to_owned)
        .collect()
}

/// The captured events with `message` whose field `field` is `value`.
pub fn events(message: &str, field: &str, value: &str) -> Vec<Event> {
    capture();
    let events = events_store()
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    events
        .iter()
        .filter(|e| e.message == message && e.fields.get(field).is_some_and(|v| v == value))
        .cloned()
        .collect()
}

struct Sink(Buffer, bool);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(b);
        if self.1 {
            let _ = std::io::stderr().write_all(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The layer that keeps each event's message and fields.
struct Events;

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Events {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let message = fields.0.remove("message").unwrap_or_default();
        events_store()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Event {
                message,
                fields: fields.0,
            });
    }
}
