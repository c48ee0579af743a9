//! Log capture: one `tracing` subscriber for a whole test binary, writing every level (fred's
//! `log` records included) without colours into a buffer a test reads back.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

/// Everything logged in this test process so far; installs the subscriber on first use (the
/// binary must have no other).
pub fn captured() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .try_init()
            .expect("the only subscriber of this test binary");
        buf
    })
    .clone()
}

/// What [`captured`] holds, as text.
pub fn text() -> String {
    String::from_utf8_lossy(&captured().lock().expect("the log buffer")).into_owned()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("the log buffer").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
