//! The reconciled view of this node: what the runtime says, corrected by what the kernel saw.
use std::time::SystemTime;

use crate::cgroup::{ContainerId, PodUid};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerPhase {
    Created,
    Running,
    Exited,
    Unknown,
}

/// An OOM kill as the kernel saw it: the truth kubelet does not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomEvidence {
    pub time: SystemTime,
    pub container_id: ContainerIdStr,
    pub pid: u32,
    pub comm: String,
    /// The container's init was the victim (the container died of it).
    pub init: bool,
    pub anon_rss_kb: Option<u64>,
    pub total_vm_kb: Option<u64>,
    pub oom_score_adj: Option<i16>,
}

/// Container ids serialize as their hex string.
pub type ContainerIdStr = String;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerView {
    pub id: ContainerIdStr,
    /// The name in the pod spec.
    pub name: String,
    /// kubelet's restart count for this instance (its `restartCount` annotation, else the attempt).
    pub restart_count: u32,
    pub image: String,
    pub phase: ContainerPhase,
    pub created_at: Option<SystemTime>,
    pub started_at: Option<SystemTime>,
    pub finished_at: Option<SystemTime>,
    pub exit_code: Option<i32>,
    pub signal: Option<u8>,
    /// Completed, Error, OOMKilled, ContainerStatusUnknown, or the runtime's own reason.
    pub reason: Option<String>,
    /// What the runtime said, where it disagrees with the kernel (kept for audit).
    pub runtime_reason: Option<String>,
    pub runtime_exit_code: Option<i32>,
    /// The init's pid on the host, where the kernel saw it start.
    pub init_pid: Option<u32>,
    pub oom_kills: u32,
    pub last_oom: Option<OomEvidence>,
    /// The kernel saw this container (its cgroup, processes or death).
    pub kernel_seen: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub sandbox_id: String,
    pub sandbox_ready: bool,
    pub created_at: Option<SystemTime>,
    /// Every container instance the runtime still has, newest attempt last per name.
    pub containers: Vec<ContainerView>,
    pub last_oom: Option<OomEvidence>,
}

impl PodView {
    /// The newest instance of each named container.
    pub fn current(&self) -> impl Iterator<Item = &ContainerView> {
        self.containers.iter().filter(|c| {
            !self
                .containers
                .iter()
                .any(|o| o.name == c.name && newer(o, c))
        })
    }

    /// kubectl's READY column: running containers / containers.
    pub fn ready(&self) -> (usize, usize) {
        let cur: Vec<_> = self.current().collect();
        (
            cur.iter()
                .filter(|c| c.phase == ContainerPhase::Running)
                .count(),
            cur.len(),
        )
    }

    /// kubectl's RESTARTS column: the sum of the current instances' restart counts.
    pub fn restarts(&self) -> u32 {
        self.current().map(|c| c.restart_count).sum()
    }

    /// kubectl's STATUS column, from what CRI and the kernel know (kubelet's pod spec is not
    /// here, so the restart policy is inferred: a container that already restarted and is down
    /// is in CrashLoopBackOff).
    pub fn status(&self) -> String {
        if !self.sandbox_ready && self.current().all(|c| c.phase != ContainerPhase::Running) {
            return if self.containers.is_empty() {
                "SandboxNotReady".into()
            } else {
                "Terminated".into()
            };
        }
        let cur: Vec<_> = self.current().collect();
        if cur.is_empty() {
            return "ContainerCreating".into();
        }
        // The most telling container decides, as in kubectl: a waiting or terminated reason
        // beats Running.
        for c in &cur {
            if c.phase == ContainerPhase::Exited && c.restart_count > 0 {
                return "CrashLoopBackOff".into();
            }
        }
        for c in &cur {
            if c.phase == ContainerPhase::Exited {
                if let Some(r) = &c.reason {
                    if r != "Completed" {
                        return r.clone();
                    }
                }
            }
        }
        if cur.iter().any(|c| c.phase == ContainerPhase::Created) {
            return "ContainerCreating".into();
        }
        if cur.iter().all(|c| c.phase == ContainerPhase::Exited) {
            return "Completed".into();
        }
        if cur.iter().any(|c| c.phase == ContainerPhase::Unknown) {
            return "Unknown".into();
        }
        "Running".into()
    }
}

fn newer(a: &ContainerView, b: &ContainerView) -> bool {
    (a.restart_count, a.created_at) > (b.restart_count, b.created_at)
}

/// Identifies a container view; parsed ids are kept apart from the strings the view shows.
pub fn id_str(id: &ContainerId) -> ContainerIdStr {
    id.as_str().to_string()
}

pub fn uid_str(uid: &PodUid) -> String {
    uid.as_str().to_string()
}
