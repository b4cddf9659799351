//! The fast path's connections, opened at normal priority: TCP, TLS and a `GET /version` that
//! proves the credentials, on a blocking thread of the agent's runtime, then handed to the
//! kernel reader's thread, which only ever writes and reads them without blocking
//! ([`super::wire`]). A hung or unreachable API server stalls the dialer, never the reader.
//!
//! Everything the connection carries comes from kube's configuration, as kube's client would
//! use it: the server and its TLS (kube's rustls configuration: CA, client certificate,
//! `tls-server-name`), and the request headers its layers add (credentials, refreshed by kube
//! where they expire; impersonation; the config's own headers), taken by running those layers
//! on a request and read off it (`capture`). They are taken again every `REFRESH` (a minute) and
//! handed over when they changed.
use std::{
    net::{TcpStream, ToSocketAddrs},
    sync::{
        atomic::{AtomicU8, AtomicUsize, Ordering},
        mpsc, Arc,
    },
    time::Duration,
};

use ::kube::client::{Body, ConfigExt};
use rustls::{pki_types::ServerName, ClientConfig, ClientConnection};
use tower::{BoxError, ServiceBuilder, ServiceExt};

use super::{
    wire::{Conn, ConnError, Part, Stream, Template, MAX_RESPONSE_BYTES},
    Tag,
};
use crate::kube::transport::api_message;
use crate::sync::{Bell, BellWaiter};

/// Connections the reader holds: a death goes out on the one with the fewest requests in flight,
/// and one lost leaves the others. The API server works on one request of an HTTP/1.1
/// connection at a time: in a burst, the connections are how many it serves at once.
pub(crate) const CONNECTIONS: usize = 4;
/// How often an unreachable API server is tried again.
const RETRY: Duration = Duration::from_secs(1);
/// How often the configuration is read again and the credentials taken again from kube's layers:
/// a projected service account token is rotated hourly (kube re-reads it when it nears expiry),
/// a kubeconfig's client certificate or CA file may be replaced on disk. A 401 answer asks for it
/// at once.
const REFRESH: Duration = Duration::from_secs(60);

/// What the dialer hands to the reader's thread.
pub enum Handed {
    /// A connection, proven, with the headers of the moment.
    Conn(Conn<Tag>, Arc<Template>),
    /// The headers changed (refreshed credentials).
    Template(Arc<Template>),
}

#[derive(Default)]
struct Shared {
    /// Connections handed over and not given up yet.
    held: AtomicUsize,
    /// The API server answered 401: the credentials are read again before the next dial.
    refused: std::sync::atomic::AtomicBool,
    /// A connection was dropped for an answer past the cap ([`TOO_LARGE_HEAD`] or
    /// [`TOO_LARGE_BODY`]): said by the dialer, at normal priority (the reader's thread never
    /// logs above debug).
    too_large: AtomicU8,
}

const TOO_LARGE_HEAD: u8 = 1;
const TOO_LARGE_BODY: u8 = 2;

/// The reader's end: connections as they are opened.
pub struct Dialed {
    rx: mpsc::Receiver<Handed>,
    shared: Arc<Shared>,
    /// Rung from the reader's thread: no lock a normal-priority thread holds.
    wanted: Bell,
}

impl Dialed {
    /// What was handed over since the last call; never blocks.
    pub fn take(&self) -> Option<Handed> {
        self.rx.try_recv().ok()
    }

    /// The API server refused the credentials (401): the dialer reads the configuration again
    /// and hands over the new headers (a rotated token, certificate or CA). No lock is taken.
    pub fn credentials_refused(&self) {
        self.shared.refused.store(true, Ordering::Relaxed);
        self.wanted.ring();
    }

    /// A connection was given up (`why`): the dialer opens another.
    pub fn lost(&self, why: &ConnError) {
        if let Some(part) = why.too_large() {
            let code = match part {
                Part::Head => TOO_LARGE_HEAD,
                Part::Body => TOO_LARGE_BODY,
            };
            self.shared.too_large.store(code, Ordering::Relaxed);
        }
        self.shared.held.fetch_sub(1, Ordering::Relaxed);
        self.wanted.ring();
    }
}

/// Opens connections while the reader holds fewer than [`CONNECTIONS`].
pub struct Dialer {
    kubeconfig: Option<std::ffi::OsString>,
    timeout: Duration,
    tx: mpsc::Sender<Handed>,
    shared: Arc<Shared>,
    wanted: BellWaiter,
}

#[cfg(test)]
impl Dialer {
    /// Hands a connection over as if dialed (tests: a loopback server, no kube configuration).
    pub(crate) fn hand(&self, conn: Conn<Tag>, template: Template) {
        self.shared.held.fetch_add(1, Ordering::Relaxed);
        let _ = self.tx.send(Handed::Conn(conn, Arc::new(template)));
    }
}

/// The dialer and the reader's end of what it opens. Fails only when the process is out of file
/// descriptors (the wake-up is a socket pair).
pub fn pair(
    kubeconfig: Option<std::ffi::OsString>,
    timeout: Duration,
) -> std::io::Result<(Dialer, Dialed)> {
    let (tx, rx) = mpsc::channel();
    let shared = Arc::new(Shared::default());
    let (bell, waiter) = crate::sync::bell()?;
    Ok((
        Dialer {
            kubeconfig,
            timeout,
            tx,
            shared: Arc::clone(&shared),
            wanted: waiter,
        },
        Dialed {
            rx,
            shared,
            wanted: bell,
        },
    ))
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    #[error("{host}:{port} cannot be resolved or reached: {source}")]
    Connect {
        host: String,
        port: u16,
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error(transparent)]
    Conn(#[from] ConnError),
    #[error("GET /version answered {status}: {message} (check the agent's credentials)")]
    Answer { status: u16, message: String },
    #[error("the dialing thread failed: {0}")]
    Join(String),
}

/// Where connections go, from kube's configuration.
struct Target {
    host: String,
    port: u16,
    tls: Option<(Arc<ClientConfig>, ServerName<'static>)>,
}

impl Target {
    fn new(config: &::kube::Config) -> Result<Self, String> {
        let url = &config.cluster_url;
        let https = match url.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            other => {
                return Err(format!(
                    "cluster URL {url}: scheme {other:?} is not http(s)"
                ))
            }
        };
        let host = url
            .host()
            .ok_or_else(|| format!("cluster URL {url} has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            let mut c = config.rustls_client_config().map_err(|e| e.to_string())?;
            c.alpn_protocols = vec![b"http/1.1".to_vec()];
            let name = config
                .tls_server_name
                .clone()
                .unwrap_or_else(|| host.clone());
            let name = ServerName::try_from(name)
                .map_err(|e| format!("TLS server name: {e}"))?
                .to_owned();
            Some((Arc::new(c), name))
        } else {
            None
        };
        Ok(Self { host, port, tls })
    }
}

impl Dialer {
    /// Until the reader's end is dropped.
    pub async fn run(mut self) {
        let mut config = match crate::kube::config(self.kubeconfig.as_deref(), false).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("the fast status path has no API configuration ({e}): deaths reach the API through the status manager only");
                return;
            }
        };
        if config.proxy_url.is_some() {
            tracing::warn!("the fast status path does not go through the configured proxy: deaths reach the API through the status manager only");
            return;
        }
        let mut target = match Target::new(&config) {
            Ok(t) => Arc::new(t),
            Err(e) => {
                tracing::warn!("the fast status path cannot use the API server's address ({e}): deaths reach the API through the status manager only");
                return;
            }
        };
        let mut template: Option<Arc<Template>> = None;
        let mut taken = tokio::time::Instant::now();
        let mut failures = 0u64;
        let mut reload_failed = false;
        let mut said_too_large = false;
        // The last capture failed: taken again at the next turn, not at the next refresh.
        let mut stale = false;
        loop {
            let too_large = self.shared.too_large.swap(0, Ordering::Relaxed);
            if too_large != 0 && !std::mem::replace(&mut said_too_large, true) {
                let part = if too_large == TOO_LARGE_HEAD {
                    "head"
                } else {
                    "body"
                };
                tracing::warn!("the API server answered the fast status path with a response whose {part} went past {MAX_RESPONSE_BYTES} bytes: the connection was dropped and its deaths left to the status manager (said once; counted in observer_fast_path_responses_too_large_total; check what answers for the API server)");
            }
            let refused = self.shared.refused.swap(false, Ordering::Relaxed);
            if refused || taken.elapsed() >= REFRESH {
                if refused {
                    tracing::info!("the API server refused the fast status path's credentials (401): the configuration, its token and certificates are read again");
                }
                match self.reload().await {
                    Ok((c, t)) => {
                        (config, target) = (c, Arc::new(t));
                        reload_failed = false;
                    }
                    Err(e) if !reload_failed => {
                        tracing::warn!("the fast status path's configuration cannot be read again ({e}): it goes on with the one it has");
                        reload_failed = true;
                    }
                    Err(_) => {}
                }
            }
            if template.is_none() || refused || stale || taken.elapsed() >= REFRESH {
                match capture(&config).await {
                    Ok(t) => {
                        taken = tokio::time::Instant::now();
                        stale = false;
                        if template.as_deref() != Some(&t) {
                            let t = Arc::new(t);
                            if template.is_some()
                                && self.tx.send(Handed::Template(Arc::clone(&t))).is_err()
                            {
                                return;
                            }
                            template = Some(t);
                        }
                    }
                    Err(e) => {
                        if failures == 0 {
                            tracing::warn!("the fast status path has no credentials ({e}); deaths go through the status manager until it has (retried every second)");
                        }
                        failures += 1;
                        stale = true;
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                }
            }
            let Some(tpl) = template.clone() else {
                continue;
            };
            if self.shared.held.load(Ordering::Relaxed) < CONNECTIONS {
                let (t, timeout, tpl2) = (Arc::clone(&target), self.timeout, Arc::clone(&tpl));
                let dialed = tokio::task::spawn_blocking(move || dial(&t, &tpl2, timeout))
                    .await
                    .unwrap_or_else(|e| Err(DialError::Join(e.to_string())));
                match dialed {
                    Ok(conn) => {
                        if failures > 0 {
                            tracing::info!("the fast status path reached the API server: deaths are written from the kernel reader's thread from now on");
                        }
                        failures = 0;
                        self.shared.held.fetch_add(1, Ordering::Relaxed);
                        if self.tx.send(Handed::Conn(conn, tpl)).is_err() {
                            return;
                        }
                    }
                    // Said once: until the API answers, every death still reaches it through
                    // the status manager, only later.
                    Err(e) => {
                        if failures == 0 {
                            tracing::warn!("the fast status path cannot reach the API server ({e}); deaths go through the status manager until it answers (retried every second; check the API server and the agent's network path to it)");
                        } else {
                            tracing::debug!("fast status path: {e}");
                        }
                        failures += 1;
                        tokio::time::sleep(RETRY).await;
                    }
                }
                continue;
            }
            // Armed, then looked at again: a connection lost in between rang.
            self.wanted.arm();
            if self.shared.held.load(Ordering::Relaxed) < CONNECTIONS {
                continue;
            }
            let wait = REFRESH.saturating_sub(taken.elapsed());
            tokio::select! {
                _ = self.wanted.wait() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

impl Dialer {
    /// The configuration read again, and where connections go with it.
    async fn reload(&self) -> Result<(::kube::Config, Target), String> {
        let c = crate::kube::config(self.kubeconfig.as_deref(), false)
            .await
            .map_err(|e| e.to_string())?;
        let t = Target::new(&c)?;
        Ok((c, t))
    }
}

/// A connection to `target`, its first request answered: blocking, within `timeout` a step.
fn dial(target: &Target, template: &Template, timeout: Duration) -> Result<Conn<Tag>, DialError> {
    let connect_err = |source| DialError::Connect {
        host: target.host.clone(),
        port: target.port,
        source,
    };
    let mut last = None;
    let mut socket = None;
    for addr in (target.host.as_str(), target.port)
        .to_socket_addrs()
        .map_err(connect_err)?
    {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                socket = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut s = socket
        .ok_or_else(|| connect_err(last.unwrap_or_else(|| std::io::ErrorKind::NotFound.into())))?;
    let io = |e: std::io::Error| DialError::Conn(ConnError::Io(e));
    // A pipelined request must not wait for the previous one's acknowledgement.
    s.set_nodelay(true).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    let stream = match &target.tls {
        None => Stream::Plain(s),
        Some((config, name)) => {
            let mut c = ClientConnection::new(Arc::clone(config), name.clone())?;
            // The reader bounds what it queues (requests in flight), not rustls.
            c.set_buffer_limit(None);
            while c.is_handshaking() {
                c.complete_io(&mut s).map_err(io)?;
            }
            Stream::Tls(Box::new((s, c)))
        }
    };
    let mut conn = Conn::new(stream);
    conn.send(
        Tag::Probe,
        &template.request("GET", "/version", "", b""),
        timeout,
    )?;
    let (_, r) = conn.answer_blocking()?;
    if !(200..300).contains(&r.status) {
        return Err(DialError::Answer {
            status: r.status,
            message: api_message(&r.body),
        });
    }
    conn.set_nonblocking().map_err(io)?;
    Ok(conn)
}

/// The headers kube's layers put on a request to the cluster, and its base path.
fn capture(
    config: &::kube::Config,
) -> futures::future::BoxFuture<'static, Result<Template, BoxError>> {
    let svc = (|| -> Result<_, BoxError> {
        let svc = ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(config.auth_layer()?)
            .layer(config.extra_headers_layer()?)
            // The request as the layers made it, carried back in a response (tower-http's
            // authorization layer wants an HTTP response from the service it wraps).
            .service(tower::service_fn(|r: http::Request<Body>| async move {
                let (parts, _) = r.into_parts();
                let mut back = http::Response::new(());
                *back.headers_mut() = parts.headers;
                back.extensions_mut().insert(parts.uri);
                Ok::<_, BoxError>(back)
            }));
        // Boxed here, so that the future below is known to be Send.
        Ok(tower::util::BoxService::new(svc))
    })();
    Box::pin(async move {
        let back = svc?
            .oneshot(http::Request::get("/").body(Body::empty())?)
            .await?;
        template_of(&back)
    })
}

fn template_of(back: &http::Response<()>) -> Result<Template, BoxError> {
    let uri = back
        .extensions()
        .get::<http::Uri>()
        .ok_or("the request's URI was not carried back")?;
    let host = uri
        .authority()
        .ok_or("the cluster URL has no host")?
        .to_string();
    let mut headers = Vec::new();
    for (name, value) in back.headers() {
        headers.extend_from_slice(name.as_str().as_bytes());
        headers.extend_from_slice(b": ");
        headers.extend_from_slice(value.as_bytes());
        headers.extend_from_slice(b"\r\n");
    }
    Ok(Template {
        prefix: uri.path().trim_end_matches('/').to_string(),
        host,
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fastpath::wire::tests::serve;

    fn plain(addr: std::net::SocketAddr) -> (Target, Template) {
        (
            Target {
                host: addr.ip().to_string(),
                port: addr.port(),
                tls: None,
            },
            Template {
                prefix: String::new(),
                host: addr.to_string(),
                headers: b"authorization: Bearer t\r\n".to_vec(),
            },
        )
    }

    /// A connection is handed over only once `GET /version` was answered 2xx, with the
    /// template's credentials; a 401 is an error that names the credentials.
    #[test]
    fn a_connection_is_proven_before_it_is_handed_over() {
        let body = r#"{"major":"1","minor":"34"}"#;
        let ok = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (addr, server) = serve(1, ok, true);
        let (target, template) = plain(addr);
        let conn = dial(&target, &template, Duration::from_secs(5)).unwrap();
        assert_eq!(conn.in_flight(), 0);
        let seen = server.join().unwrap();
        assert!(seen.starts_with("GET /version HTTP/1.1\r\n"), "{seen}");
        assert!(seen.contains("\r\nauthorization: Bearer t\r\n"), "{seen}");

        let denied = r#"{"kind":"Status","message":"Unauthorized","code":401}"#;
        let denied = format!(
            "HTTP/1.1 401 Unauthorized\r\nContent-Length: {}\r\n\r\n{denied}",
            denied.len()
        );
        let (addr, server) = serve(1, denied, true);
        let (target, template) = plain(addr);
        let Err(e) = dial(&target, &template, Duration::from_secs(5)) else {
            panic!("a connection whose credentials were refused was handed over");
        };
        assert!(
            matches!(&e, DialError::Answer { status: 401, message } if message == "Unauthorized"),
            "{e}"
        );
        assert!(e.to_string().contains("credentials"), "{e}");
        server.join().unwrap();
    }

    /// What kube's layers add reaches the template: the bearer token, the impersonation, the
    /// base path.
    #[tokio::test]
    async fn the_template_is_what_kube_would_send() {
        let mut config = ::kube::Config::new("https://10.1.2.3:6443/base/".parse().unwrap());
        config.auth_info.token = Some("sekret".to_string().into());
        config.auth_info.impersonate = Some("someone".into());
        let t = capture(&config).await.unwrap();
        assert_eq!(t.prefix, "/base");
        assert_eq!(t.host, "10.1.2.3:6443");
        let h = String::from_utf8(t.headers).unwrap().to_ascii_lowercase();
        assert!(h.contains("authorization: bearer sekret\r\n"), "{h}");
        assert!(h.contains("impersonate-user: someone\r\n"), "{h}");
        let target = Target::new(&config).unwrap();
        assert_eq!((target.host.as_str(), target.port), ("10.1.2.3", 6443));
        assert!(target.tls.is_some());
    }
}
