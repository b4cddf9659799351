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
//! responses are parsed with `httparse`, and TLS is rustls with kube's own configuration.
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

    /// Appends what arrived to `into`: all of it on a non-blocking socket, the first read's on
    /// a blocking one (`once`). Says whether the connection is still open, and whether the
    /// socket gave anything (a blocking socket's read timeout passed when it did not).
    fn receive(&mut self, into: &mut Vec<u8>, once: bool) -> io::Result<(bool, bool)> {
        let mut buf = [0u8; 8192];
        let mut got = false;
        match self {
            Stream::Plain(s) => loop {
                match s.read(&mut buf) {
                    Ok(0) => return Ok((false, true)),
                    Ok(n) => {
                        got = true;
                        into.extend_from_slice(&buf[..n]);
                        if once {
                            return Ok((true, got));
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok((true, got)),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
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
                        Err(e) => return Err(e),
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
                            Ok(n) => into.extend_from_slice(&buf[..n]),
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                            // Closed without close_notify.
                            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                                open = false;
                                break;
                            }
                            Err(e) => return Err(e),
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

/// One response, framed.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Seconds, as `Retry-After` gave them.
    pub retry_after: Option<u64>,
    /// Kept only for an answer other than 2xx (what the API said is wrong).
    pub body: Vec<u8>,
    /// The server closes the connection after it.
    pub close: bool,
}

/// A response that is not HTTP/1.1 the fast path can read: the connection is given up.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("malformed HTTP response: {0}")]
    Head(#[from] httparse::Error),
    #[error("malformed chunk in an HTTP response")]
    Chunk,
    #[error("HTTP response body without a length")]
    NoLength,
}

/// The first complete response in `buf` and its length in bytes; `None` while incomplete.
/// Informational (1xx) answers are skipped.
pub(crate) fn frame(buf: &[u8]) -> Result<Option<(Response, usize)>, FrameError> {
    let mut at = 0;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut headers);
        let httparse::Status::Complete(head) = r.parse(&buf[at..])? else {
            return Ok(None);
        };
        let status = r.code.unwrap_or(0);
        if (100..200).contains(&status) {
            at += head;
            continue;
        }
        let (mut length, mut chunked, mut close, mut retry_after) = (None, false, false, None);
        for h in r.headers.iter() {
            let v = std::str::from_utf8(h.value).unwrap_or("").trim();
            if h.name.eq_ignore_ascii_case("content-length") {
                length = Some(v.parse::<usize>().map_err(|_| FrameError::NoLength)?);
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
        let keep = !(200..300).contains(&status);
        let start = at + head;
        let no_body = status == 204 || status == 304;
        let (body, end) = if no_body {
            (Vec::new(), start)
        } else if chunked {
            match dechunk(&buf[start..], keep)? {
                Some((body, n)) => (body, start + n),
                None => return Ok(None),
            }
        } else if let Some(n) = length {
            if buf.len() < start + n {
                return Ok(None);
            }
            let body = if keep {
                buf[start..start + n].to_vec()
            } else {
                Vec::new()
            };
            (body, start + n)
        } else {
            // Only the connection's end would say where it ends.
            return Err(FrameError::NoLength);
        };
        return Ok(Some((
            Response {
                status,
                retry_after,
                body,
                close,
            },
            end,
        )));
    }
}

/// A chunked body at the start of `buf`: its bytes (when `keep`) and its length on the wire.
fn dechunk(buf: &[u8], keep: bool) -> Result<Option<(Vec<u8>, usize)>, FrameError> {
    let mut at = 0;
    let mut body = Vec::new();
    loop {
        let (head, size) = match httparse::parse_chunk_size(&buf[at..]) {
            Ok(httparse::Status::Complete(c)) => c,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(FrameError::Chunk),
        };
        let size = usize::try_from(size).map_err(|_| FrameError::Chunk)?;
        at += head;
        if size == 0 {
            // Trailers, if any, then the empty line.
            loop {
                let Some(eol) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
                    return Ok(None);
                };
                at += eol + 2;
                if eol == 0 {
                    return Ok(Some((body, at)));
                }
            }
        }
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        if keep {
            body.extend_from_slice(&buf[at..at + size]);
        }
        if &buf[at + size..at + size + 2] != b"\r\n" {
            return Err(FrameError::Chunk);
        }
        at += size + 2;
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

/// A connection with its requests in flight, oldest first (`T` says what each was for).
pub struct Conn<T> {
    stream: Stream,
    out: Vec<u8>,
    inbuf: Vec<u8>,
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
            inbuf: Vec::new(),
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
            let open = match self.stream.receive(&mut self.inbuf, false) {
                Ok((open, _)) => open,
                Err(e) => return (answered, Some(e.into())),
            };
            if let Err(e) = self.answers(&mut answered) {
                return (answered, Some(e));
            }
            if !open {
                return (answered, Some(ConnError::Closed));
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
            self.answers(&mut answered)?;
            if let Some(a) = answered.into_iter().next() {
                return Ok(a);
            }
            match self.stream.receive(&mut self.inbuf, true)? {
                (false, _) => return Err(ConnError::Closed),
                // The socket's read timeout passed with nothing.
                (true, false) => return Err(ConnError::Timeout),
                (true, true) => {}
            }
        }
    }

    fn answers(&mut self, answered: &mut Vec<(T, Response)>) -> Result<(), ConnError> {
        let mut used = 0;
        while let Some((r, n)) = frame(&self.inbuf[used..])? {
            used += n;
            let (tag, _) = self.pending.pop_front().ok_or(ConnError::Unasked)?;
            self.closing |= r.close;
            answered.push((tag, r));
        }
        if used > 0 {
            self.inbuf.drain(..used);
            self.used = Instant::now();
        }
        Ok(())
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn ok(body: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    /// Pipelined answers, cut anywhere: each comes out whole, once, in order.
    #[test]
    fn pipelined_answers_are_framed_whatever_the_cut() {
        let chunked = "HTTP/1.1 409 Conflict\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\n\r\n5\r\n{\"mes\r\n10;ext=1\r\nsage\":\"conflict\"\r\n1\r\n}\r\n0\r\nX-Trailer: y\r\n\r\n";
        let wire = [
            "HTTP/1.1 100 Continue\r\n\r\n".to_string(),
            ok("{\"kind\":\"Pod\"}"),
            chunked.to_string(),
            "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n".to_string(),
        ]
        .concat();
        let wire = wire.as_bytes();
        for cut in 0..wire.len() {
            let mut buf = Vec::new();
            let mut got = Vec::new();
            for part in [&wire[..cut], &wire[cut..]] {
                buf.extend_from_slice(part);
                while let Some((r, n)) = frame(&buf).unwrap() {
                    buf.drain(..n);
                    got.push(r);
                }
            }
            assert!(buf.is_empty(), "cut at {cut}: {:?} left", buf.len());
            let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
            assert_eq!(statuses, [200, 409, 204], "cut at {cut}");
            assert!(got[0].body.is_empty(), "a 2xx body is not kept");
            assert_eq!(got[1].body, b"{\"message\":\"conflict\"}");
            assert_eq!(got[1].retry_after, Some(3));
            assert!(!got[1].close && got[2].close);
        }
    }

    #[test]
    fn what_cannot_be_framed_is_an_error() {
        assert!(frame(b"HTTP/1.1 200 OK\r\n\r\n{}").is_err(), "no length");
        assert!(frame(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
        assert!(frame(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err());
        assert!(frame(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd").is_err());
        assert!(frame(b"garbage\r\n\r\n").is_err());
        assert!(frame(b"HTTP/1.1 200 OK\r\nContent-Len").unwrap().is_none());
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
        let t = Template {
            prefix: String::new(),
            host: addr.to_string(),
            headers: Vec::new(),
        };
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

    /// A server that does not answer: the request's deadline gives the connection up, and the
    /// request is handed back unanswered.
    #[test]
    fn an_unanswered_request_times_out_and_is_handed_back() {
        let (addr, server) = serve(1, String::new(), false);
        let mut c = connect(addr);
        let t = Template {
            prefix: String::new(),
            host: addr.to_string(),
            headers: Vec::new(),
        };
        c.send(
            7,
            &t.request("GET", "/version", "", b""),
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
