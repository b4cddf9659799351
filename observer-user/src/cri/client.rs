//! One connection to the runtime's CRI RuntimeService, read-only calls, each under a timeout.
use std::future::Future;
use std::time::Duration;

use k8s_cri::v1 as api;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use super::{endpoint::unix_channel, CriEndpoint, CriError};

/// How to reach the runtime and how long to wait for it.
#[derive(Debug, Clone)]
pub struct CriConfig {
    pub endpoint: CriEndpoint,
    /// Bound on every unary call; a runtime that does not answer within it is an error.
    pub call_timeout: Duration,
    pub connect_timeout: Duration,
}

impl CriConfig {
    pub fn new(endpoint: CriEndpoint) -> Self {
        CriConfig {
            endpoint,
            call_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
        }
    }

    pub fn call_timeout(mut self, t: Duration) -> Self {
        self.call_timeout = t;
        self
    }

    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }
}

impl Default for CriConfig {
    fn default() -> Self {
        CriConfig::new(CriEndpoint::default())
    }
}

/// A connected CRI client. Cheap to clone; clones share the connection.
///
/// The connection is never redialed behind the caller's back: once it breaks, calls fail and a new
/// client must be connected ([`super::ReconnectingCri`] does that).
#[derive(Clone)]
pub struct CriClient {
    endpoint: CriEndpoint,
    channel: Channel,
    call_timeout: Duration,
}

impl std::fmt::Debug for CriClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriClient")
            .field("endpoint", &self.endpoint)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

impl CriClient {
    /// Connects to the runtime's socket. Does not check that a CRI server answers there: call
    /// [`CriClient::version`] for that.
    pub async fn connect(config: &CriConfig) -> Result<Self, CriError> {
        Self::connect_notify(config, None).await
    }

    /// Like [`CriClient::connect`]; `on_close` runs once when the connection ends.
    pub(crate) async fn connect_notify(
        config: &CriConfig,
        on_close: Option<Box<dyn FnOnce() + Send + Sync>>,
    ) -> Result<Self, CriError> {
        let channel =
            unix_channel(config.endpoint.path(), config.connect_timeout, on_close).await?;
        tracing::debug!(endpoint = %config.endpoint, "connected to CRI socket");
        Ok(CriClient {
            endpoint: config.endpoint.clone(),
            channel,
            call_timeout: config.call_timeout,
        })
    }

    pub fn endpoint(&self) -> &CriEndpoint {
        &self.endpoint
    }

    /// The underlying channel, for services this type does not wrap (e.g. a test creating pods,
    /// or containerd's own services served on the same socket).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// A raw RuntimeService client on this connection, without timeouts.
    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone())
    }

    /// Runs one call under the call timeout and maps its status.
    pub async fn timed<T, F>(&self, call: &'static str, fut: F) -> Result<T, CriError>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(self.call_timeout, fut).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) => Err(CriError::from_status(call, status)),
            Err(_) => {
                tracing::warn!(call, after = ?self.call_timeout, endpoint = %self.endpoint, "CRI call timed out");
                Err(CriError::Timeout {
                    call,
                    after: self.call_timeout,
                })
            }
        }
    }

    pub async fn version(&self) -> Result<api::VersionResponse, CriError> {
        let mut rt = self.runtime();
        self.timed(
            "Version",
            rt.version(api::VersionRequest {
                version: "v1".into(),
            }),
        )
        .await
    }

    pub async fn list_pod_sandboxes(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> Result<Vec<api::PodSandbox>, CriError> {
        let mut rt = self.runtime();
        let resp = self
            .timed(
                "ListPodSandbox",
                rt.list_pod_sandbox(api::ListPodSandboxRequest { filter }),
            )
            .await?;
        Ok(resp.items)
    }

    pub async fn pod_sandbox_status(&self, id: &str) -> Result<api::PodSandboxStatus, CriError> {
        let mut rt = self.runtime();
        let resp = self
            .timed(
                "PodSandboxStatus",
                rt.pod_sandbox_status(api::PodSandboxStatusRequest {
                    pod_sandbox_id: id.to_string(),
                    verbose: false,
                }),
            )
            .await?;
        resp.status
            .ok_or_else(|| missing("PodSandboxStatus", "status"))
    }

    pub async fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> Result<Vec<api::Container>, CriError> {
        let mut rt = self.runtime();
        let resp = self
            .timed(
                "ListContainers",
                rt.list_containers(api::ListContainersRequest { filter }),
            )
            .await?;
        Ok(resp.containers)
    }

    pub async fn container_status(&self, id: &str) -> Result<api::ContainerStatus, CriError> {
        let mut rt = self.runtime();
        let resp = self
            .timed(
                "ContainerStatus",
                rt.container_status(api::ContainerStatusRequest {
                    container_id: id.to_string(),
                    verbose: false,
                }),
            )
            .await?;
        resp.status
            .ok_or_else(|| missing("ContainerStatus", "status"))
    }

    /// The host pid of the container's init as the runtime reports it in its verbose status
    /// (containerd and CRI-O put `{"pid": N, ...}` under `info`); `None` where the runtime does
    /// not say. containerd keeps the pid after the container exited.
    pub async fn container_pid(&self, id: &str) -> Result<Option<u32>, CriError> {
        let mut rt = self.runtime();
        let resp = self
            .timed(
                "ContainerStatus",
                rt.container_status(api::ContainerStatusRequest {
                    container_id: id.to_string(),
                    verbose: true,
                }),
            )
            .await?;
        Ok(verbose_pid(&resp.info))
    }

    /// Subscribes to the runtime's container event stream (what kubelet's Evented PLEG consumes).
    /// containerd 1.6 does not offer it: that is [`CriError::Unimplemented`], check
    /// [`CriError::is_unimplemented`] and fall back.
    pub async fn get_container_events(&self) -> Result<ContainerEventStream, CriError> {
        let mut rt = self.runtime();
        let stream = self
            .timed(
                "GetContainerEvents",
                rt.get_container_events(api::GetEventsRequest {}),
            )
            .await?;
        Ok(ContainerEventStream { inner: stream })
    }
}

/// The `pid` of a verbose status's `info` JSON; 0 (not started) is none.
fn verbose_pid(info: &std::collections::HashMap<String, String>) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    v.get("pid")?
        .as_u64()
        .filter(|&p| p > 0)
        .and_then(|p| u32::try_from(p).ok())
}

fn missing(call: &'static str, field: &str) -> CriError {
    CriError::Rpc {
        call,
        status: Box::new(tonic::Status::internal(format!(
            "the runtime's answer has no {field}"
        ))),
    }
}

/// The stream of GetContainerEvents. Has no timeout: events come when containers change.
pub struct ContainerEventStream {
    inner: tonic::Streaming<api::ContainerEventResponse>,
}

impl ContainerEventStream {
    /// The next event; `None` when the runtime ended the stream.
    pub async fn next(&mut self) -> Option<Result<api::ContainerEventResponse, CriError>> {
        match self.inner.message().await {
            Ok(Some(ev)) => Some(Ok(ev)),
            Ok(None) => None,
            // A runtime may open the stream and only then refuse it.
            Err(status) => Some(Err(CriError::from_status("GetContainerEvents", status))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn verbose_pid_of_containerd_and_crio_info() {
        let info = |s: &str| [("info".to_string(), s.to_string())].into_iter().collect();
        assert_eq!(
            verbose_pid(&info(r#"{"sandboxID":"x","pid":4242,"removing":false}"#)),
            Some(4242)
        );
        assert_eq!(verbose_pid(&info(r#"{"pid":0}"#)), None, "not started");
        assert_eq!(verbose_pid(&info("not json")), None);
        assert_eq!(verbose_pid(&Default::default()), None);
    }

    /// A runtime that accepts connections and never answers: calls must time out, not hang.
    #[tokio::test]
    async fn hung_runtime_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hung.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let (s, _) = listener.accept().await.unwrap();
                held.push(s);
            }
        });
        let config =
            CriConfig::new(CriEndpoint::new(&path)).call_timeout(Duration::from_millis(300));
        let client = CriClient::connect(&config).await.unwrap();
        let start = Instant::now();
        let err = client.version().await.unwrap_err();
        let elapsed = start.elapsed();
        assert!(
            matches!(
                err,
                CriError::Timeout {
                    call: "Version",
                    ..
                }
            ),
            "{err}"
        );
        assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
        server.abort();
    }
}
