//! Where the runtime listens, and a gRPC channel over its unix socket.
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::CriError;

/// containerd's default CRI socket.
pub(crate) const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// CRI-O's default CRI socket.
pub(crate) const CRIO_SOCKET: &str = "/var/run/crio/crio.sock";

/// A CRI runtime endpoint: a unix socket path. Parsed from `/path` or `unix:///path`, the two
/// spellings kubelet's `--container-runtime-endpoint` accepts for unix sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriEndpoint {
    path: PathBuf,
}

impl CriEndpoint {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        CriEndpoint { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The first of the well-known sockets (containerd, then CRI-O) that exists; containerd's when
    /// none does, so the error names the most likely one.
    pub fn detect() -> Self {
        [CONTAINERD_SOCKET, CRIO_SOCKET]
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
            .map(CriEndpoint::new)
            .unwrap_or_default()
    }
}

impl Default for CriEndpoint {
    fn default() -> Self {
        CriEndpoint::new(CONTAINERD_SOCKET)
    }
}

impl std::fmt::Display for CriEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

impl FromStr for CriEndpoint {
    type Err = CriError;

    fn from_str(s: &str) -> Result<Self, CriError> {
        let invalid = |reason| CriError::InvalidEndpoint {
            endpoint: s.to_string(),
            reason,
        };
        let path = match s.split_once("://") {
            None => s,
            Some(("unix", rest)) => rest,
            Some(_) => return Err(invalid("only unix sockets are supported")),
        };
        if path.is_empty() {
            return Err(invalid("empty path"));
        }
        if !path.starts_with('/') {
            return Err(invalid("the socket path must be absolute"));
        }
        Ok(CriEndpoint::new(path))
    }
}

/// Connects a gRPC channel to the unix socket at `path`.
///
/// The channel makes exactly one connection: if it breaks, calls on this channel fail instead of
/// tonic silently dialing again, so a runtime restart is always seen by whoever owns the channel
/// (see [`super::ReconnectingCri`]). `on_close`, if given, runs once when the connection ends
/// (the runtime closed the socket, or the channel was dropped).
pub(crate) async fn unix_channel(
    path: &Path,
    connect_timeout: Duration,
    on_close: Option<Box<dyn FnOnce() + Send + Sync>>,
) -> Result<Channel, CriError> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(path) {
        Err(_) => {
            return Err(CriError::SocketMissing {
                path: path.to_path_buf(),
            })
        }
        Ok(m) if !m.file_type().is_socket() => {
            return Err(CriError::NotASocket {
                path: path.to_path_buf(),
            })
        }
        Ok(_) => {}
    }
    let used = Arc::new(AtomicBool::new(false));
    let on_close = Arc::new(std::sync::Mutex::new(on_close));
    let socket = path.to_path_buf();
    let connector = tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        let used = used.clone();
        let on_close = on_close.clone();
        async move {
            if used.swap(true, Ordering::SeqCst) {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "CRI connection was closed; reconnect with a new channel",
                ));
            }
            let stream = UnixStream::connect(&socket).await?;
            let on_close = crate::sync::lock(&on_close).take();
            Ok::<_, io::Error>(TokioIo::new(TrackedStream::new(stream, on_close)))
        }
    });
    // The URI is required by tonic but unused: the connector decides where to connect.
    Endpoint::from_static("http://localhost")
        .connect_timeout(connect_timeout)
        .connect_with_connector(connector)
        .await
        .map_err(|source| CriError::Connect {
            path: path.to_path_buf(),
            source,
        })
}

/// A unix stream that reports its end: at EOF, on an I/O error, or when dropped, whichever
/// comes first. hyper reads continuously, so a runtime that exits is noticed at once.
struct TrackedStream {
    inner: UnixStream,
    on_close: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl TrackedStream {
    fn new(inner: UnixStream, on_close: Option<Box<dyn FnOnce() + Send + Sync>>) -> Self {
        TrackedStream { inner, on_close }
    }

    fn closed(&mut self) {
        if let Some(f) = self.on_close.take() {
            f();
        }
    }
}

impl Drop for TrackedStream {
    fn drop(&mut self) {
        self.closed();
    }
}

impl AsyncRead for TrackedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &res {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                self.closed()
            }
            Poll::Ready(Err(_)) => self.closed(),
            _ => {}
        }
        res
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Err(_)) = &res {
            self.closed();
        }
        res
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Err(_)) = &res {
            self.closed();
        }
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn parses_paths_and_unix_urls() {
        let e: CriEndpoint = "/run/containerd/containerd.sock".parse().unwrap();
        assert_eq!(e.path(), Path::new(CONTAINERD_SOCKET));
        let e: CriEndpoint = "unix:///var/run/crio/crio.sock".parse().unwrap();
        assert_eq!(e.path(), Path::new(CRIO_SOCKET));
        assert_eq!(e.to_string(), "unix:///var/run/crio/crio.sock");
        assert_eq!(CriEndpoint::default().path(), Path::new(CONTAINERD_SOCKET));
    }

    #[test]
    fn rejects_other_schemes_and_relative_paths() {
        for bad in [
            "tcp://127.0.0.1:1234",
            "npipe:////./pipe/x",
            "unix://",
            "",
            "run/x.sock",
            "unix://relative.sock",
        ] {
            let err = bad.parse::<CriEndpoint>().unwrap_err();
            assert!(
                matches!(err, CriError::InvalidEndpoint { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[tokio::test]
    async fn missing_socket_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = unix_channel(&dir.path().join("nope.sock"), Duration::from_secs(1), None)
            .await
            .unwrap_err();
        assert!(matches!(err, CriError::SocketMissing { .. }), "{err}");
    }

    #[tokio::test]
    async fn refused_socket_is_a_connect_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dead.sock");
        // A socket file nobody listens on: what a crashed runtime leaves behind.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let err = unix_channel(&path, Duration::from_secs(1), None)
            .await
            .unwrap_err();
        assert!(matches!(err, CriError::Connect { .. }), "{err}");
        // The report names the OS error, not only tonic's "transport error".
        let chain = err.chain();
        assert!(chain.starts_with("connecting to CRI socket"), "{chain}");
        assert!(chain.contains("refused"), "{chain}");
    }

    #[tokio::test]
    async fn tracked_stream_reports_peer_close_once() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let mut t = TrackedStream::new(
            a,
            Some(Box::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
            })),
        );
        b.write_all(b"x").await.unwrap();
        drop(b);
        let mut buf = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut t, &mut buf)
            .await
            .unwrap();
        assert_eq!(buf, b"x");
        assert_eq!(count.load(Ordering::SeqCst), 1, "EOF reported");
        drop(t);
        assert_eq!(count.load(Ordering::SeqCst), 1, "reported only once");
    }
}
