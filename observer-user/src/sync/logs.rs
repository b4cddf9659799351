//! Log lines that never hold the thread that logs them. Every thread of the process logs
//! through one bounded queue ([`queue`]); a thread of its own, at normal priority, drains it
//! into the sink (stderr). A line that finds the queue full is dropped and counted, and the
//! drain says how many were dropped once it catches up. So the kernel reader's thread, which may
//! be real-time, never waits for stderr: a reader of the agent's log that stops reading (a full
//! pipe, a stalled log collector) costs log lines, never a death's PATCH (ARCHITECTURE.md, "The
//! fast path and its bound"). std's `Stderr` takes a lock that a normal-priority thread holds
//! while it is blocked on such a pipe; the queue is the one way in, and its `try_send` takes
//! no lock.
use std::{
    io::{self, Write},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{self, SyncSender, TrySendError},
        Arc,
    },
    time::Duration,
};

/// Lines queued at most: about 256 KiB of ordinary lines.
pub const CAPACITY: usize = 2048;

enum Msg {
    Line(Vec<u8>),
    /// Everything queued before it is written: acknowledge.
    Flush(SyncSender<()>),
}

/// The writers' end ([`tracing_subscriber::fmt::MakeWriter`]): each event is one `write`,
/// sent whole or dropped.
#[derive(Clone)]
pub struct LogQueue {
    tx: SyncSender<Msg>,
    dropped: Arc<AtomicU64>,
}

/// Waits, when dropped, up to [`Self::WAIT`] for the lines queued so far to be written (the
/// process's last lines, before it exits).
pub struct LogFlush {
    tx: SyncSender<Msg>,
}

impl LogFlush {
    pub const WAIT: Duration = Duration::from_secs(2);
}

/// The queue, and its drain writing into `sink` on a thread of its own (which ends when every
/// [`LogQueue`] is dropped). Fails only when the thread cannot be started.
pub fn queue<W: Write + Send + 'static>(
    mut sink: W,
    capacity: usize,
) -> io::Result<(LogQueue, LogFlush)> {
    let (tx, rx) = mpsc::sync_channel::<Msg>(capacity);
    let dropped = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&dropped);
    std::thread::Builder::new()
        .name("observer-log".into())
        .spawn(move || {
            let mut told = 0;
            for msg in rx {
                match msg {
                    Msg::Line(line) => {
                        // Nowhere else to say that the log cannot be written.
                        let _ = sink.write_all(&line);
                    }
                    Msg::Flush(ack) => {
                        let _ = sink.flush();
                        let _ = ack.try_send(());
                    }
                }
                let now = seen.load(Ordering::Relaxed);
                if now > told {
                    let _ = writeln!(
                        sink,
                        "observer: {} log lines dropped ({now} in all): the log's reader did not keep up",
                        now - told
                    );
                    told = now;
                }
            }
        })?;
    Ok((
        LogQueue {
            tx: tx.clone(),
            dropped,
        },
        LogFlush { tx },
    ))
}

impl LogQueue {
    /// Lines dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn send(&self, line: &[u8]) {
        match self.tx.try_send(Msg::Line(line.to_vec())) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// One event's line.
pub struct Line<'a>(&'a LogQueue);

impl Write for Line<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.send(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogQueue {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line(self)
    }
}

impl Drop for LogFlush {
    fn drop(&mut self) {
        let (ack, done) = mpsc::sync_channel(1);
        let deadline = std::time::Instant::now() + Self::WAIT;
        let mut msg = Msg::Flush(ack);
        // The queue may be full: try until the deadline (the process is exiting).
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if std::time::Instant::now() < deadline => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return,
            }
        }
        let _ = done.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Condvar, Mutex};

    use super::*;

    /// A sink that blocks every write until opened, then keeps what it was given.
    #[derive(Clone, Default)]
    struct Gate(Arc<(Mutex<Gated>, Condvar)>);

    /// Whether the gate is open, and what was written through it.
    type Gated = (bool, Vec<u8>);

    impl Gate {
        fn open(&self) {
            crate::sync::lock(&self.0 .0).0 = true;
            self.0 .1.notify_all();
        }

        fn text(&self) -> String {
            String::from_utf8_lossy(&crate::sync::lock(&self.0 .0).1).into_owned()
        }
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (m, cv) = &*self.0;
            let mut g = crate::sync::lock(m);
            while !g.0 {
                g = cv
                    .wait(g)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            g.1.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A sink that blocks does not hold the writers: ten thousand lines are given in well under
    /// a second, those past the queue dropped and counted; once the sink takes lines again the
    /// queued ones are written, in order, and the drop is said.
    #[test]
    fn a_blocked_sink_costs_lines_not_the_writer() {
        let gate = Gate::default();
        let (q, flush) = queue(gate.clone(), 16).unwrap();
        let started = std::time::Instant::now();
        let mut w = tracing_subscriber::fmt::MakeWriter::make_writer(&q);
        // One write per line, as the formatter gives a whole event.
        for i in 0..10_000 {
            w.write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the writer waited: {:?}",
            started.elapsed()
        );
        // The drain holds one line (blocked in the sink), the queue 16.
        let dropped = q.dropped();
        assert!((10_000 - 17..=10_000 - 16).contains(&dropped), "{dropped}");
        gate.open();
        drop(flush);
        let text = gate.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "line 0");
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("{dropped} log lines dropped"))),
            "{text}"
        );
    }
}
