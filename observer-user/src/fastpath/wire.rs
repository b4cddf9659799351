//! The fast path's connections to the API server, owned by the kernel reader's thread: a death's
//! request is written to the socket from that thread within the batch that read the death, with
//! no task, no channel and no other thread between the decision and `send(2)`.
//!
//! Why not hyper: its client runs a connection as a task that a request is handed to, which
//! needs an executor on the reader's thread, an epoll wake-up of the reader through that
//! executor, and a task switch before the first byte leaves; on the api_path bench that was
//! about 250 µs of the 360 µs from the kernel's exit to the wire on a busy node. What the fast
//! path sends is narrow (a PATCH with a body, and a GET to keep the connection alive, both
//! HTTP/1.1 with a known length), so its framing is small: the request head is written here,
//! responses are framed as their bytes arrive ([`Framer`], with `httparse`; one past
//! [`MAX_RESPONSE_BYTES`] drops the connection), and TLS is rustls with kube's own configuration.
//!
//! Requests are pipelined (HTTP/1.1 answers them in order): a death never waits for another's
//! answer to be written. A connection is non-blocking throughout; the reader's poll(2) waits on
//! it for answers and, when the socket's buffer was full, for room. Connections are opened and
//! proven (TLS, credentials, `GET /version`) at normal priority by the dialer ([`super::dial`]),
//! never on the reader's thread.
use std::{
    collections::VecDeque,
    io::{self, Read, Write},
    net::TcpStream,
    os::fd::{AsRawFd, RawFd},
    time::{Duration, Instant},
};

use rustls::ClientConnection;

/// What every request of the fast path carries, from kube's configuration: the base path, the
/// `Host`, and the headers kube's layers add (credentials, impersonation, the config's own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    /// The cluster URL's path, without its trailing `/`.
    pub prefix: String,
    pub host: String,
    /// `Name: value\r\n` each.
    pub headers: Vec<u8>,
}

impl Template {
    /// A request's bytes: its head and `body`. Put together without `core::fmt`, which the
    /// reader's thread would run cold at a death.
    pub fn request(&self, method: &str, path: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::with_capacity(320 + self.headers.len() + path.len() + body.len());
        self.request_into(&mut r, method, &[path], content_type, &[body]);
        r
    }

    /// [`Self::request`] appended to `out`, its path and body given in parts: a death's
    /// request goes straight into its connection's buffer, unassembled before.
    pub(crate) fn request_into(
        &self,
        out: &mut Vec<u8>,
        method: &str,
        path: &[&str],
        content_type: &str,
        body: &[&[u8]],
    ) {
        out.extend_from_slice(method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.prefix.as_bytes());
        for p in path {
            out.extend_from_slice(p.as_bytes());
        }
        for part in [
            &b" HTTP/1.1\r\nHost: "[..],
            self.host.as_bytes(),
            b"\r\nUser-Agent: observer/",
            env!("CARGO_PKG_VERSION").as_bytes(),
            b"\r\nAccept: application/json\r\n",
            &self.headers,
        ] {
            out.extend_from_slice(part);
        }
        if method != "GET" {
            let mut n = itoa::Buffer::new();
            let len: usize = body.iter().map(|b| b.len()).sum();
            for part in [
                &b"Content-Type: "[..],
                content_type.as_bytes(),
                b"\r\nContent-Length: ",
                n.format(len).as_bytes(),
                b"\r\n",
            ] {
                out.extend_from_slice(part);
            }
        }
        out.extend_from_slice(b"\r\n");
        for b in body {
            out.extend_from_slice(b);
        }
    }
}

/// A socket, plain or TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<(TcpStream, ClientConnection)>),
}

impl Stream {
    fn socket(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &t.0,
        }
    }

    /// Writes what the socket takes now of `out` (and, with TLS, of what rustls holds); true
    /// when nothing is left.
    fn flush(&mut self, out: &mut Vec<u8>) -> io::Result<bool> {
        match self {
            Stream::Plain(s) => {
                while !out.is_empty() {
                    match s.write(out) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => {
                            out.drain(..n);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(true)
            }
            Stream::Tls(t) => {
                let (s, c) = &mut **t;
                if !out.is_empty() {
                    c.writer().write_all(out)?;
                    out.clear();
                }
                while c.wants_write() {
                    match c.write_tls(s) {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(true)
            }
        }
    }

    /// Hands what arrived to `sink`, a read at a time: all of it on a non-blocking socket, the
    /// first read's on a blocking one (`once`). Says whether the connection is still open, and
    /// whether the socket gave anything (a blocking socket's read timeout passed when it did
    /// not). The sink's error ends the reading at once: a server that sends without end holds
    /// the thread no longer than the sink takes to refuse it.
    fn receive(
        &mut self,
        once: bool,
        mut sink: impl FnMut(&[u8]) -> Result<(), ConnError>,
    ) -> Result<(bool, bool), ConnError> {
        let mut buf = [0u8; 8192];
        let mut got = false;
        match self {
            Stream::Plain(s) => loop {
                match s.read(&mut buf) {
                    Ok(0) => return Ok((false, true)),
                    Ok(n) => {
                        got = true;
                        sink(&buf[..n])?;
                        if once {
                            return Ok((true, got));
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok((true, got)),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e.into()),
                }
            },
            Stream::Tls(t) => {
                let (s, c) = &mut **t;
                let mut open = true;
                loop {
                    let read = match c.read_tls(s) {
                        Ok(0) => {
                            open = false;
                            got = true;
                            0
                        }
                        Ok(n) => {
                            got = true;
                            n
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e.into()),
                    };
                    c.process_new_packets().map_err(io::Error::other)?;
                    // Drained after every read: rustls takes no more records while its plaintext
                    // buffer is full.
                    loop {
                        match c.reader().read(&mut buf) {
                            Ok(0) => {
                                open = false;
                                break;
                            }
                            Ok(n) => sink(&buf[..n])?,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                            // Closed without close_notify.
                            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                                open = false;
                                break;
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                    if !open || read == 0 || once {
                        break;
                    }
                }
                // An answer rustls owes the server (a key update, an alert).
                if c.wants_write() {
                    self.flush(&mut Vec::new())?;
                }
                Ok((open, got))
            }
        }
    }
}

/// The most one answer may take on the wire: its head and body, with the interim (1xx) answers
/// before it. What the fast path is answered is a Pod (a few KiB, rarely a few hundred) or a
/// Status; past this the server (or something on the way) is not answering what was asked, and
/// the connection is dropped rather than read without end on the real-time thread (its
/// requests go to the status manager, as on any lost connection). It bounds what a connection
/// holds too: a head, a kept body, a chunk-size line each fit in it.
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// One response, framed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Seconds, as `Retry-After` gave them.
    pub retry_after: Option<u64>,
    /// Kept only for an answer other than 2xx (what the API said is wrong).
    pub body: Vec<u8>,
    /// The server closes the connection after it.
    pub close: bool,
}

/// Which part of an answer went past [`MAX_RESPONSE_BYTES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Head,
    Body,
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Part::Head => "head",
            Part::Body => "body",
        })
    }
}

/// A response that is not HTTP/1.1 the fast path can read: the connection is given up.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("malformed HTTP response: {0}")]
    Head(#[from] httparse::Error),
    #[error("malformed HTTP response: its head does not parse where it ends")]
    HeadEnd,
    #[error("malformed chunk in an HTTP response")]
    Chunk,
    #[error("HTTP response body without a length")]
    NoLength,
    #[error(
        "an HTTP response larger than {} bytes (its {part} went past)",
        MAX_RESPONSE_BYTES
    )]
    TooLarge { part: Part },
}

/// Where the framer is in the answer it reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// The head, up to its blank line: how much of that line ending is seen (0: within a
    /// line, 1: after a line's `\n`, 2: after `\n\r`).
    #[default]
    Head,
    /// A body of known length: the bytes still to come.
    Length(usize),
    /// A chunk's size line (gathered in `line`).
    ChunkSize,
    /// A chunk's data still to come.
    ChunkData(usize),
    /// The CRLF after a chunk's data: how much of it came.
    ChunkEnd(usize),
    /// The trailers after the last chunk: whether the line so far has more than `\r`.
    Trailers { content: bool },
}

/// Answers framed as their bytes arrive, whatever the reads' sizes: the head's end is looked
/// for in new bytes only and the head parsed once, a body is counted (kept only when the answer
/// is not 2xx) and a chunked one decoded as it comes. Each byte is looked at a bounded number
/// of times, so a large answer arriving in small reads costs its length, not its length
/// squared; an answer past [`MAX_RESPONSE_BYTES`] is an error before more of it is looked at.
#[derive(Debug, Default)]
pub(crate) struct Framer {
    state: State,
    /// In [`State::Head`]: how much of the blank line that ends it was seen.
    blank: u8,
    /// The head so far, then a chunk-size line so far.
    line: Vec<u8>,
    /// The answer as its head gave it, its body as it comes.
    answer: Response,
    /// Whether the body is kept.
    keep: bool,
    /// The answer's bytes so far (its interim answers' included).
    taken: usize,
}

impl Framer {
    /// Frames from the front of `data`, taking what it reads: the next answer once it is
    /// complete (call again for the rest of `data`); `None` when `data` is used up within one.
    /// After an error nothing more is to be read on the connection.
    pub(crate) fn next(&mut self, data: &mut &[u8]) -> Result<Option<Response>, FrameError> {
        while !data.is_empty() {
            match self.state {
                State::Head => {
                    let mut end = None;
                    for (i, &b) in data.iter().enumerate() {
                        self.blank = match (b, self.blank) {
                            (b'\n', 1 | 2) => {
                                end = Some(i + 1);
                                break;
                            }
                            (b'\n', _) => 1,
                            (b'\r', 1) => 2,
                            _ => 0,
                        };
                    }
                    let part = self.take(data, end.unwrap_or(data.len()), Part::Head)?;
                    self.line.extend_from_slice(part);
                    if end.is_some() {
                        self.blank = 0;
                        if let Some(r) = self.head()? {
                            return Ok(Some(r));
                        }
                    }
                }
                State::Length(left) => {
                    let part = self.take(data, left.min(data.len()), Part::Body)?;
                    if self.keep {
                        self.answer.body.extend_from_slice(part);
                    }
                    if left == part.len() {
                        return Ok(Some(self.done()));
                    }
                    self.state = State::Length(left - part.len());
                }
                State::ChunkSize => {
                    let eol = data.iter().position(|&b| b == b'\n');
                    let part = self.take(data, eol.map_or(data.len(), |i| i + 1), Part::Body)?;
                    self.line.extend_from_slice(part);
                    if eol.is_some() {
                        let size = match httparse::parse_chunk_size(&self.line) {
                            Ok(httparse::Status::Complete((n, size))) if n == self.line.len() => {
                                size
                            }
                            _ => return Err(FrameError::Chunk),
                        };
                        self.line.clear();
                        // A size past the cap is refused before its data comes.
                        let size = usize::try_from(size)
                            .ok()
                            .filter(|s| self.taken.saturating_add(*s) <= MAX_RESPONSE_BYTES)
                            .ok_or(FrameError::TooLarge { part: Part::Body })?;
                        self.state = if size == 0 {
                            State::Trailers { content: false }
                        } else {
                            State::ChunkData(size)
                        };
                    }
                }
                State::ChunkData(left) => {
                    let part = self.take(data, left.min(data.len()), Part::Body)?;
                    if self.keep {
                        self.answer.body.extend_from_slice(part);
                    }
                    self.state = match left - part.len() {
                        0 => State::ChunkEnd(0),
                        left => State::ChunkData(left),
                    };
                }
                State::ChunkEnd(seen) => {
                    let b = self.take(data, 1, Part::Body)?[0];
                    if b != b"\r\n"[seen] {
                        return Err(FrameError::Chunk);
                    }
                    self.state = if seen == 0 {
                        State::ChunkEnd(1)
                    } else {
                        State::ChunkSize
                    };
                }
                State::Trailers { mut content } => {
                    let mut end = None;
                    for (i, &b) in data.iter().enumerate() {
                        match b {
                            b'\n' if !content => {
                                end = Some(i + 1);
                                break;
                            }
                            b'\n' => content = false,
                            b'\r' => {}
                            _ => content = true,
                        }
                    }
                    self.take(data, end.unwrap_or(data.len()), Part::Body)?;
                    if end.is_some() {
                        return Ok(Some(self.done()));
                    }
                    self.state = State::Trailers { content };
                }
            }
        }
        Ok(None)
    }

    /// The first `n` bytes of `data`, counted against the cap.
    fn take<'a>(
        &mut self,
        data: &mut &'a [u8],
        n: usize,
        part: Part,
    ) -> Result<&'a [u8], FrameError> {
        self.taken += n;
        if self.taken > MAX_RESPONSE_BYTES {
            return Err(FrameError::TooLarge { part });
        }
        let (taken, rest) = data.split_at(n);
        *data = rest;
        Ok(taken)
    }

    /// The head is in `line`, whole: what its answer is and how its body comes. The answer, if
    /// it has no body.
    fn head(&mut self) -> Result<Option<Response>, FrameError> {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut headers);
        match r.parse(&self.line)? {
            httparse::Status::Complete(n) if n == self.line.len() => {}
            _ => return Err(FrameError::HeadEnd),
        }
        let status = r.code.unwrap_or(0);
        if (100..200).contains(&status) {
            // Interim: the answer follows (and counts against the same cap).
            self.line.clear();
            return Ok(None);
        }
        let (mut length, mut chunked, mut close, mut retry_after) = (None, false, false, None);
        for h in r.headers.iter() {
            let v = std::str::from_utf8(h.value).unwrap_or("").trim();
            if h.name.eq_ignore_ascii_case("content-length") {
                length = Some(v.parse::<u64>().map_err(|_| FrameError::NoLength)?);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = v.to_ascii_lowercase().ends_with("chunked");
            } else if h.name.eq_ignore_ascii_case("connection") {
                close = v.eq_ignore_ascii_case("close");
            } else if h.name.eq_ignore_ascii_case("retry-after") {
                retry_after = v.parse().ok();
            }
        }
        if r.version == Some(0) {
            close = true;
        }
        self.line.clear();
        self.keep = !(200..300).contains(&status);
        self.answer = Response {
            status,
            retry_after,
            body: Vec::new(),
            close,
        };
        if status == 204 || status == 304 {
            return Ok(Some(self.done()));
        }
        if chunked {
            self.state = State::ChunkSize;
            return Ok(None);
        }
        // Only the connection's end would say where it ends.
        let length = length.ok_or(FrameError::NoLength)?;
        // A length past the cap is refused before its body comes.
        let length = usize::try_from(length)
            .ok()
            .filter(|l| self.taken.saturating_add(*l) <= MAX_RESPONSE_BYTES)
            .ok_or(FrameError::TooLarge { part: Part::Body })?;
        if length == 0 {
            return Ok(Some(self.done()));
        }
        self.state = State::Length(length);
        Ok(None)
    }

    /// The answer is complete: the next starts.
    fn done(&mut self) -> Response {
        self.state = State::Head;
        self.taken = 0;
        std::mem::take(&mut self.answer)
    }
}

/// Why a connection was given up.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("the API server closed the connection")]
    Closed,
    #[error("no answer within the request timeout")]
    Timeout,
    #[error("an answer no request was waiting for")]
    Unasked,
}

impl ConnError {
    /// The answer went past [`MAX_RESPONSE_BYTES`]: which part of it.
    pub fn too_large(&self) -> Option<Part> {
        match self {
            ConnError::Frame(FrameError::TooLarge { part }) => Some(*part),
            _ => None,
        }
    }
}

/// A connection with its requests in flight, oldest first (`T` says what each was for).
pub struct Conn<T> {
    stream: Stream,
    out: Vec<u8>,
    /// What arrived is framed at once: no answer's bytes wait in a buffer of their own.
    framer: Framer,
    pending: VecDeque<(T, Instant)>,
    /// When the last request was written, or the last answer read.
    used: Instant,
    /// The server said it closes after its next answer: nothing more is written.
    closing: bool,
}

impl<T> Conn<T> {
    pub fn new(stream: Stream) -> Self {
        Self {
            stream,
            out: Vec::new(),
            framer: Framer::default(),
            pending: VecDeque::new(),
            used: Instant::now(),
            closing: false,
        }
    }

    pub fn fd(&self) -> RawFd {
        self.stream.socket().as_raw_fd()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.pending.len()
    }

    pub(crate) fn open_for_requests(&self) -> bool {
        !self.closing
    }

    pub(crate) fn idle_for(&self, now: Instant) -> Duration {
        if self.pending.is_empty() {
            now.saturating_duration_since(self.used)
        } else {
            Duration::ZERO
        }
    }

    /// Writes `request` (or queues what the socket does not take now), to be answered within
    /// `timeout`.
    /// `tag` is in flight from here on, even when the write fails: the caller then gives the
    /// connection up, and gets it back with the others unanswered.
    pub fn send(&mut self, tag: T, request: &[u8], timeout: Duration) -> Result<(), ConnError> {
        self.send_with(tag, timeout, |out| out.extend_from_slice(request))
    }

    /// [`Self::send`] of the request `build` appends to the connection's buffer.
    pub(crate) fn send_with(
        &mut self,
        tag: T,
        timeout: Duration,
        build: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), ConnError> {
        let now = Instant::now();
        self.pending.push_back((tag, now + timeout));
        self.used = now;
        build(&mut self.out);
        self.stream.flush(&mut self.out)?;
        Ok(())
    }

    /// Something is left to write.
    pub(crate) fn wants_write(&self) -> bool {
        !self.out.is_empty() || matches!(&self.stream, Stream::Tls(t) if t.1.wants_write())
    }

    /// The oldest request's deadline.
    pub(crate) fn due(&self) -> Option<Instant> {
        self.pending.front().map(|(_, d)| *d)
    }

    /// After poll(2): writes what waits, reads what arrived; returns the requests answered, in
    /// order, and why the connection is to be given up, if it is (its unanswered requests are
    /// then in [`Self::into_unanswered`]).
    pub fn ready(
        &mut self,
        readable: bool,
        writable: bool,
        now: Instant,
    ) -> (Vec<(T, Response)>, Option<ConnError>) {
        let mut answered = Vec::new();
        if writable {
            if let Err(e) = self.stream.flush(&mut self.out) {
                return (answered, Some(e.into()));
            }
        }
        if readable {
            let (framer, pending, closing) =
                (&mut self.framer, &mut self.pending, &mut self.closing);
            let received = self.stream.receive(false, |data| {
                answers(framer, pending, closing, &mut answered, data)
            });
            if !answered.is_empty() {
                self.used = Instant::now();
            }
            match received {
                Ok((true, _)) => {}
                Ok((false, _)) => return (answered, Some(ConnError::Closed)),
                Err(e) => return (answered, Some(e)),
            }
        }
        // No way to take back a pipelined request: the connection goes.
        if self.due().is_some_and(|due| due <= now) {
            return (answered, Some(ConnError::Timeout));
        }
        (answered, None)
    }

    /// When the last request was written or the last answer read.
    pub fn used(&self) -> Instant {
        self.used
    }

    /// The newest request's tag.
    pub(crate) fn newest_mut(&mut self) -> Option<&mut T> {
        self.pending.back_mut().map(|(t, _)| t)
    }

    /// Blocks until the oldest request is answered (for the dialer's probe on a blocking socket).
    pub(crate) fn answer_blocking(&mut self) -> Result<(T, Response), ConnError> {
        self.stream.flush(&mut self.out)?;
        loop {
            let mut answered = Vec::new();
            let (framer, pending, closing) =
                (&mut self.framer, &mut self.pending, &mut self.closing);
            let received = self.stream.receive(true, |data| {
                answers(framer, pending, closing, &mut answered, data)
            })?;
            if let Some(a) = answered.into_iter().next() {
                self.used = Instant::now();
                return Ok(a);
            }
            match received {
                (false, _) => return Err(ConnError::Closed),
                // The socket's read timeout passed with nothing.
                (true, false) => return Err(ConnError::Timeout),
                (true, true) => {}
            }
        }
    }

    /// Whether it is to be dropped: the server closes it and nothing is in flight.
    pub(crate) fn spent(&self) -> bool {
        self.closing && self.pending.is_empty()
    }

    /// Turns the socket non-blocking (after the dialer's blocking probe).
    pub(crate) fn set_nonblocking(&self) -> io::Result<()> {
        let s = self.stream.socket();
        s.set_read_timeout(None)?;
        s.set_write_timeout(None)?;
        s.set_nonblocking(true)
    }

    /// The requests still unanswered, once the connection is given up.
    pub(crate) fn into_unanswered(self) -> impl Iterator<Item = T> {
        self.pending.into_iter().map(|(t, _)| t)
    }
}

/// Frames `data` (what was read next) and pairs each answer with the oldest request. An answer
/// nobody asked for is an error at once: a server sending answers without end is not read on.
fn answers<T>(
    framer: &mut Framer,
    pending: &mut VecDeque<(T, Instant)>,
    closing: &mut bool,
    answered: &mut Vec<(T, Response)>,
    mut data: &[u8],
) -> Result<(), ConnError> {
    while let Some(r) = framer.next(&mut data)? {
        let (tag, _) = pending.pop_front().ok_or(ConnError::Unasked)?;
        *closing |= r.close;
        answered.push((tag, r));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn ok(body: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    const CHUNKED_409: &str = "HTTP/1.1 409 Conflict\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\n\r\n5\r\n{\"mes\r\n10;ext=1\r\nsage\":\"conflict\"\r\n1\r\n}\r\n0\r\nX-Trailer: y\r\n\r\n";

    /// What `parts` frame to, fed one after another, and whether the framer was left between
    /// answers; an error as its message.
    fn frame_parts<'a>(
        parts: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<(Vec<Response>, bool), String> {
        let mut f = Framer::default();
        let mut got = Vec::new();
        for mut part in parts {
            while let Some(r) = f.next(&mut part).map_err(|e| format!("{e:?}"))? {
                got.push(r);
            }
            assert!(part.is_empty(), "a part left unread");
        }
        let between = f.state == State::Head && f.line.is_empty() && f.taken == 0;
        Ok((got, between))
    }

    /// Answers the fast path meets, in a row: interim, 2xx with a length, non-2xx chunked with
    /// extensions and trailers, 204 closing.
    fn pipelined() -> Vec<u8> {
        [
            "HTTP/1.1 100 Continue\r\n\r\n".to_string(),
            ok("{\"kind\":\"Pod\"}"),
            CHUNKED_409.to_string(),
            "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n".to_string(),
        ]
        .concat()
        .into_bytes()
    }

    /// Every wire of the split tests: what it frames to in one piece.
    fn wires() -> Vec<Vec<u8>> {
        let boom = "{\"kind\":\"Status\",\"message\":\"boom\"}";
        let mut many_chunks =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n".to_vec();
        for i in 0..40 {
            many_chunks.extend_from_slice(
                format!("{:x}\r\n{}\r\n", i % 7 + 1, &"abcdefg"[..i % 7 + 1]).as_bytes(),
            );
        }
        many_chunks.extend_from_slice(b"0\r\n\r\n");
        vec![
            pipelined(),
            format!(
                "HTTP/1.1 500 Internal Server Error\r\nContent-Length: {}\r\n\r\n{boom}{}",
                boom.len(),
                ok("{}")
            )
            .into_bytes(),
            // HTTP/1.0 closes; bare `\n` line ends; a zero length.
            b"HTTP/1.0 401 Unauthorized\nContent-Length: 2\n\nnoHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec(),
            many_chunks,
            // Malformed, part of the way in: the same error wherever the cut.
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd".to_vec(),
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
            b"HTTP/1.1 200 OK\r\n\r\n{}".to_vec(),
            b"garbage\r\n\r\n".to_vec(),
        ]
    }

    /// Pipelined answers, cut anywhere: each comes out whole, once, in order.
    #[test]
    fn pipelined_answers_are_framed_whatever_the_cut() {
        let wire = pipelined();
        for cut in 0..=wire.len() {
            let (got, between) = frame_parts([&wire[..cut], &wire[cut..]]).unwrap();
            assert!(between, "cut at {cut}: an answer left half read");
            let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
            assert_eq!(statuses, [200, 409, 204], "cut at {cut}");
            assert!(got[0].body.is_empty(), "a 2xx body is not kept");
            assert_eq!(got[1].body, b"{\"message\":\"conflict\"}");
            assert_eq!(got[1].retry_after, Some(3));
            assert!(!got[1].close && got[2].close);
        }
    }

    /// Split at every byte boundary, fed a byte at a time, cut at two places: the same answers
    /// (or the same error) as the wire framed in one piece.
    #[test]
    fn a_split_frames_as_one_piece_does() {
        for wire in wires() {
            let one = frame_parts([&wire[..]]);
            let what = String::from_utf8_lossy(&wire).into_owned();
            for cut in 0..=wire.len() {
                assert_eq!(
                    frame_parts([&wire[..cut], &wire[cut..]]),
                    one,
                    "{what:?} cut at {cut}"
                );
            }
            assert_eq!(
                frame_parts(wire.chunks(1)),
                one,
                "{what:?} a byte at a time"
            );
            for a in (0..=wire.len()).step_by(3) {
                for b in (a..=wire.len()).step_by(5) {
                    let parts = [&wire[..a], &wire[a..b], &wire[b..]];
                    assert_eq!(frame_parts(parts), one, "{what:?} cut at {a} and {b}");
                }
            }
        }
        // And what that is, for the well-formed ones.
        let (got, _) = frame_parts([&wires()[2][..]]).unwrap();
        assert_eq!(
            got,
            [
                Response {
                    status: 401,
                    retry_after: None,
                    body: b"no".to_vec(),
                    close: true
                },
                Response {
                    status: 200,
                    ..Response::default()
                }
            ]
        );
        let (got, _) = frame_parts([&wires()[3][..]]).unwrap();
        assert_eq!(
            got,
            [Response {
                status: 200,
                ..Response::default()
            }]
        );
    }

    #[test]
    fn what_cannot_be_framed_is_an_error() {
        let err = |w: &[u8]| frame_parts([w]).unwrap_err();
        assert!(
            err(b"HTTP/1.1 200 OK\r\n\r\n{}").contains("NoLength"),
            "no length"
        );
        assert!(err(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").contains("NoLength"));
        assert!(
            err(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").contains("Chunk")
        );
        assert!(
            err(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd")
                .contains("Chunk")
        );
        assert!(
            err(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x\nab\r\n")
                .contains("Chunk")
        );
        assert!(err(b"garbage\r\n\r\n").contains("Head"));
        assert_eq!(
            frame_parts([&b"HTTP/1.1 200 OK\r\nContent-Len"[..]]),
            Ok((Vec::new(), false))
        );
    }

    /// `n` bytes of a chunked answer's body in chunks of `chunk`, as a server that never ends
    /// it sends them.
    fn endless_chunks(chunk: usize) -> Vec<u8> {
        let mut c = format!("{chunk:x}\r\n").into_bytes();
        c.resize(c.len() + chunk, b' ');
        c.extend_from_slice(b"\r\n");
        c
    }

    /// Feeds `head` then `piece` again and again in reads of 8 KiB until the framer refuses:
    /// the error and the bytes fed by then.
    fn feed_until_refused(head: &[u8], piece: &[u8]) -> (FrameError, usize) {
        let mut f = Framer::default();
        let mut wire = head.to_vec();
        let mut fed = 0;
        loop {
            while wire.len() < 8192 {
                wire.extend_from_slice(piece);
            }
            let mut read = &wire[..8192];
            match f.next(&mut read) {
                Ok(None) => {}
                Ok(Some(r)) => panic!("an endless answer was framed: {r:?}"),
                Err(e) => return (e, fed),
            }
            fed += 8192;
            wire.drain(..8192);
            assert!(fed <= 2 * MAX_RESPONSE_BYTES, "read on past the cap");
            assert!(
                f.line.len() <= MAX_RESPONSE_BYTES && f.answer.body.len() <= MAX_RESPONSE_BYTES
            );
        }
    }

    /// An answer that does not end (a body, a head, a line, interim answers) is refused once
    /// it went past the cap, and no later: nothing past it is looked at, what is held stays
    /// under it.
    #[test]
    fn an_endless_answer_is_refused_at_the_cap() {
        let too_large = |part| move |e: &FrameError| matches!(e, FrameError::TooLarge { part: p } if *p == part);
        let cases: [(&str, &[u8], Vec<u8>, Part); 6] = [
            (
                "endless chunked 2xx",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                endless_chunks(8000),
                Part::Body,
            ),
            (
                "endless chunked 5xx (kept)",
                b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n",
                endless_chunks(100),
                Part::Body,
            ),
            (
                "endless chunk-size line",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;",
                b"x".to_vec(),
                Part::Body,
            ),
            (
                "endless headers",
                b"HTTP/1.1 200 OK\r\n",
                b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaa\r\n".to_vec(),
                Part::Head,
            ),
            (
                "endless header line",
                b"HTTP/1.1 200 OK\r\nX-Pad: ",
                b"a".to_vec(),
                Part::Head,
            ),
            (
                "endless interim answers",
                b"",
                b"HTTP/1.1 100 Continue\r\n\r\n".to_vec(),
                Part::Head,
            ),
        ];
        for (what, head, piece, part) in cases {
            let (e, fed) = feed_until_refused(head, &piece);
            assert!(too_large(part)(&e), "{what}: {e:?}");
            // A chunk that would cross the cap is refused at its size line, its 8000 bytes
            // before.
            assert!(
                fed <= MAX_RESPONSE_BYTES && fed + 2 * 8192 > MAX_RESPONSE_BYTES,
                "{what}: refused after {fed} bytes"
            );
        }
        // A length or a chunk past the cap is refused at its head, before its body comes.
        for head in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffff\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n100000\r\n",
        ] {
            let mut read = head;
            let e = Framer::default().next(&mut read).unwrap_err();
            assert!(
                matches!(
                    e,
                    FrameError::TooLarge { part: Part::Body } | FrameError::NoLength
                ),
                "{e:?}"
            );
        }
    }

    /// The cap is on one answer, head and body: an answer of exactly the cap is read (its body
    /// kept when it is not 2xx), one byte more is not; the next answer has a cap of its own.
    #[test]
    fn an_answer_of_the_cap_is_read_one_byte_more_is_not() {
        let answer = |total: usize, status: &str| {
            let head = |n: usize| format!("HTTP/1.1 {status}\r\nContent-Length: {n:07}\r\n\r\n");
            let n = total - head(0).len();
            let mut a = head(n).into_bytes();
            a.resize(total, b'x');
            a
        };
        for status in ["200 OK", "500 Internal Server Error"] {
            let mut wire = answer(MAX_RESPONSE_BYTES, status);
            wire.extend_from_slice(&answer(MAX_RESPONSE_BYTES, status));
            let (got, between) = frame_parts(wire.chunks(1000)).unwrap();
            assert_eq!(got.len(), 2, "{status}");
            assert!(between);
            let kept = status != "200 OK";
            assert_eq!(got[1].body.len() > MAX_RESPONSE_BYTES / 2, kept, "{status}");
            let over = frame_parts(answer(MAX_RESPONSE_BYTES + 1, status).chunks(1000));
            assert!(over.unwrap_err().contains("TooLarge"), "{status}");
        }
        let mut chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        while chunked.len() + 8000 < MAX_RESPONSE_BYTES {
            chunked.extend_from_slice(&endless_chunks(4000));
        }
        let end = chunked.len();
        chunked.extend_from_slice(b"0\r\n\r\n");
        assert_eq!(frame_parts(chunked.chunks(777)).unwrap().0.len(), 1);
        chunked.truncate(end);
        chunked.extend_from_slice(&endless_chunks(MAX_RESPONSE_BYTES - end));
        assert!(frame_parts(chunked.chunks(777))
            .unwrap_err()
            .contains("TooLarge"));
    }

    /// A 1 MiB chunked answer arriving a TCP segment at a time costs about what it costs in one
    /// piece (framing it anew at each read cost its length squared).
    #[test]
    fn small_reads_cost_no_more_than_one() {
        let mut wire = b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        while wire.len() + 200 < MAX_RESPONSE_BYTES {
            wire.extend_from_slice(&endless_chunks(100));
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        let time = |parts: &mut dyn Iterator<Item = &[u8]>| {
            let start = Instant::now();
            let (got, _) = frame_parts(parts).unwrap();
            assert_eq!(got.len(), 1);
            start.elapsed()
        };
        let mut one = Duration::MAX;
        let mut small = Duration::MAX;
        for _ in 0..5 {
            one = one.min(time(&mut std::iter::once(&wire[..])));
            small = small.min(time(&mut wire.chunks(1448)));
        }
        eprintln!(
            "a {} B chunked answer: {one:?} in one piece, {small:?} in 1448 B reads",
            wire.len()
        );
        assert!(
            small < one * 8 + Duration::from_millis(20),
            "{small:?} against {one:?}"
        );
    }

    /// A server on loopback that reads `requests` requests (heads without bodies), then writes
    /// `answer` at once; then waits for the client to hang up, or hangs up itself (`close`).
    pub(crate) fn serve(
        requests: usize,
        answer: String,
        close: bool,
    ) -> (std::net::SocketAddr, std::thread::JoinHandle<String>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while got.windows(4).filter(|w| w == b"\r\n\r\n").count() < requests {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer.as_bytes()).unwrap();
            if !close {
                let _ = s.read(&mut buf);
            }
            String::from_utf8(got).unwrap()
        });
        (addr, t)
    }

    /// A hostile server on loopback: reads a request's head, writes `head`, then `piece` again
    /// and again as fast as the socket takes it, until the client hangs up. Returns what it
    /// wrote.
    fn serve_endless(
        head: &'static [u8],
        piece: Vec<u8>,
    ) -> (std::net::SocketAddr, std::thread::JoinHandle<usize>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "the client hung up before its request");
                got.extend_from_slice(&buf[..n]);
            }
            let mut sent = 0;
            if s.write_all(head).is_err() {
                return sent;
            }
            sent += head.len();
            let piece = piece.repeat(65536 / piece.len() + 1);
            while s.write_all(&piece).is_ok() {
                sent += piece.len();
            }
            sent
        });
        (addr, t)
    }

    fn connect(addr: std::net::SocketAddr) -> Conn<u32> {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        let c = Conn::new(Stream::Plain(s));
        c.set_nonblocking().unwrap();
        c
    }

    /// Waits in poll(2) for the connection to be readable, until `deadline`.
    fn wait_readable(c: &Conn<u32>, deadline: Instant) -> bool {
        let mut p = libc::pollfd {
            fd: c.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis()
            .max(1) as i32;
        // SAFETY: one valid pollfd for the duration of the call; the socket stays open.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    }

    fn template(addr: std::net::SocketAddr) -> Template {
        Template {
            prefix: String::new(),
            host: addr.to_string(),
            headers: Vec::new(),
        }
    }

    /// Three requests written one after the other without waiting (the server sees all three
    /// before it answers any), answered in order; then the server hangs up.
    #[test]
    fn pipelined_requests_are_answered_in_order_on_a_socket() {
        let boom = "{\"message\":\"boom\"}";
        let answer = [
            ok("{}"),
            format!(
                "HTTP/1.1 500 Internal Server Error\r\nContent-Length: {}\r\n\r\n{boom}",
                boom.len()
            ),
            ok("{\"kind\":\"Pod\"}"),
        ]
        .concat();
        let (addr, server) = serve(3, answer, true);
        let mut c = connect(addr);
        let t = template(addr);
        for tag in 1..=3 {
            let r = t.request("GET", &format!("/r{tag}"), "", b"");
            c.send(tag, &r, Duration::from_secs(10)).unwrap();
        }
        assert_eq!(c.in_flight(), 3);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        let mut failed = None;
        while failed.is_none() && wait_readable(&c, deadline) {
            let (answered, f) = c.ready(true, false, Instant::now());
            got.extend(answered.into_iter().map(|(t, r)| (t, r.status, r.body)));
            failed = f;
        }
        assert_eq!(
            got,
            vec![
                (1, 200, Vec::new()),
                (2, 500, b"{\"message\":\"boom\"}".to_vec()),
                (3, 200, Vec::new())
            ]
        );
        assert!(matches!(failed, Some(ConnError::Closed)), "{failed:?}");
        assert_eq!(c.into_unanswered().count(), 0);
        let seen = server.join().unwrap();
        assert_eq!(seen.matches("GET /r").count(), 3, "{seen}");
    }

    /// A server answering without end (a chunked body, a body of a huge length, a head): the
    /// connection is given up once the answer went past the cap, well within the request's
    /// timeout; no call to `ready` holds the thread long, and the request is handed back.
    #[test]
    fn an_endless_answer_on_a_socket_gives_the_connection_up() {
        let cases: [(&str, &'static [u8], Vec<u8>, Part); 3] = [
            (
                "endless chunked body",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                endless_chunks(8000),
                Part::Body,
            ),
            (
                "huge Content-Length",
                b"HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n",
                vec![b' '; 4096],
                Part::Body,
            ),
            (
                "endless head",
                b"HTTP/1.1 200 OK\r\n",
                b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaa\r\n".to_vec(),
                Part::Head,
            ),
        ];
        for (what, head, piece, part) in cases {
            let (addr, server) = serve_endless(head, piece);
            let mut c = connect(addr);
            let timeout = Duration::from_secs(30);
            c.send(
                7,
                &template(addr).request("GET", "/version", "", b""),
                timeout,
            )
            .unwrap();
            let start = Instant::now();
            let mut longest = Duration::ZERO;
            let mut failed = None;
            while failed.is_none() && wait_readable(&c, start + timeout) {
                let turn = Instant::now();
                let (answered, f) = c.ready(true, false, Instant::now());
                longest = longest.max(turn.elapsed());
                assert!(answered.is_empty(), "{what}: an endless answer was framed");
                failed = f;
            }
            let took = start.elapsed();
            let failed = failed.unwrap_or_else(|| panic!("{what}: never given up"));
            assert_eq!(failed.too_large(), Some(part), "{what}: {failed}");
            assert_eq!(c.into_unanswered().collect::<Vec<_>>(), vec![7], "{what}");
            // Dropped: the server's writes fail.
            let sent = server.join().unwrap();
            eprintln!("{what}: given up after {took:?} (the longest turn {longest:?}); the server wrote {sent} B");
            assert!(took < Duration::from_secs(5), "{what}: {took:?}");
            assert!(
                longest < Duration::from_secs(1),
                "{what}: a turn took {longest:?}"
            );
        }
    }

    /// A server that does not answer: the request's deadline gives the connection up, and the
    /// request is handed back unanswered.
    #[test]
    fn an_unanswered_request_times_out_and_is_handed_back() {
        let (addr, server) = serve(1, String::new(), false);
        let mut c = connect(addr);
        c.send(
            7,
            &template(addr).request("GET", "/version", "", b""),
            Duration::from_millis(200),
        )
        .unwrap();
        let due = c.due().expect("a deadline");
        let (answered, f) = c.ready(false, false, Instant::now());
        assert!(answered.is_empty() && f.is_none(), "not due yet");
        assert!(!wait_readable(&c, due), "nothing answered");
        let (answered, f) = c.ready(false, false, Instant::now().max(due));
        assert!(answered.is_empty());
        assert!(matches!(f, Some(ConnError::Timeout)), "{f:?}");
        assert_eq!(c.into_unanswered().collect::<Vec<_>>(), vec![7]);
        server.join().unwrap();
    }

    #[test]
    fn a_request_carries_the_template() {
        let t = Template {
            prefix: "/k8s".into(),
            host: "10.0.0.1:6443".into(),
            headers: b"authorization: Bearer x\r\n".to_vec(),
        };
        let r = t.request("PATCH", "/api/v1/x", "application/merge-patch+json", b"{}");
        let r = String::from_utf8(r).unwrap();
        assert!(
            r.starts_with("PATCH /k8s/api/v1/x HTTP/1.1\r\nHost: 10.0.0.1:6443\r\n"),
            "{r}"
        );
        assert!(r.contains("\r\nauthorization: Bearer x\r\n"), "{r}");
        assert!(r.ends_with("Content-Length: 2\r\n\r\n{}"), "{r}");
        let g = String::from_utf8(t.request("GET", "/version", "", b"")).unwrap();
        assert!(
            !g.contains("Content-Length") && g.ends_with("\r\n\r\n"),
            "{g}"
        ); // In parts, appended to what the buffer holds: the same bytes.
        let mut out = b"held".to_vec();
        t.request_into(
            &mut out,
            "PATCH",
            &["/api/", "v1/x"],
            "application/merge-patch+json",
            &[b"{", b"", b"}"],
        );
        assert_eq!(out[4..], *r.as_bytes());
        assert_eq!(&out[..4], b"held");
    }
}
