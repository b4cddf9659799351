//! Pod lifecycle events, with kubelet's PLEG semantics, plus OOM kills.
use std::fmt;

use crate::{
    cgroup::{ContainerId, PodUid, Runtime},
    kernel::{BootNs, Comm, LimitHit, OomKill, WaitStatus},
};

/// A container's death, as the PLEG sent it: what a death's status patch is made from.
#[derive(Clone, Debug)]
pub struct Death {
    pub pod: PodUid,
    pub container: ContainerId,
    pub at: BootNs,
    pub exit: ContainerExit,
}

/// kubelet's `PodLifeCycleEventType`, plus `OomKill`, which kubelet has no event for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlegEventType {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    /// The container changed state in a way none of the others says: it was created (kubelet
    /// maps "created" to unknown and reports it so), or its state is unknown after a resync.
    ContainerChanged,
    /// Re-read the whole pod: events for it were coalesced or lost, or its cgroup went away.
    PodSync,
    /// A process of the container was OOM-killed; the container may well still run.
    OomKill,
    /// A charge of the container's met a memory limit (its own, its pod's or an ancestor's) and
    /// the kernel reclaimed: kubelet has no such event either.
    LimitHit,
}

impl PlegEventType {
    pub const ALL: [PlegEventType; 7] = [
        Self::ContainerStarted,
        Self::ContainerDied,
        Self::ContainerRemoved,
        Self::ContainerChanged,
        Self::PodSync,
        Self::OomKill,
        Self::LimitHit,
    ];

    /// Position in [`Self::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ContainerStarted => "ContainerStarted",
            Self::ContainerDied => "ContainerDied",
            Self::ContainerRemoved => "ContainerRemoved",
            Self::ContainerChanged => "ContainerChanged",
            Self::PodSync => "PodSync",
            Self::OomKill => "OOMKill",
            Self::LimitHit => "MemoryLimitHit",
        }
    }
}

impl fmt::Display for PlegEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a container's init ended, in kubelet's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExitReason {
    /// Exit code 0.
    Completed,
    /// Non-zero exit code or a signal other than an OOM kill.
    Error,
    /// The kernel's OOM killer chose the container's init.
    OomKilled,
    /// The container stopped and its exit was never seen (its cgroup emptied or vanished, or the
    /// kernel dropped the record): kubelet's ContainerStatusUnknown.
    Unknown,
}

impl ExitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "Completed",
            Self::Error => "Error",
            Self::OomKilled => "OOMKilled",
            Self::Unknown => "ContainerStatusUnknown",
        }
    }

    /// The reason for an init that ended with `status`, given whether the kernel saw it OOM-killed.
    pub fn of(status: WaitStatus, oom_killed: bool) -> Self {
        if oom_killed {
            Self::OomKilled
        } else if status.code() == Some(0) {
            Self::Completed
        } else {
            Self::Error
        }
    }
}

/// How a container ended, as the kernel saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerExit {
    /// `None` when the exit itself was not seen ([`ExitReason::Unknown`]).
    pub status: Option<WaitStatus>,
    pub reason: ExitReason,
    /// The init process.
    pub pid: Option<u32>,
    pub comm: Option<Comm>,
}

impl ContainerExit {
    /// kubelet's exit code for a lost container is 137.
    pub fn exit_code(&self) -> i32 {
        self.status.map_or(137, WaitStatus::exit_code)
    }

    /// The OOM killer's kill of `victim` was read after this exit: the kernel sends the SIGKILL
    /// before it marks the victim, and a victim that exits at once is read first. An init that
    /// died of that SIGKILL was OOM-killed. Returns whether the reason changed.
    pub fn killed_by_oom(&mut self, victim: u32) -> bool {
        let sigkilled = self.status.is_some_and(WaitStatus::sigkilled);
        if self.pid != Some(victim) || !sigkilled || self.reason == ExitReason::OomKilled {
            return false;
        }
        self.reason = ExitReason::OomKilled;
        true
    }
}

/// What happened, with the data each kind carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlegEvent {
    /// The container's init started: its pid and command name.
    ContainerStarted {
        id: ContainerId,
        pid: u32,
        comm: Comm,
    },
    ContainerDied {
        id: ContainerId,
        exit: ContainerExit,
    },
    ContainerRemoved {
        id: ContainerId,
    },
    /// See [`PlegEventType::ContainerChanged`].
    ContainerChanged {
        id: ContainerId,
    },
    /// Re-read the whole pod.
    PodSync,
    /// A process of the container was OOM-killed (the container may well still run).
    OomKill {
        id: ContainerId,
        kill: Box<OomKill>,
        /// The container whose allocation invoked the OOM killer, when it is a container known
        /// here (with a pod-level limit, a sibling of the victim's).
        trigger: Option<ContainerId>,
    },
    /// A charge of the container met a memory limit (summed, see [`LimitHit`]).
    LimitHit {
        id: ContainerId,
        hit: Box<LimitHit>,
        /// The container's cgroup path, hierarchy-relative: the memory cgroup at its limit is
        /// this one or one of its parents.
        cgroup: std::sync::Arc<str>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    pub pod_uid: PodUid,
    /// `None` where the cgroup name does not tell (containerd and docker share `<pod>/<id>`), and
    /// for [`PlegEvent::PodSync`].
    pub runtime: Option<Runtime>,
    /// Kernel time of what caused the event.
    pub at: BootNs,
    pub event: PlegEvent,
}

impl PodLifecycleEvent {
    /// "Re-read this pod".
    pub(crate) fn pod_sync(pod_uid: PodUid, at: BootNs) -> Self {
        Self {
            pod_uid,
            runtime: None,
            at,
            event: PlegEvent::PodSync,
        }
    }

    pub fn kind(&self) -> PlegEventType {
        match &self.event {
            PlegEvent::ContainerStarted { .. } => PlegEventType::ContainerStarted,
            PlegEvent::ContainerDied { .. } => PlegEventType::ContainerDied,
            PlegEvent::ContainerRemoved { .. } => PlegEventType::ContainerRemoved,
            PlegEvent::ContainerChanged { .. } => PlegEventType::ContainerChanged,
            PlegEvent::PodSync => PlegEventType::PodSync,
            PlegEvent::OomKill { .. } => PlegEventType::OomKill,
            PlegEvent::LimitHit { .. } => PlegEventType::LimitHit,
        }
    }

    /// The container, for every kind but PodSync.
    pub fn container_id(&self) -> Option<ContainerId> {
        match &self.event {
            PlegEvent::ContainerStarted { id, .. }
            | PlegEvent::ContainerDied { id, .. }
            | PlegEvent::ContainerRemoved { id }
            | PlegEvent::ContainerChanged { id }
            | PlegEvent::OomKill { id, .. }
            | PlegEvent::LimitHit { id, .. } => Some(*id),
            PlegEvent::PodSync => None,
        }
    }

    pub fn exit(&self) -> Option<&ContainerExit> {
        match &self.event {
            PlegEvent::ContainerDied { exit, .. } => Some(exit),
            _ => None,
        }
    }

    pub fn oom(&self) -> Option<&OomKill> {
        match &self.event {
            PlegEvent::OomKill { kill, .. } => Some(kill),
            _ => None,
        }
    }
}
