//! The Prometheus recorder of a test process: installed once, by the first test that asks for it
//! (a process has one recorder), with RustStream's buckets (`install_recorder`). Every app of the
//! process records into it once it is installed, so a test reads only the series of a
//! subscription or queue no other test uses (a name of its own, or one with the test's prefix).
//! A subscription takes its handles when it opens: call [`prometheus`] before starting the app.

use std::sync::OnceLock;

use metrics_exporter_prometheus::PrometheusHandle;
use ruststream::http::metrics::install_recorder;

/// The process's recorder; installs it on first use.
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| install_recorder().expect("the only recorder of this test process"))
}

/// The value of the sample line of `name` in `text` whose labels contain every one of `labels`.
pub fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|lab| l.contains(lab)))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}
