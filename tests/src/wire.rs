//! When a request went on the wire, as the kernel saw it: a server-side TCP stream whose reads
//! carry the kernel's receive timestamp (`SO_TIMESTAMPNS`). On loopback the timestamp is taken
//! inside the sender's `send(2)` (the segment is delivered in the sender's context), so it is the
//! moment the client's request left, whatever the receiving process's own scheduling delay: what
//! the api_path bench reports as "PATCH on the wire" without instrumenting the agent.
//!
//! The kernel turns receive timestamping on lazily: the first `SO_TIMESTAMPNS` socket of a quiet
//! machine only schedules the switch (a static key flipped from a workqueue), and TCP segments
//! that pass before it runs carry no timestamp at all. [`stamping_on`] waits for the switch once
//! per process and keeps one stamped socket open so it never flips back.
use std::{
    io,
    io::Write,
    os::fd::{AsRawFd, RawFd},
    pin::Pin,
    sync::{Arc, Mutex, OnceLock},
    task::{ready, Context, Poll},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use nix::sys::socket::{
    recvmsg, setsockopt, sockopt::ReceiveTimestampns, ControlMessageOwned, MsgFlags,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, Interest, ReadBuf},
    net::TcpStream,
};

/// The kernel's timestamp of the first bytes of the request being read on a connection.
#[derive(Clone, Debug, Default)]
pub struct WireClock(Arc<Mutex<Slot>>);

#[derive(Debug)]
struct Slot {
    /// The next bytes read start a request (set again when a response is written: HTTP/1.1
    /// requests on one connection are sequential).
    armed: bool,
    first: Option<SystemTime>,
}

impl Default for Slot {
    fn default() -> Self {
        Self {
            armed: true,
            first: None,
        }
    }
}

impl WireClock {
    /// The current request's wire time (once: the handler takes it).
    pub fn take(&self) -> Option<SystemTime> {
        self.0.lock().expect("wire clock").first.take()
    }

    fn read(&self, at: Option<SystemTime>) {
        let mut s = self.0.lock().expect("wire clock");
        if s.armed {
            s.armed = false;
            s.first = at;
        }
    }

    fn wrote(&self) {
        self.0.lock().expect("wire clock").armed = true;
    }
}

/// An accepted connection with kernel receive timestamps on.
pub struct WireStamped {
    inner: TcpStream,
    clock: WireClock,
}

/// Receives into `buf`, with the kernel's timestamp of the data when it carries one.
fn recv_stamped(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<SystemTime>)> {
    let mut iov = [io::IoSliceMut::new(buf)];
    let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec);
    let msg = recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::empty())?;
    let at = msg.cmsgs()?.find_map(|c| match c {
        ControlMessageOwned::ScmTimestampns(t) => Some(
            UNIX_EPOCH
                + Duration::new(
                    u64::try_from(t.tv_sec()).unwrap_or(0),
                    u32::try_from(t.tv_nsec()).unwrap_or(0),
                ),
        ),
        _ => None,
    });
    Ok((msg.bytes, at))
}

/// Returns once loopback TCP segments are timestamped (see the module's note). A byte is sent
/// over a stamped loopback connection until one comes back with a stamp; that connection then
/// lives as long as the process, holding the kernel's switch on.
pub fn stamping_on() -> io::Result<()> {
    static ON: OnceLock<Result<(std::net::TcpStream, std::net::TcpStream), String>> =
        OnceLock::new();
    let warm = || -> io::Result<(std::net::TcpStream, std::net::TcpStream)> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let mut tx = std::net::TcpStream::connect(listener.local_addr()?)?;
        let (rx, _) = listener.accept()?;
        setsockopt(&rx, ReceiveTimestampns, &true)?;
        rx.set_read_timeout(Some(Duration::from_secs(1)))?;
        let mut failed = None;
        let stamped = crate::wait::poll_until(Duration::from_secs(5), || {
            let sent = tx.write_all(b"x");
            match sent.and_then(|()| recv_stamped(rx.as_raw_fd(), &mut [0u8; 64])) {
                Ok((_, at)) => at.map(|_| ()),
                Err(e) => {
                    failed = Some(e);
                    Some(())
                }
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        stamped.ok_or_else(|| {
            io::Error::other(
                "the kernel did not timestamp loopback TCP within 5 s of SO_TIMESTAMPNS",
            )
        })?;
        Ok((tx, rx))
    };
    match ON.get_or_init(|| warm().map_err(|e| e.to_string())) {
        Ok(_) => Ok(()),
        Err(e) => Err(io::Error::other(e.clone())),
    }
}

impl WireStamped {
    pub fn new(inner: TcpStream) -> io::Result<(Self, WireClock)> {
        stamping_on()?;
        setsockopt(&inner, ReceiveTimestampns, &true)?;
        let clock = WireClock::default();
        Ok((
            Self {
                inner,
                clock: clock.clone(),
            },
            clock,
        ))
    }
}

impl AsyncRead for WireStamped {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            ready!(this.inner.poll_read_ready(cx))?;
            let fd = this.inner.as_raw_fd();
            let unfilled = buf.initialize_unfilled();
            let got = this
                .inner
                .try_io(Interest::READABLE, || recv_stamped(fd, unfilled));
            match got {
                Ok((n, at)) => {
                    if n > 0 {
                        this.clock.read(at);
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for WireStamped {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.clock.wrote();
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.clock.wrote();
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The timestamp is the sender's, not the reader's: a read made 50 ms after the write still
    /// carries a time within the write call.
    #[tokio::test]
    async fn the_stamp_is_when_the_bytes_were_sent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (mut server, clock) = WireStamped::new(server).unwrap();
        let before = SystemTime::now();
        client.write_all(b"PATCH /x HTTP/1.1\r\n").await.unwrap();
        let after = SystemTime::now();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut buf = [0u8; 64];
        let n = server.read(&mut buf).await.unwrap();
        assert!(n > 0);
        let at = clock.take().expect("a kernel timestamp");
        assert!(
            at >= before && at <= after,
            "{at:?} not within the write ({before:?}..{after:?})"
        );
        // Taken once; the next request's stamp comes after a response is written.
        assert!(clock.take().is_none());
        server.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        client.write_all(b"GET /y HTTP/1.1\r\n").await.unwrap();
        let _ = server.read(&mut buf).await.unwrap();
        assert!(clock.take().is_some());
    }
}
