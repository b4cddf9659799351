//! What the reconciler asks the runtime, behind a trait: the CRI calls it makes and the
//! connection's generations. Its tests drive it with a fake runtime (kubelet's generic PLEG is
//! tested the same way); the agent passes [`ReconnectingCri`].
use std::{future::Future, time::Duration};

use k8s_cri::v1 as api;
use tokio::sync::watch;

use crate::cri::{ConnectionState, ContainerEventStream, CriError, ReconnectingCri};

pub trait RuntimeService: Clone + Send + Sync + 'static {
    fn list_pod_sandboxes(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> impl Future<Output = Result<Vec<api::PodSandbox>, CriError>> + Send;

    fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> impl Future<Output = Result<Vec<api::Container>, CriError>> + Send;

    fn container_status(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<api::ContainerStatus, CriError>> + Send;

    /// The init's pid from the verbose status; `None` where the runtime does not say.
    fn container_pid(&self, id: &str)
        -> impl Future<Output = Result<Option<u32>, CriError>> + Send;

    /// The connection's state: a new generation means the runtime may have changed unseen.
    fn connection(&self) -> watch::Receiver<ConnectionState>;

    /// GetContainerEvents, where the runtime offers it.
    fn container_events(
        &self,
    ) -> impl Future<Output = Result<ContainerEventStream, CriError>> + Send;

    /// What the runtime calls itself (CRI Version's `runtime_name`), waiting up to `wait` for it
    /// to answer; `None` where it does not say.
    fn name(&self, _wait: Duration) -> impl Future<Output = Option<String>> + Send {
        std::future::ready(None)
    }

    /// Whether the runtime answers within `wait`.
    fn wait_connected(&self, wait: Duration) -> impl Future<Output = bool> + Send {
        let mut conn = self.connection();
        async move {
            tokio::time::timeout(wait, conn.wait_for(|s| s.connected))
                .await
                .is_ok_and(|r| r.is_ok())
        }
    }
}

impl RuntimeService for ReconnectingCri {
    fn list_pod_sandboxes(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> impl Future<Output = Result<Vec<api::PodSandbox>, CriError>> + Send {
        ReconnectingCri::list_pod_sandboxes(self, filter)
    }

    fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> impl Future<Output = Result<Vec<api::Container>, CriError>> + Send {
        ReconnectingCri::list_containers(self, filter)
    }

    fn container_status(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<api::ContainerStatus, CriError>> + Send {
        ReconnectingCri::container_status(self, id)
    }

    fn container_pid(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<u32>, CriError>> + Send {
        ReconnectingCri::container_pid(self, id)
    }

    fn connection(&self) -> watch::Receiver<ConnectionState> {
        self.subscribe()
    }

    fn container_events(
        &self,
    ) -> impl Future<Output = Result<ContainerEventStream, CriError>> + Send {
        self.get_container_events()
    }

    async fn name(&self, wait: Duration) -> Option<String> {
        let client = ReconnectingCri::wait_connected(self, wait).await.ok()?;
        client.version().await.ok().map(|v| v.runtime_name)
    }

    async fn wait_connected(&self, wait: Duration) -> bool {
        ReconnectingCri::wait_connected(self, wait).await.is_ok()
    }
}
