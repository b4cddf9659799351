//! Log lines captured in unit tests: what an operator would read, asserted as written.
//!
//! One global subscriber, filtered as `--log info` filters, writes each line to the buffer of
//! the thread that logged it (tokio's current-thread tests run every task on the test's thread).
//! Scoped subscribers per test would be simpler, but tracing caches each call site's interest
//! across threads, so a line first logged by a test without one is lost to the others.
use std::{
    cell::RefCell,
    sync::{Arc, Mutex, Once},
};

thread_local! {
    static SINK: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

/// This thread's lines while the guard lives.
#[derive(Clone, Default)]
pub(crate) struct Captured {
    buf: Arc<Mutex<Vec<u8>>>,
    min: Option<tracing::Level>,
}

impl Captured {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&crate::sync::lock(&self.buf)).into_owned()
    }

    /// The lines at the captured level and above, without the padding of the level.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.text()
            .lines()
            .map(|l| l.trim_start().to_string())
            .filter(|l| {
                let level = l.split(' ').next().and_then(|w| w.parse().ok());
                level.is_some_and(|l: tracing::Level| self.min.is_none_or(|min| l <= min))
            })
            .collect()
    }
}

/// Where the global subscriber writes: the current thread's capture, if any.
struct ThreadSink;

impl std::io::Write for ThreadSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        SINK.with(|s| {
            if let Some(c) = &*s.borrow() {
                crate::sync::lock(&c.buf).extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Stops the capture when dropped.
pub(crate) struct Guard(());

impl Drop for Guard {
    fn drop(&mut self) {
        SINK.with(|s| s.borrow_mut().take());
    }
}

/// Captures this thread's log lines at `level` and above.
pub(crate) fn capture(level: tracing::Level) -> (Captured, Guard) {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let filter = crate::cli::log_filter("info").expect("a level is a filter");
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(|| ThreadSink)
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .init();
    });
    let out = Captured {
        buf: Arc::default(),
        min: Some(level),
    };
    SINK.with(|s| *s.borrow_mut() = Some(out.clone()));
    (out, Guard(()))
}
