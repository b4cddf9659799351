//! Log lines captured in unit tests: what an operator would read, asserted as written.
use std::sync::{Arc, Mutex};

/// The lines logged (text format, no ANSI, no time) on this thread while the guard lives.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&crate::sync::lock(&self.0)).into_owned()
    }

    /// The lines, without the padding of the level.
    pub fn lines(&self) -> Vec<String> {
        self.text()
            .lines()
            .map(|l| l.trim_start().to_string())
            .collect()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        crate::sync::lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures this thread's log lines at `level` and above, filtered as `--log <level>` filters
/// (tokio's current-thread tests run every task on this thread).
pub fn capture(level: tracing::Level) -> (Captured, tracing::subscriber::DefaultGuard) {
    let out = Captured::default();
    let w = out.clone();
    let filter = crate::cli::log_filter(level.as_str()).expect("a level is a filter");
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || w.clone())
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .finish();
    (out, tracing::subscriber::set_default(subscriber))
}
