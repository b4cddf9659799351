//! Stdout for `observer watch`, whose lines are written on the kernel reader's own thread
//! (real-time with `--realtime-priority`): a reader of stdout that stops reading must not stop
//! that thread, or the PLEG's state, the kernel's ring buffer and every later death stall with it.
//!
//! A pipe, FIFO or terminal is reopened non-blocking through /proc/self/fd: a file description
//! of the agent's own, so the shell's (shared with whatever else writes to it) keeps its mode. A
//! socket (systemd's journal) is sent to with MSG_DONTWAIT. A regular file is written as before:
//! it never waits on a reader. Lines the reader has not taken wait in a bounded buffer; past it,
//! whole lines are dropped and counted. The thread never logs (stderr may be the same stalled
//! pipe): `Stdout::drain`, on the async runtime, says when a stall starts and ends, and writes
//! the rest as the reader takes it.
use std::{
    io,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
        unix::fs::FileTypeExt,
    },
    sync::{Arc, Mutex},
};

use nix::{
    errno::Errno,
    fcntl::OFlag,
    sys::{socket::MsgFlags, stat::Mode as FileMode},
};
use tokio::io::{unix::AsyncFd, Interest};

/// Room for lines a stalled reader has not taken yet: some 20,000 JSON lines.
pub(crate) const PENDING_CAP: usize = 4 << 20;

/// How the file description is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// write(2) on a non-blocking file description of our own.
    Write,
    /// send(2) with MSG_DONTWAIT: a socket cannot be reopened.
    Send,
    /// write(2) that may wait: a regular file, or where reopening failed.
    Blocking,
}

/// What a flush left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flushed {
    /// Everything was taken.
    All,
    /// The reader is behind; `started` when this flush is the one that found it so.
    Pending { started: bool },
}

/// A line buffer over one file description that never waits on its reader (but in `Blocking`).
pub(crate) struct LineOut {
    fd: OwnedFd,
    mode: Mode,
    /// A pipe: written in whole lines of at most PIPE_BUF, which the kernel writes whole or not
    /// at all, so that a reader who comes back (or the end of the watch) never finds a cut line.
    pipe: bool,
    buf: Vec<u8>,
    /// How much of `buf`'s front the reader already took.
    sent: usize,
    cap: usize,
    dropped: u64,
    stalled: bool,
}

impl LineOut {
    /// Over `fd` (a duplicate or a reopened description: `fd` itself is left as it was). Also
    /// returns why it could not be made non-blocking, for the caller to say.
    pub(super) fn new(fd: BorrowedFd<'_>, cap: usize) -> io::Result<(Self, Option<io::Error>)> {
        let (fd, mode, pipe, why) = match nonblocking(fd) {
            Ok((fd, mode, pipe)) => (fd, mode, pipe, None),
            Err(e) => (fd.try_clone_to_owned()?, Mode::Blocking, false, Some(e)),
        };
        let out = Self {
            fd,
            mode,
            pipe,
            buf: Vec::with_capacity(1 << 16),
            sent: 0,
            cap,
            dropped: 0,
            stalled: false,
        };
        Ok((out, why))
    }

    /// Appends one line made by `make`, or drops it whole (and counts it) when the lines the
    /// reader has not taken would pass the cap. A line is never cut: what the reader gets is
    /// whole lines, in order, with gaps.
    pub(super) fn line(
        &mut self,
        make: impl FnOnce(&mut Vec<u8>) -> io::Result<()>,
    ) -> io::Result<()> {
        let start = self.buf.len();
        if let Err(e) = make(&mut self.buf) {
            self.buf.truncate(start);
            return Err(e);
        }
        if self.pending() > self.cap {
            if self.mode == Mode::Blocking {
                self.flush()?;
            } else {
                // The reader is a whole cap behind: this line is the one to lose.
                self.buf.truncate(start);
                self.dropped += 1;
            }
        }
        Ok(())
    }

    /// Writes what the reader will take now.
    pub(super) fn flush(&mut self) -> io::Result<Flushed> {
        while self.sent < self.buf.len() {
            let chunk = self.next_chunk();
            let r = match self.mode {
                Mode::Send => nix::sys::socket::send(
                    self.fd.as_raw_fd(),
                    chunk,
                    MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
                ),
                Mode::Write | Mode::Blocking => nix::unistd::write(&self.fd, chunk),
            };
            match r {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => {
                    // Keep only what is left, so the buffer's size is what is pending.
                    self.buf.drain(..self.sent);
                    self.sent = 0;
                    let started = !self.stalled;
                    self.stalled = true;
                    return Ok(Flushed::Pending { started });
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.buf.clear();
        self.sent = 0;
        self.stalled = false;
        Ok(Flushed::All)
    }

    /// What to write next: everything, or for a pipe, the whole lines that fit in PIPE_BUF (a
    /// longer line alone, which the kernel may then cut).
    fn next_chunk(&self) -> &[u8] {
        let rest = &self.buf[self.sent..];
        if !self.pipe || rest.len() <= libc::PIPE_BUF {
            return rest;
        }
        let end = match memrchr(&rest[..libc::PIPE_BUF]) {
            Some(nl) => nl + 1,
            None => rest
                .iter()
                .position(|&b| b == b'\n')
                .map_or(rest.len(), |nl| nl + 1),
        };
        &rest[..end]
    }

    /// Lines dropped so far.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Bytes the reader has not taken.
    pub(super) fn pending(&self) -> usize {
        self.buf.len() - self.sent
    }

    /// A duplicate to wait on for room, where the writes do not wait themselves.
    fn readiness(&self) -> Option<io::Result<OwnedFd>> {
        (self.mode != Mode::Blocking).then(|| self.fd.try_clone())
    }
}

fn memrchr(b: &[u8]) -> Option<usize> {
    b.iter().rposition(|&c| c == b'\n')
}

/// A description of the same file that does not wait on its reader, its mode, and whether it is
/// a pipe.
fn nonblocking(fd: BorrowedFd<'_>) -> io::Result<(OwnedFd, Mode, bool)> {
    let own = fd.try_clone_to_owned()?;
    let kind = std::fs::File::from(own.try_clone()?)
        .metadata()?
        .file_type();
    if kind.is_socket() {
        return Ok((own, Mode::Send, false));
    }
    // A character device other than a terminal (/dev/null) never waits, and epoll refuses it.
    if kind.is_fifo() || (kind.is_char_device() && nix::unistd::isatty(fd).unwrap_or(false)) {
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let reopened = nix::fcntl::open(
            path.as_str(),
            OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
            FileMode::empty(),
        )?;
        return Ok((reopened, Mode::Write, kind.is_fifo()));
    }
    Ok((own, Mode::Blocking, false))
}

/// The process's stdout as a `LineOut`, shared by the reader's thread (which writes lines and
/// flushes at each batch's end) and the async side (`drain`).
#[derive(Clone)]
pub(crate) struct Stdout(Arc<Shared>);

struct Shared {
    out: Mutex<LineOut>,
    /// Woken when a flush finds the reader behind.
    stalled: tokio::sync::Notify,
}

impl Stdout {
    /// Stdout; where it cannot be made non-blocking, says so once and writes it as before.
    pub(super) fn open() -> io::Result<Self> {
        let (out, why) = LineOut::new(io::stdout().as_fd(), PENDING_CAP)?;
        if let Some(e) = why {
            tracing::warn!(
                "stdout could not be reopened non-blocking ({e}): a reader of stdout that stops \
                 reading will stall the kernel reader's thread; redirect stdout to a file or a pipe"
            );
        }
        Ok(Self::new(out))
    }

    pub(super) fn new(out: LineOut) -> Self {
        Self(Arc::new(Shared {
            out: Mutex::new(out),
            stalled: tokio::sync::Notify::new(),
        }))
    }

    /// See `LineOut::line`.
    pub(super) fn line(&self, make: impl FnOnce(&mut Vec<u8>) -> io::Result<()>) -> io::Result<()> {
        crate::sync::lock(&self.0.out).line(make)
    }

    /// Writes what the reader takes now; the rest waits for `drain`.
    pub(super) fn flush(&self) -> io::Result<()> {
        let flushed = crate::sync::lock(&self.0.out).flush()?;
        if flushed == (Flushed::Pending { started: true }) {
            self.0.stalled.notify_one();
        }
        Ok(())
    }

    pub(super) fn dropped(&self) -> u64 {
        crate::sync::lock(&self.0.out).dropped()
    }

    /// At the end: one last write, and what the reader still has not taken counted as dropped.
    pub(super) fn finish(&self) {
        let mut out = crate::sync::lock(&self.0.out);
        if out.flush().is_err() || out.pending() > 0 {
            let left = out.buf[out.sent..].iter().filter(|&&b| b == b'\n').count();
            out.dropped += left as u64;
            out.buf.clear();
            out.sent = 0;
        }
    }

    /// Runs beside the writer for as long as stdout is written: when the reader falls behind,
    /// says so, writes the rest as it takes it, and says what was dropped meanwhile. Returns
    /// only on a write error (stdout closed).
    pub(super) async fn drain(&self) -> io::Error {
        let readiness = crate::sync::lock(&self.0.out).readiness();
        let ready = match readiness {
            // Writes that wait never leave anything behind.
            None => return std::future::pending().await,
            // SAFETY: the AsyncFd owns this duplicate for its whole life: it stays open and is
            // the same descriptor until the AsyncFd is dropped.
            Some(Ok(fd)) => unsafe { AsyncFd::register_with_interest(fd, Interest::WRITABLE) }
                .map_err(|e| e.into_parts().1),
            Some(Err(e)) => Err(e),
        };
        let ready = match ready {
            Ok(r) => r,
            Err(e) => {
                // Not the watch's end: lines still go out at each batch's end.
                tracing::warn!(
                    "stdout cannot be waited on ({e}): lines a stalled reader has not taken go \
                     out with the next events"
                );
                return std::future::pending().await;
            }
        };
        loop {
            self.0.stalled.notified().await;
            let (pending, dropped_before) = {
                let out = crate::sync::lock(&self.0.out);
                (out.pending(), out.dropped())
            };
            tracing::warn!(
                pending_bytes = pending,
                "stdout is not being read as fast as events come: lines wait (up to {} MiB), \
                 then are dropped and counted",
                PENDING_CAP >> 20
            );
            loop {
                let mut guard = match ready.writable().await {
                    Ok(g) => g,
                    Err(e) => return e,
                };
                let r = guard.try_io(|_| match crate::sync::lock(&self.0.out).flush() {
                    Ok(Flushed::All) => Ok(Ok(())),
                    Ok(Flushed::Pending { .. }) => Err(io::ErrorKind::WouldBlock.into()),
                    Err(e) => Ok(Err(e)),
                });
                match r {
                    Ok(Ok(Ok(()))) => break,
                    Ok(Ok(Err(e))) | Ok(Err(e)) => return e,
                    Err(_would_block) => {}
                }
            }
            let dropped = self.dropped() - dropped_before;
            tracing::warn!(
                dropped,
                "stdout caught up; {dropped} lines were dropped meanwhile"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{io::Read, time::Duration};

    fn pipe() -> (std::fs::File, OwnedFd) {
        let (r, w) = nix::unistd::pipe().unwrap();
        (std::fs::File::from(r), w)
    }

    fn numbered(i: u32) -> impl FnOnce(&mut Vec<u8>) -> io::Result<()> {
        move |b: &mut Vec<u8>| {
            use std::io::Write;
            writeln!(b, "line {i:08} {}", "x".repeat(40))
        }
    }

    fn is_nonblocking(fd: BorrowedFd<'_>) -> bool {
        let fl = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        OFlag::from_bits_truncate(fl).contains(OFlag::O_NONBLOCK)
    }

    /// Lines written into a pipe nobody reads: the writer never waits, keeps at most the cap,
    /// drops whole lines, and the reader later gets whole lines in order, every one written or
    /// counted as dropped.
    #[test]
    fn a_stalled_pipe_costs_lines_not_the_writer() {
        let (mut reader, w) = pipe();
        let cap = 256 << 10;
        let (mut out, why) = LineOut::new(w.as_fd(), cap).unwrap();
        assert!(why.is_none(), "{why:?}");
        // The shell's description stays blocking; ours is not.
        assert!(!is_nonblocking(w.as_fd()));
        assert!(out.readiness().is_some());
        let total = 20_000u32;
        // Run in a thread with a deadline: a writer that waits would hang the test, not fail it.
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = std::thread::spawn(move || {
            let mut first_stall = None;
            for i in 0..total {
                out.line(numbered(i)).unwrap();
                if let Flushed::Pending { started: true } = out.flush().unwrap() {
                    first_stall.get_or_insert(i);
                }
                assert!(
                    out.pending() <= cap,
                    "{} pending over the cap",
                    out.pending()
                );
            }
            tx.send(()).unwrap();
            (out, first_stall)
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the writer waited on a reader that does not read");
        let (mut out, first_stall) = writer.join().unwrap();
        let first_stall = first_stall.expect("the pipe never filled");
        let dropped = out.dropped();
        assert!(dropped > 0);
        // Now the reader reads; the rest comes out as room appears.
        let mut got = Vec::new();
        let mut chunk = vec![0u8; 1 << 16];
        loop {
            let flushed = out.flush().unwrap();
            let n = reader.read(&mut chunk).unwrap();
            got.extend_from_slice(&chunk[..n]);
            if flushed == Flushed::All && out.pending() == 0 {
                // One more read for what the last flush wrote.
                drop(out);
                drop(w);
                reader.read_to_end(&mut got).unwrap();
                break;
            }
        }
        let text = String::from_utf8(got).unwrap();
        let nums: Vec<u32> = text
            .lines()
            .map(|l| {
                assert!(l.starts_with("line ") && l.len() == 54, "cut line: {l:?}");
                l[5..13].parse().unwrap()
            })
            .collect();
        assert!(nums.windows(2).all(|w| w[0] < w[1]), "out of order");
        // Everything up to the stall, and what the buffer held after it, came out unbroken.
        let prefix = nums
            .iter()
            .enumerate()
            .take_while(|(i, n)| *i as u32 == **n)
            .count();
        assert!(
            prefix as u32 > first_stall,
            "lines before the stall were lost"
        );
        assert_eq!(
            nums.len() as u64 + dropped,
            total as u64,
            "lines neither written nor counted"
        );
    }

    /// However the reader left it, the pipe holds whole lines: a full pipe is not filled to the
    /// last byte with half a line.
    #[test]
    fn a_full_pipe_holds_whole_lines() {
        let (mut reader, w) = pipe();
        let (mut out, _) = LineOut::new(w.as_fd(), 1 << 20).unwrap();
        let mut i = 0;
        // 100 lines (5.5 kB) a flush: more than one atomic write's worth each time.
        while !out.stalled {
            for _ in 0..100 {
                out.line(numbered(i)).unwrap();
                i += 1;
            }
            out.flush().unwrap();
        }
        drop(out);
        drop(w);
        let mut got = Vec::new();
        reader.read_to_end(&mut got).unwrap();
        assert!(got.len() > 4096, "the pipe held only {} bytes", got.len());
        assert_eq!(got.last(), Some(&b'\n'), "a cut line at the end");
        let text = String::from_utf8(got).unwrap();
        for (n, l) in text.lines().enumerate() {
            assert_eq!(l.len(), 54, "line {n} cut: {l:?}");
        }
    }

    #[test]
    fn a_socket_is_sent_to_without_waiting() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (mut out, why) = LineOut::new(a.as_fd(), 64 << 10).unwrap();
        assert!(why.is_none());
        assert_eq!(out.mode, Mode::Send);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for i in 0..50_000 {
                out.line(numbered(i)).unwrap();
                out.flush().unwrap();
            }
            tx.send(out.dropped()).unwrap();
        });
        let dropped = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the writer waited on the socket");
        assert!(dropped > 0);
        drop(b);
    }

    #[test]
    fn a_regular_file_is_written_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let mut f = std::fs::File::create(&path).unwrap();
        std::io::Write::write_all(&mut f, b"before\n").unwrap();
        let (mut out, why) = LineOut::new(f.as_fd(), 1 << 10).unwrap();
        assert!(why.is_none());
        assert_eq!(out.mode, Mode::Blocking);
        assert!(out.readiness().is_none());
        for i in 0..100 {
            out.line(numbered(i)).unwrap();
        }
        assert_eq!(out.flush().unwrap(), Flushed::All);
        assert_eq!(out.dropped(), 0, "a file never drops");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("before\nline 00000000"), "{}", &text[..30]);
        assert_eq!(text.lines().count(), 101);
    }

    /// /dev/null (a character device epoll refuses) is written as it is, and the drain does not
    /// end the watch.
    #[tokio::test]
    async fn dev_null_is_written_as_it_is() {
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap();
        let (out, why) = LineOut::new(null.as_fd(), 1 << 10).unwrap();
        assert!(why.is_none());
        assert_eq!(out.mode, Mode::Blocking);
        let stdout = Stdout::new(out);
        for i in 0..100 {
            stdout.line(numbered(i)).unwrap();
        }
        stdout.flush().unwrap();
        assert_eq!(stdout.dropped(), 0);
        let drained = tokio::time::timeout(Duration::from_millis(100), stdout.drain()).await;
        assert!(drained.is_err(), "the drain ended: {drained:?}");
    }

    #[test]
    fn a_closed_reader_is_an_error() {
        let (reader, w) = pipe();
        let (mut out, _) = LineOut::new(w.as_fd(), 1 << 10).unwrap();
        drop(reader);
        out.line(numbered(0)).unwrap();
        let e = out.flush().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    /// The async side: a stall is waited out and the rest written once the reader reads.
    #[tokio::test]
    async fn drain_writes_the_rest_when_the_reader_returns() {
        let (mut reader, w) = pipe();
        let (out, _) = LineOut::new(w.as_fd(), 1 << 20).unwrap();
        let stdout = Stdout::new(out);
        let drain = tokio::spawn({
            let s = stdout.clone();
            async move { s.drain().await }
        });
        let mut i = 0;
        loop {
            stdout.line(numbered(i)).unwrap();
            stdout.flush().unwrap();
            i += 1;
            if crate::sync::lock(&stdout.0.out).stalled {
                break;
            }
        }
        let written = i;
        let got = tokio::task::spawn_blocking(move || {
            let mut got = Vec::new();
            let mut chunk = vec![0u8; 1 << 16];
            while got.iter().filter(|&&b| b == b'\n').count() < written as usize {
                let n = reader.read(&mut chunk).unwrap();
                got.extend_from_slice(&chunk[..n]);
            }
            got
        });
        let got = tokio::time::timeout(Duration::from_secs(30), got)
            .await
            .expect("drain never wrote the rest")
            .unwrap();
        assert_eq!(
            String::from_utf8(got).unwrap().lines().count(),
            written as usize
        );
        assert_eq!(stdout.dropped(), 0);
        assert!(!drain.is_finished());
        drain.abort();
        // `w` stays open until here: closing it early would end the pipe.
        drop(w);
    }
}
