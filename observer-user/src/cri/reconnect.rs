//! A CRI connection that survives the runtime: absent at start, restarted, upgraded.
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_cri::v1 as api;
use tokio::sync::{watch, Notify};

use super::{ContainerEventStream, CriClient, CriConfig, CriError};
use crate::{runner::Backoff, sync::AbortOnDrop};

/// What [`ReconnectingCri`] publishes on every change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionState {
    pub connected: bool,
    /// Successful connections so far: 0 before the first, then 1, 2, ... Every bump after the first
    /// means the runtime may have changed while we were away: relist.
    pub generation: u64,
    /// Why the last connection attempt failed or the last connection ended.
    pub last_error: Option<String>,
}

impl ConnectionState {
    pub fn reconnects(&self) -> u64 {
        self.generation.saturating_sub(1)
    }
}

/// How long a socket mounted by itself may refuse every connection before it is taken for the
/// old socket of a runtime that restarted (see [`ReconnectingCri::stale_socket`]). A runtime
/// restarting takes seconds: it refuses meanwhile through a directory mount too.
const STALE_AFTER: Duration = Duration::from_secs(30);

struct Shared {
    config: CriConfig,
    current: RwLock<Option<CriClient>>,
    state: watch::Sender<ConnectionState>,
    lost: Arc<Notify>,
    /// Set once the endpoint is a mount of the socket alone that refused for [`STALE_AFTER`].
    stale: RwLock<Option<String>>,
    /// Whether the endpoint is a mount point of its own (`/proc/self/mountinfo`; a test's
    /// stand-in).
    own_mount: fn(&Path) -> bool,
    stale_after: Duration,
}

/// Keeps a [`CriClient`] connected in the background. Callers never wait on a dead runtime: while
/// disconnected, calls fail at once with [`CriError::Disconnected`] and the caller carries on.
///
/// A connection counts only once the runtime answered CRI Version on it. A lost connection is seen
/// the moment the runtime closes its socket; reconnection then retries with [`Backoff`].
/// Clones share the connection; the background task ends when the last clone is dropped.
#[derive(Clone)]
pub struct ReconnectingCri {
    shared: Arc<Shared>,
    _task: Arc<AbortOnDrop>,
}

impl ReconnectingCri {
    /// Starts connecting (100 ms doubling to 10 s between attempts). Must run inside a tokio runtime.
    pub fn new(config: CriConfig) -> Self {
        Self::with_backoff(config, Backoff::default())
    }

    pub(crate) fn with_backoff(config: CriConfig, backoff: Backoff) -> Self {
        Self::with_mount_check(config, backoff, is_mount_point, STALE_AFTER)
    }

    fn with_mount_check(
        config: CriConfig,
        backoff: Backoff,
        own_mount: fn(&Path) -> bool,
        stale_after: Duration,
    ) -> Self {
        let (state, _) = watch::channel(ConnectionState::default());
        let shared = Arc::new(Shared {
            config,
            current: RwLock::new(None),
            state,
            lost: Arc::new(Notify::new()),
            stale: RwLock::new(None),
            own_mount,
            stale_after,
        });
        let task = tokio::spawn(supervise(shared.clone(), backoff));
        ReconnectingCri {
            shared,
            _task: Arc::new(AbortOnDrop(task)),
        }
    }

    pub fn state(&self) -> ConnectionState {
        self.shared.state.borrow().clone()
    }

    /// Changes of the connection state; `generation` tells reconnects apart.
    pub fn subscribe(&self) -> watch::Receiver<ConnectionState> {
        self.shared.state.subscribe()
    }

    pub fn is_connected(&self) -> bool {
        self.shared.state.borrow().connected
    }

    /// Why the endpoint can never answer again, once it is so: it is the socket alone mounted
    /// into this container (a hostPath of type Socket) and has refused every connection for 30 s.
    /// containerd and CRI-O remove their socket and make a new one at start; a mount of the old
    /// one keeps it, with nobody listening, until the container is made again. The agent's
    /// liveness fails on it, so kubelet restarts the container with the new socket.
    pub fn stale_socket(&self) -> Option<String> {
        crate::sync::read(&self.shared.stale).clone()
    }

    /// `observer_cri_connected`, `observer_cri_reconnects_total`.
    pub(crate) fn encode_metrics(
        &self,
        e: &mut prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> std::fmt::Result {
        crate::exposition::gauge(
            e,
            "cri_connected",
            "1 while the container runtime answers",
            None,
            f64::from(u8::from(self.is_connected())),
        )?;
        crate::exposition::counter(
            e,
            "cri_reconnects",
            "Connections to the runtime after the first",
            self.reconnects(),
        )
    }

    pub fn reconnects(&self) -> u64 {
        self.shared.state.borrow().reconnects()
    }

    /// The current connection, or [`CriError::Disconnected`] at once.
    pub fn client(&self) -> Result<CriClient, CriError> {
        if let Some(c) = crate::sync::read(&self.shared.current).clone() {
            return Ok(c);
        }
        Err(CriError::Disconnected {
            path: self.shared.config.endpoint.path().to_path_buf(),
            last_error: self
                .shared
                .state
                .borrow()
                .last_error
                .clone()
                .unwrap_or_else(|| "not connected yet".into()),
        })
    }

    /// Waits up to `timeout` for a connection.
    pub async fn wait_connected(&self, timeout: Duration) -> Result<CriClient, CriError> {
        let mut rx = self.subscribe();
        // On timeout (or if the supervisor is gone) client() reports why we are not connected.
        let _ = tokio::time::timeout(timeout, rx.wait_for(|s| s.connected)).await;
        self.client()
    }

    pub async fn version(&self) -> Result<api::VersionResponse, CriError> {
        self.client()?.version().await
    }

    pub async fn list_pod_sandboxes(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> Result<Vec<api::PodSandbox>, CriError> {
        self.client()?.list_pod_sandboxes(filter).await
    }

    pub async fn pod_sandbox_status(&self, id: &str) -> Result<api::PodSandboxStatus, CriError> {
        self.client()?.pod_sandbox_status(id).await
    }

    pub async fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> Result<Vec<api::Container>, CriError> {
        self.client()?.list_containers(filter).await
    }

    pub async fn container_status(&self, id: &str) -> Result<api::ContainerStatus, CriError> {
        self.client()?.container_status(id).await
    }

    pub async fn container_pid(&self, id: &str) -> Result<Option<u32>, CriError> {
        self.client()?.container_pid(id).await
    }

    pub async fn get_container_events(&self) -> Result<ContainerEventStream, CriError> {
        self.client()?.get_container_events().await
    }
}

async fn supervise(s: Arc<Shared>, mut backoff: Backoff) {
    let mut failures = 0u64;
    // Since when every attempt was refused on a socket mounted by itself.
    let mut refused_since: Option<tokio::time::Instant> = None;
    loop {
        let alive = Arc::new(AtomicBool::new(true));
        // Holds no reference to `Shared`: the closure lives inside the connection that `Shared` owns.
        let on_close = {
            let alive = alive.clone();
            let lost = s.lost.clone();
            Box::new(move || {
                alive.store(false, Ordering::SeqCst);
                lost.notify_one();
            }) as Box<dyn FnOnce() + Send + Sync>
        };
        let attempt = async {
            let client = CriClient::connect_notify(&s.config, Some(on_close)).await?;
            let v = client.version().await?;
            Ok::<_, CriError>((client, v))
        }
        .await;
        match attempt {
            Ok((client, v)) => {
                backoff.reset();
                failures = 0;
                refused_since = None;
                *crate::sync::write(&s.current) = Some(client);
                s.state.send_modify(|st| {
                    st.connected = true;
                    st.generation += 1;
                    st.last_error = None;
                });
                tracing::info!(
                    endpoint = %s.config.endpoint,
                    runtime = %v.runtime_name,
                    version = %v.runtime_version,
                    generation = s.state.borrow().generation,
                    "connected to CRI runtime"
                );
                // notify_one keeps a permit when nobody waits, so a close between the check and
                // the wait is not lost; a permit left by an older connection only re-runs the check.
                while alive.load(Ordering::SeqCst) {
                    s.lost.notified().await;
                }
                mark_lost(&s);
            }
            Err(e) => {
                failures += 1;
                let msg = match e.hint() {
                    Some(hint) => format!("{}; {hint}", e.chain()),
                    None => e.chain(),
                };
                let changed = s.state.send_if_modified(|st| {
                    let changed = st.last_error.as_deref() != Some(msg.as_str());
                    st.last_error = Some(msg.clone());
                    changed
                });
                let delay = backoff.next_delay();
                // A new reason at once, the same one again at the 2nd, 4th, 8th... attempt.
                if changed || failures.is_power_of_two() {
                    tracing::warn!(endpoint = %s.config.endpoint, failures, "CRI runtime not reachable: {msg}; retrying");
                }
                let path = s.config.endpoint.path();
                if refused(path) && (s.own_mount)(path) {
                    let since = *refused_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() >= s.stale_after && crate::sync::read(&s.stale).is_none() {
                        let why = format!(
                            "the CRI socket {} is mounted into this container by itself and has \
                             refused every connection for {:?}: the runtime made a new socket \
                             when it restarted, which this mount does not show; restart this \
                             container (kubelet does, as /healthz now fails) to mount the new one",
                            path.display(),
                            s.stale_after
                        );
                        tracing::error!(endpoint = %s.config.endpoint, "{why}");
                        *crate::sync::write(&s.stale) = Some(why);
                    }
                } else {
                    refused_since = None;
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Nobody listens on the socket at `path` (it exists: a missing one is `SocketMissing`).
fn refused(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path)
        .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// `path` is a mount point in this mount namespace: a file bind-mounted by itself (a hostPath
/// volume of type Socket), not a file in a mounted directory.
fn is_mount_point(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    text.lines()
        .filter_map(|l| procfs::process::MountInfo::from_line(l).ok())
        .any(|m| m.mount_point == path)
}

fn mark_lost(s: &Shared) {
    *crate::sync::write(&s.current) = None;
    s.state.send_modify(|st| {
        st.connected = false;
        st.last_error = Some("the runtime closed the connection".into());
    });
    tracing::warn!(endpoint = %s.config.endpoint, "lost the CRI connection; reconnecting");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::CriEndpoint;
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A CRI runtime that answers Version and nothing else: enough to drive connect, loss and
    /// reconnect without containerd.
    #[derive(Clone)]
    struct FakeRuntime;

    impl tonic::server::NamedService for FakeRuntime {
        const NAME: &'static str = "runtime.v1.RuntimeService";
    }

    type BoxFut<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

    impl tower::Service<http::Request<tonic::body::Body>> for FakeRuntime {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = BoxFut<Self::Response>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            Box::pin(async move {
                if req.uri().path() != "/runtime.v1.RuntimeService/Version" {
                    return Ok(tonic::Status::unimplemented("not in the fake").into_http());
                }
                let version = tower::service_fn(|_: tonic::Request<api::VersionRequest>| async {
                    Ok::<_, tonic::Status>(tonic::Response::new(api::VersionResponse {
                        runtime_name: "fake".into(),
                        runtime_api_version: "v1".into(),
                        ..Default::default()
                    }))
                });
                let codec =
                    tonic_prost::ProstCodec::<api::VersionResponse, api::VersionRequest>::default();
                Ok(tonic::server::Grpc::new(codec).unary(version, req).await)
            })
        }
    }

    struct Server {
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Server {
        fn start(path: &Path) -> Server {
            let _ = std::fs::remove_file(path);
            let listener = tokio::net::UnixListener::bind(path).unwrap();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(async move {
                tonic::transport::Server::builder()
                    .add_service(FakeRuntime)
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(listener),
                        async {
                            let _ = rx.await;
                        },
                    )
                    .await
                    .unwrap();
            });
            Server {
                stop: Some(tx),
                task,
            }
        }

        async fn stop(mut self, path: &Path) {
            let _ = self.stop.take().unwrap().send(());
            tokio::time::timeout(Duration::from_secs(5), &mut self.task)
                .await
                .expect("fake runtime did not shut down")
                .unwrap();
            let _ = std::fs::remove_file(path);
        }
    }

    async fn wait_state(
        cri: &ReconnectingCri,
        what: &str,
        f: impl Fn(&ConnectionState) -> bool,
    ) -> ConnectionState {
        let mut rx = cri.subscribe();
        let got = match tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|s| f(s))).await {
            Ok(Ok(s)) => s.clone(),
            _ => panic!("timed out waiting for {what}; state {:?}", cri.state()),
        };
        got
    }

    #[tokio::test]
    async fn a_wrong_endpoint_is_said_at_once_with_what_to_check() {
        let (log, _g) = crate::testlog::capture(tracing::Level::WARN);
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent.sock");
        let file = dir.path().join("regular");
        std::fs::write(&file, "").unwrap();
        // A socket that is not CRI: it takes each connection and closes it.
        let other = dir.path().join("other.sock");
        let listener = tokio::net::UnixListener::bind(&other).unwrap();
        let _closer = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                drop(s);
            }
        });
        let cases = [
            (&missing, format!("CRI socket {} does not exist; is the runtime running, and is --cri-endpoint (OBSERVER_CRI_ENDPOINT) its socket? containerd: /run/containerd/containerd.sock, CRI-O: /var/run/crio/crio.sock", missing.display())),
            (&file, format!("CRI endpoint {} is not a unix socket; --cri-endpoint (OBSERVER_CRI_ENDPOINT) must be the runtime's unix socket", file.display())),
            (&other, "; the socket does not answer CRI Version: is the runtime running, and is --cri-endpoint (OBSERVER_CRI_ENDPOINT) its CRI socket?".to_string()),
        ];
        for (path, says) in cases {
            let config =
                CriConfig::new(CriEndpoint::new(path)).call_timeout(Duration::from_secs(2));
            let backoff =
                Backoff::with_seed(Duration::from_millis(10), Duration::from_millis(50), 1);
            let cri = ReconnectingCri::with_backoff(config, backoff);
            let st = wait_state(&cri, "a failed attempt", |s| s.last_error.is_some()).await;
            let why = st.last_error.unwrap();
            assert!(why.contains(&says), "{why}");
            let line = format!(
                "WARN CRI runtime not reachable: {why}; retrying endpoint=unix://{}",
                path.display()
            );
            assert!(
                log.lines().iter().any(|l| l.starts_with(&line)),
                "{line}\n{}",
                log.text()
            );
        }
    }

    /// A runtime restarted: the mounted socket is the old one, which nobody listens on. Taken
    /// for stale only where the socket is a mount of its own; a socket in a mounted directory
    /// is the runtime's current one, down or not.
    #[tokio::test]
    async fn a_socket_mounted_alone_that_keeps_refusing_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cri.sock");
        // Bound, then closed: the file stays and refuses, as a runtime's old socket does.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(refused(&path));
        assert!(!is_mount_point(&path));
        let backoff =
            || Backoff::with_seed(Duration::from_millis(10), Duration::from_millis(20), 1);
        let config =
            || CriConfig::new(CriEndpoint::new(&path)).call_timeout(Duration::from_secs(2));
        let after = Duration::from_millis(200);
        let in_dir = ReconnectingCri::with_mount_check(config(), backoff(), |_| false, after);
        let alone = ReconnectingCri::with_mount_check(config(), backoff(), |_| true, after);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while alone.stale_socket().is_none() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let why = alone
            .stale_socket()
            .expect("stale after 200 ms of refusals");
        assert!(
            why.contains("mounted into this container by itself"),
            "{why}"
        );
        assert_eq!(in_dir.stale_socket(), None);
        assert!(!alone.is_connected());
    }

    #[tokio::test]
    async fn connects_late_detects_loss_and_reconnects() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cri.sock");
        let config = CriConfig::new(CriEndpoint::new(&path)).call_timeout(Duration::from_secs(2));
        let backoff = Backoff::with_seed(Duration::from_millis(10), Duration::from_millis(50), 1);
        let cri = ReconnectingCri::with_backoff(config, backoff);

        // No runtime yet: calls fail at once, and say why.
        let st = wait_state(&cri, "a failed attempt", |s| s.last_error.is_some()).await;
        assert!(!st.connected);
        assert_eq!(st.generation, 0);
        let err = cri.version().await.unwrap_err();
        assert!(matches!(err, CriError::Disconnected { .. }), "{err}");
        assert!(err.to_string().contains("does not exist"), "{err}");

        let server = Server::start(&path);
        let client = cri.wait_connected(Duration::from_secs(5)).await.unwrap();
        assert_eq!(client.version().await.unwrap().runtime_name, "fake");
        assert_eq!(cri.state().generation, 1);
        assert_eq!(cri.reconnects(), 0);
        let err = cri.get_container_events().await.err().unwrap();
        assert!(err.is_unimplemented(), "{err}");

        let mut generations = cri.subscribe();
        generations.mark_unchanged();
        server.stop(&path).await;
        wait_state(&cri, "loss of the connection", |s| !s.connected).await;
        assert!(matches!(
            cri.list_containers(None).await,
            Err(CriError::Disconnected { .. })
        ));

        let server = Server::start(&path);
        let st = wait_state(&cri, "reconnect", |s| s.connected).await;
        assert_eq!(st.generation, 2);
        assert_eq!(cri.reconnects(), 1);
        assert!(generations.has_changed().unwrap());
        assert_eq!(cri.version().await.unwrap().runtime_api_version, "v1");
        server.stop(&path).await;
    }
}
