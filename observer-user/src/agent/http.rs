//! The agent's HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (liveness: every task of
//! the agent runs, the kernel reader and the reconciler are turning, as kubelet's PLEG health
//! fails after 3 minutes without a relist), `/readyz` (ready once the first sync is done: the
//! start-up walk, the runtime's first relist answered, and the API's first list of this node's
//! pods; until then it says what is missing and why). `/metrics` only for a caller allowed to
//! read it ([`super::access`]); nothing about any pod otherwise: a pod's story is its PodReport.
use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{body::Bytes, server::conn::http1, service::service_fn, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::{
    access::{Denied, Gate},
    metrics::Metrics,
    tasks::TaskHealth,
};
use crate::{
    cri::ReconnectingCri, pipeline::PipelineHealth, reconcile::ReconcileHandle,
    status::StatusHandle,
};

/// What the health checks look at.
#[derive(Clone)]
pub struct Health {
    pub pipeline: Arc<PipelineHealth>,
    pub reconcile: ReconcileHandle,
    pub cri: ReconnectingCri,
    pub tasks: TaskHealth,
    /// The status manager; `None` when nothing reaches the API.
    pub api: Option<StatusHandle>,
    /// A loop that has not turned for this long is stuck (both turn every few seconds).
    pub stale_after: Duration,
}

impl Health {
    /// `Err(why)` when a part of the agent died or stopped turning.
    pub fn live(&self) -> Result<(), String> {
        self.tasks.check()?;
        // Only a new container mounts the runtime's new socket.
        if let Some(why) = self.cri.stale_socket() {
            return Err(why);
        }
        if self.pipeline.ended() {
            return Err("the kernel reader has stopped".into());
        }
        let k = self.pipeline.since_last_turn();
        if k > self.stale_after {
            return Err(format!("the kernel reader has not turned for {k:?}"));
        }
        let r = self.reconcile.since_last_turn();
        if r > self.stale_after {
            return Err(format!("the reconciler has not turned for {r:?}"));
        }
        Ok(())
    }

    /// Live, and the first syncs are done: with the runtime (walk and relist) and with the API
    /// (this node's pods listed). Every one missing is said.
    pub fn ready(&self) -> Result<(), String> {
        self.live()?;
        let mut missing = Vec::new();
        if !self.reconcile.is_settled() {
            let state = self.cri.state();
            missing.push(match state.last_error {
                Some(why) if !state.connected => {
                    format!("the first sync with the runtime is not done: {why}")
                }
                _ => "the first sync with the runtime is not done".into(),
            });
        }
        if let Some(status) = &self.api {
            missing.extend(status.listed().err());
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("\n"))
        }
    }
}

fn reply(code: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

/// What the endpoint answers from: the metrics, the health checks, and who may read what.
#[derive(Clone)]
struct Endpoint {
    metrics: Arc<Metrics>,
    health: Health,
    gate: Arc<Gate>,
}

const TEXT: &str = "text/plain; charset=utf-8";

fn refused(d: Denied) -> Response<Full<Bytes>> {
    let code = StatusCode::from_u16(d.code()).unwrap_or(StatusCode::FORBIDDEN);
    let mut r = reply(code, TEXT, format!("{}\n", d.message()));
    if code == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
    }
    r
}

/// `target`: the request's path and query.
async fn route(
    target: &str,
    headers: &http::HeaderMap,
    peer: std::net::IpAddr,
    at: &Endpoint,
) -> Response<Full<Bytes>> {
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let check = |r: Result<(), String>| match r {
        Ok(()) => reply(StatusCode::OK, TEXT, "ok\n".into()),
        Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
    };
    match path {
        "/metrics" => {
            if let Err(d) = at.gate.metrics(headers, peer).await {
                return refused(d);
            }
            match at.metrics.encode() {
                Ok(text) => reply(
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    text,
                ),
                Err(_) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    TEXT,
                    "encoding failed\n".into(),
                ),
            }
        }
        "/healthz" | "/livez" => check(at.health.live()),
        "/readyz" => check(at.health.ready()),
        // Nothing about any pod is served here: a pod's story is its PodReport, read through
        // the API server with the reader's own rights (present/report.rs).
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: /metrics, /healthz, /readyz (a pod's deaths and OOM kills: kubectl get \
             podreports, kubectl observer explain)\n"
                .into(),
        ),
    }
}

/// Binds `addr` (an error says which address could not be bound).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("listening on {addr}: {e}")))
}

/// What one client can hold of the endpoint: it serves every agent's scrapes and probes, and
/// anyone who reaches the port can open connections.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once, a bound on what they cost (a few KiB each); beyond it a new
    /// connection is closed at once. Prometheus, kubelet's probes and the plugin's proxied
    /// requests need a handful; many peers together can still fill it, which only a
    /// NetworkPolicy on the port prevents (deploy/).
    pub max_connections: usize,
    /// Of those, from one peer address: one client cannot take every slot, so kubelet's probes
    /// (from the node's address) and the scrapes (from Prometheus's) still get theirs.
    pub max_per_peer: usize,
    /// From a connection's first byte to its request's last header.
    pub header_timeout: Duration,
    /// A connection's whole life: a client that reads its answer slowly, or keeps the
    /// connection without asking, is dropped.
    pub connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_per_peer: 8,
            header_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(30),
        }
    }
}

/// Connections held per peer address.
#[derive(Default)]
struct Peers(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One connection of a peer; given back when dropped.
struct PeerSlot(Arc<Peers>, std::net::IpAddr);

impl Peers {
    fn take(self: &Arc<Self>, peer: std::net::IpAddr, max: usize) -> Option<PeerSlot> {
        let mut held = crate::sync::lock(&self.0);
        let n = held.entry(peer).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot(Arc::clone(self), peer))
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut held = crate::sync::lock(&self.0 .0);
        if let Some(n) = held.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.1);
            }
        }
    }
}

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, health: Health, gate: Arc<Gate>) {
    serve_with(listener, metrics, health, gate, Limits::default()).await
}

/// [`serve`] with its limits.
pub async fn serve_with(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Health,
    gate: Arc<Gate>,
    limits: Limits,
) {
    let endpoint = Endpoint {
        metrics,
        health,
        gate,
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let peers = Arc::new(Peers::default());
    let mut accept_errors =
        crate::runner::Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
    let mut refused: u64 = 0;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok((s, addr)) => {
                accept_errors.reset();
                (s, addr.ip())
            }
            Err(e) => {
                // EMFILE/ENFILE/ENOBUFS leave the connection queued: accepting again at once
                // would spin. Waiting lets the agent's other work (and the fds' owners) go on.
                let wait = accept_errors.next_delay();
                if accept_errors.attempts() == 1 {
                    tracing::warn!("the HTTP endpoint cannot accept connections ({e}); retrying with back-off up to 1 s (raise the agent's open-file limit if this is EMFILE)");
                }
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        let peer_slot = peers.take(peer, limits.max_per_peer);
        let slot = Arc::clone(&slots).try_acquire_owned();
        let (Some(peer_slot), Ok(slot)) = (peer_slot, slot) else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    refused,
                    %peer,
                    "the HTTP endpoint is at its connection limit ({} in all, {} per peer): new ones are closed until some end",
                    limits.max_connections,
                    limits.max_per_peer
                );
            }
            drop(stream);
            continue;
        };
        let at = endpoint.clone();
        tokio::spawn(async move {
            let _slots = (slot, peer_slot);
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let at = at.clone();
                async move {
                    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
                    Ok::<_, Infallible>(route(target, req.headers(), peer, &at).await)
                }
            });
            let conn = http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), svc);
            match tokio::time::timeout(limits.connection_timeout, conn).await {
                Ok(Err(e)) => tracing::debug!("http connection: {e}"),
                Err(_) => tracing::debug!(
                    "http connection dropped after {:?}",
                    limits.connection_timeout
                ),
                Ok(Ok(())) => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::{
        agent::tasks::Tasks,
        cri::{CriConfig, CriEndpoint},
        kube::testkit::api::{self, status, Reply},
        pipeline::PipelineStats,
        status::{StatusConfig, StatusManager, StatusMode},
    };

    async fn get(path: &str, health: &Health) -> (u16, String) {
        let at = Endpoint {
            metrics: Arc::new(Metrics::new(None)),
            health: health.clone(),
            gate: Arc::new(Gate::open()),
        };
        let r = route(
            path,
            &http::HeaderMap::new(),
            std::net::IpAddr::from([127, 0, 0, 1]),
            &at,
        )
        .await;
        let code = r.status().as_u16();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        (code, String::from_utf8(body.to_vec()).unwrap())
    }

    /// A health of `reconcile` with no API, and a runtime whose socket does not exist.
    fn offline(reconcile: ReconcileHandle, dir: &std::path::Path) -> Health {
        Health {
            pipeline: Arc::new(PipelineHealth::new(PipelineStats::default())),
            reconcile,
            cri: ReconnectingCri::new(CriConfig::new(CriEndpoint::new(dir.join("absent.sock")))),
            tasks: Tasks::default().health(),
            api: None,
            stale_after: Duration::from_secs(60),
        }
    }

    #[tokio::test]
    async fn readyz_says_what_is_missing_and_healthz_which_task_ended() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("absent.sock");
        let cri = ReconnectingCri::new(CriConfig::new(CriEndpoint::new(&socket)));
        let mut cri_state = cri.subscribe();
        cri_state
            .wait_for(|s| s.last_error.is_some())
            .await
            .unwrap();

        let reconcile = ReconcileHandle::detached();
        let (client, mock) = api::client();
        api::serve(mock, vec![status(401, "Unauthorized"), Reply::Hang]);
        let (manager, status_handle) = StatusManager::new(
            client,
            StatusConfig::new("node-1", StatusMode::Conditions),
            reconcile.clone(),
        );
        let mut tasks = Tasks::default();
        tasks.spawn("status manager", manager.run());
        let health = Health {
            pipeline: Arc::new(PipelineHealth::new(PipelineStats::default())),
            reconcile,
            cri,
            tasks: tasks.health(),
            api: Some(status_handle.clone()),
            stale_after: Duration::from_secs(60),
        };
        let runtime = format!("the first sync with the runtime is not done: CRI socket {} does not exist; is the runtime running, and is --cri-endpoint (OBSERVER_CRI_ENDPOINT) its socket? containerd: /run/containerd/containerd.sock, CRI-O: /var/run/crio/crio.sock", socket.display());
        let (code, body) = get("/readyz", &health).await;
        assert_eq!(code, 503);
        assert!(body.starts_with(&format!("{runtime}\n")), "{body}");
        let unauthorized = "the API's first list of this node's pods has not succeeded: the API server refused the agent's credentials (401 Unauthorized: Unauthorized (test)): check the kubeconfig's user, or the service account's token";
        let said = tokio::time::timeout(Duration::from_secs(10), async {
            while status_handle.listed() != Err(unauthorized.into()) {
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(said.is_ok(), "{:?}", status_handle.listed());
        assert_eq!(
            get("/readyz", &health).await,
            (503, format!("{runtime}\n{unauthorized}\n"))
        );
        assert_eq!(get("/healthz", &health).await, (200, "ok\n".into()));

        tasks.spawn("Events worker", async {});
        let _ = tokio::time::timeout(Duration::from_secs(10), tasks.failed()).await;
        assert_eq!(
            get("/healthz", &health).await,
            (503, "the Events worker ended\n".into())
        );
        assert_eq!(
            get("/readyz", &health).await,
            (503, "the Events worker ended\n".into())
        );
    }

    /// A peer that opens connections and never finishes a request holds at most its share:
    /// the probes (another address) are answered at once, and its connections end at the
    /// header timeout.
    #[tokio::test]
    async fn a_peer_holding_slow_connections_leaves_the_probes_their_slots() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let cri = ReconnectingCri::new(CriConfig::new(CriEndpoint::new(
            dir.path().join("absent.sock"),
        )));
        let tasks = Tasks::default();
        let health = Health {
            pipeline: Arc::new(PipelineHealth::new(PipelineStats::default())),
            reconcile: ReconcileHandle::detached(),
            cri,
            tasks: tasks.health(),
            api: None,
            stale_after: Duration::from_secs(60),
        };
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            max_connections: 16,
            max_per_peer: 4,
            header_timeout: Duration::from_secs(4),
            connection_timeout: Duration::from_secs(30),
        };
        let server = crate::sync::AbortOnDrop(tokio::spawn(serve_with(
            listener,
            Arc::new(Metrics::new(None)),
            health,
            Arc::new(Gate::open()),
            limits,
        )));
        // 40 connections from 127.0.0.2, each with half a request line.
        let mut slow = Vec::new();
        for _ in 0..40 {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            let mut c = sock.connect(addr).await.unwrap();
            c.write_all(b"GET /hea").await.unwrap();
            slow.push(c);
        }
        // The ones past its share are closed at once; the first four are held.
        let mut closed = 0;
        for c in &mut slow[4..] {
            let mut b = [0u8; 1];
            // Closed with its request unread, the socket is reset rather than shut down.
            if let Ok(Ok(0) | Err(_)) =
                tokio::time::timeout(Duration::from_millis(500), c.read(&mut b)).await
            {
                closed += 1;
            }
        }
        assert_eq!(closed, 36, "all but the peer's share closed");
        for c in &mut slow[..4] {
            let mut b = [0u8; 1];
            let r = tokio::time::timeout(Duration::from_millis(100), c.read(&mut b)).await;
            assert!(r.is_err(), "the peer's share is held: {r:?}");
        }
        // A probe from another address is answered while the four are still held.
        let probe = tokio::time::timeout(Duration::from_secs(1), async {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).await.unwrap();
            out
        })
        .await
        .expect("the probe is answered within a second");
        assert!(probe.starts_with("HTTP/1.1 200"), "{probe}");
        // The held ones end at the header timeout.
        for c in &mut slow[..4] {
            let mut b = [0u8; 1];
            let n = tokio::time::timeout(Duration::from_secs(8), c.read(&mut b))
                .await
                .expect("closed by the header timeout");
            // hyper may answer 408 before it closes; either way the connection ends.
            assert!(matches!(n, Ok(0) | Err(_)) || b[0] == b'H', "{n:?}");
        }
        drop(server);
    }

    /// The port answers nothing about any pod, to anyone: a pod's story is its PodReport.
    #[tokio::test]
    async fn nothing_about_a_pod_is_served() {
        use crate::{kube::testkit, reconcile::ContainerPhase};
        let reconcile = ReconcileHandle::detached();
        let mut app = testkit::cv("app", 0, ContainerPhase::Running);
        app.last_oom = Some(testkit::oom(&app, 7, "hog", false));
        let mut v = testkit::view(vec![app]);
        v.namespace = "default".into();
        v.name = "web".into();
        reconcile.publish(v);
        let dir = tempfile::tempdir().unwrap();
        let health = offline(reconcile, dir.path());
        for path in [
            "/explain/default/web",
            "/explain/default/web?output=text",
            "/explain/default/web/app",
            "/pods",
        ] {
            let (code, body) = get(path, &health).await;
            assert_eq!(code, 404, "{path}: {body}");
            assert!(
                !body.contains("hog") && !body.contains("web"),
                "{path}: {body}"
            );
        }
    }

    /// `/metrics` by default only for a caller the API server vouches for; health needs nothing.
    #[tokio::test]
    async fn metrics_need_a_token_the_api_accepts_and_health_nothing() {
        use crate::kube::testkit::api;
        use serde_json::json;
        let dir = tempfile::tempdir().unwrap();
        let health = offline(ReconcileHandle::detached(), dir.path());
        let (client, mock) = api::client();
        let log = api::serve(
            mock,
            vec![
                api::Reply::Json(
                    201,
                    json!({"apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenReview", "spec": {},
                    "status": {"authenticated": true, "user": {"username": "prometheus"}}}),
                ),
                api::Reply::Json(
                    201,
                    json!({"apiVersion": "authorization.k8s.io/v1",
                    "kind": "SubjectAccessReview", "spec": {}, "status": {"allowed": true}}),
                ),
            ],
        );
        let at = Endpoint {
            metrics: Arc::new(Metrics::new(None)),
            health,
            gate: Arc::new(Gate::new(
                super::super::access::MetricsAccess::default(),
                Some(client),
            )),
        };
        let peer = std::net::IpAddr::from([127, 0, 0, 1]);
        let ask = |path: &'static str, token: Option<&'static str>| {
            let at = at.clone();
            async move {
                let mut h = http::HeaderMap::new();
                if let Some(t) = token {
                    h.insert("authorization", format!("Bearer {t}").parse().unwrap());
                }
                let r = route(path, &h, peer, &at).await;
                let code = r.status().as_u16();
                let www = r.headers().get("www-authenticate").cloned();
                let body = r.into_body().collect().await.unwrap().to_bytes();
                (code, www, String::from_utf8(body.to_vec()).unwrap())
            }
        };
        let (code, www, _) = ask("/metrics", None).await;
        assert_eq!(
            (code, www.as_ref().map(|v| v.to_str().unwrap())),
            (401, Some("Bearer"))
        );
        assert!(
            log.lock().unwrap().is_empty(),
            "nothing asked without a token"
        );
        assert_eq!(ask("/metrics", Some("scrape")).await.0, 200);
        assert_eq!(ask("/healthz", None).await.0, 200);
    }
}
