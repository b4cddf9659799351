//! What the runtime says about one pod: its sandboxes and the full status of each container.
use std::collections::HashMap;

use k8s_cri::v1 as api;

use crate::{
    cgroup::PodUid,
    cri::{keys, CriError, ReconnectingCri},
};

#[derive(Debug, Default)]
pub struct PodSnapshot {
    pub sandboxes: Vec<api::PodSandbox>,
    pub containers: Vec<api::ContainerStatus>,
}

pub async fn fetch_pod(cri: &ReconnectingCri, uid: PodUid) -> Result<PodSnapshot, CriError> {
    let client = cri.client()?;
    let selector: HashMap<String, String> = [(keys::POD_UID.to_string(), uid.to_string())].into();
    let sandbox_filter = api::PodSandboxFilter {
        label_selector: selector.clone(),
        ..Default::default()
    };
    let container_filter = api::ContainerFilter {
        label_selector: selector,
        ..Default::default()
    };
    let (sandboxes, containers) = tokio::try_join!(
        client.list_pod_sandboxes(Some(sandbox_filter)),
        client.list_containers(Some(container_filter))
    )?;
    let mut statuses = Vec::with_capacity(containers.len());
    for c in containers {
        match client.container_status(&c.id).await {
            Ok(s) => statuses.push(s),
            // Removed between the list and the status call: it is simply gone.
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(PodSnapshot {
        sandboxes,
        containers: statuses,
    })
}
