//! What the runtime says about one pod: its sandboxes and the full status of each container.
use std::{
    collections::HashMap,
    sync::atomic::{AtomicBool, Ordering},
};

use k8s_cri::v1 as api;

use super::{
    runtime::RuntimeService,
    termination::{self, TerminationMessage},
};
use crate::{
    cri::{keys, CriError},
    model::PodUid,
};

#[derive(Debug, Default)]
pub(crate) struct PodSnapshot {
    pub sandboxes: Vec<api::PodSandbox>,
    pub containers: Vec<api::ContainerStatus>,
    /// The init's pid of dead containers whose account may hinge on it (the runtime says
    /// OOMKilled, or SIGKILL): whether the kernel log's kill was the init's.
    pub pids: HashMap<String, u32>,
    /// The termination message of each exited container, as read from the node's files.
    pub messages: HashMap<String, TerminationMessage>,
}

/// Once per process: the node's files kubelet reads termination messages from are not visible
/// here, which is a deployment choice (deploy/README.md, "Termination messages"), not a fault.
fn said_unreadable(m: &TerminationMessage) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if let TerminationMessage::Unreadable(why) = m {
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::info!(
                why = %why,
                "termination messages come from kubelet's status in the API: the agent cannot read \
                 them from the node; mount kubelet's pods directory and /var/log/pods read-only \
                 to have them at once (deploy/README.md, \"Termination messages\")"
            );
        }
    }
}

pub(crate) async fn fetch_pod<R: RuntimeService>(
    cri: &R,
    uid: PodUid,
) -> Result<PodSnapshot, CriError> {
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
        cri.list_pod_sandboxes(Some(sandbox_filter)),
        cri.list_containers(Some(container_filter))
    )?;
    let mut statuses = Vec::with_capacity(containers.len());
    let mut pids = HashMap::new();
    let mut messages = HashMap::new();
    for c in containers {
        match cri.container_status(&c.id).await {
            Ok(s) => {
                let exited = s.state == api::ContainerState::ContainerExited as i32;
                if exited && (s.reason == "OOMKilled" || s.exit_code == 137) {
                    match cri.container_pid(&c.id).await {
                        Ok(Some(pid)) => {
                            pids.insert(c.id.clone(), pid);
                        }
                        Ok(None) => {}
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e),
                    }
                }
                if let Some(m) = termination::read(&s) {
                    said_unreadable(&m);
                    messages.insert(c.id.clone(), m);
                }
                statuses.push(s);
            }
            // Removed between the list and the status call: it is simply gone.
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(PodSnapshot {
        sandboxes,
        containers: statuses,
        pids,
        messages,
    })
}
