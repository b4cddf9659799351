//! The reconciled view of this node: what the runtime says, corrected by what the kernel saw.
use std::time::SystemTime;

use crate::{
    kernel::oom_report::SharedReport,
    model::{ContainerId, PodUid},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerPhase {
    Created,
    Running,
    Exited,
    Unknown,
}

/// How the agent knows what it shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The probes saw it happen.
    Kernel,
    /// The kernel's log of OOM kills, read at start-up (kills from before the agent ran).
    KernelLog,
    /// Only the runtime's account: the agent did not watch, and the kernel log does not (or no
    /// longer) say.
    Runtime,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::KernelLog => "kernel-log",
            Self::Runtime => "runtime",
        }
    }
}

/// Which limit an OOM kill hit, as the kernel's report names it; never guessed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OomScope {
    /// The container's own limit: its memory cgroup is the one that ran out.
    Container,
    /// The pod's limit (its cgroup above the containers): a sibling's memory counts too.
    Pod,
    /// Another cgroup above the container's ran out: a QoS class or kubepods (the node's
    /// allocatable), or a cgroup outside kubelet's layout.
    Cgroup(String),
    /// The node's memory: a global OOM, no cgroup limit was hit.
    Node,
    /// Not known, and why.
    Unknown(ScopeUnknown),
}

/// Why an OOM kill's scope is not known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScopeUnknown {
    /// The probes saw the kill; the kernel log's report of it has not been read (it comes
    /// milliseconds later, or the log cannot be read).
    LogNotRead,
    /// The kernel log kept only part of the report (the ring overwrote the rest).
    ReportIncomplete,
    /// The report's `oom-kill:` line could not be read one way only (names holding its
    /// separators), so it was not believed.
    ReportRefused,
    /// The kernel printed no report of this kill, only its victim: `oom_kill_process` prints
    /// at most 10 reports in 5 s.
    ReportNotPrinted,
}

impl OomScope {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Container => "container",
            Self::Pod => "pod",
            Self::Cgroup(_) => "cgroup",
            Self::Node => "node",
            Self::Unknown(_) => "unknown",
        }
    }
}

/// An OOM kill as the kernel saw it: the truth kubelet does not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomEvidence {
    pub time: SystemTime,
    pub container_id: ContainerId,
    pub pid: u32,
    pub comm: String,
    /// The container's init was the victim (the container died of it). `None` when the init's pid
    /// is not known (a kill from the kernel log in a container the agent never saw run, whose
    /// runtime does not report the pid).
    pub init: Option<bool>,
    pub anon_rss_kb: Option<u64>,
    pub total_vm_kb: Option<u64>,
    pub oom_score_adj: Option<i16>,
    /// The whole container was killed together (`memory.oom.group`, kubelet's default on cgroup
    /// v2): one report for all its processes, its init among them.
    pub group: bool,
    /// The memory cgroup whose limit was hit, where it is not the victim's own (a pod-level
    /// limit), hierarchy-relative.
    pub oom_cgroup: Option<String>,
    /// That cgroup's limit at the kill, in bytes, where known.
    pub limit_bytes: Option<u64>,
    /// The process whose allocation invoked the OOM killer, and its container where known: with
    /// a pod-level limit it can be a sibling of the victim's.
    pub trigger_pid: Option<u32>,
    pub trigger_container: Option<ContainerId>,
    /// The probes (`Kernel`) or the kernel log (`KernelLog`).
    pub source: Source,
    /// Which limit was hit.
    pub scope: OomScope,
    /// The kernel log's whole report of the kill, where it was read.
    pub report: Option<SharedReport>,
}

/// The most of a runtime's message kept: kubelet's bound on a termination message
/// (`MaxContainerTerminationMessageLength`, 4 KiB).
pub(crate) const MAX_RUNTIME_MESSAGE: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerView {
    pub id: ContainerId,
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
    /// How the termination shown (exit code and reason) is known; `None` while it runs.
    pub exit_source: Option<Source>,
    /// What the runtime said, where it disagrees with the kernel (kept for audit).
    pub runtime_reason: Option<String>,
    pub runtime_exit_code: Option<i32>,
    /// An exited container's message as kubelet makes it: the runtime's (a start that failed:
    /// containerd's `failed to create containerd task: …` with reason StartError, at most
    /// [`MAX_RUNTIME_MESSAGE`] bytes), then `: ` and the container's own termination message.
    pub message: Option<String>,
    /// The message also holds the container's own termination message, read from the node's
    /// files as kubelet reads them (`reconcile::termination`): kubelet's copy is not needed.
    pub message_complete: bool,
    /// The init's pid on the host: where the kernel saw it start, else the runtime's.
    pub init_pid: Option<u32>,
    pub oom_kills: u32,
    pub last_oom: Option<OomEvidence>,
    /// The kernel saw this container (its cgroup, processes or death).
    pub kernel_seen: bool,
    /// Its memory pressure, as of the last warning raised, measured or lowered (the figures of
    /// every limit hit in between are in the metrics, not here: a view change is a status write).
    pub memory: Option<Box<crate::pressure::Pressure>>,
}

impl ContainerView {
    /// An instance of which only its id, name and phase are known yet: the rest is filled in
    /// as the runtime's and the kernel's accounts come.
    pub fn new(id: ContainerId, name: impl Into<String>, phase: ContainerPhase) -> Self {
        Self {
            id,
            name: name.into(),
            restart_count: 0,
            image: String::new(),
            phase,
            created_at: None,
            started_at: None,
            finished_at: None,
            exit_code: None,
            signal: None,
            reason: None,
            exit_source: None,
            runtime_reason: None,
            runtime_exit_code: None,
            message: None,
            message_complete: false,
            init_pid: None,
            oom_kills: 0,
            last_oom: None,
            kernel_seen: false,
            memory: None,
        }
    }
}

impl ContainerView {
    /// With the memory pressure the view shows.
    pub(crate) fn with_memory(mut self, memory: Option<Box<crate::pressure::Pressure>>) -> Self {
        self.memory = memory;
        self
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    pub uid: PodUid,
    pub namespace: String,
    pub name: String,
    pub sandbox_id: ContainerId,
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

    /// The instance of `name` that ran before the current one, if it ended: kubectl's
    /// "Last State".
    pub fn last_terminated(&self, name: &str) -> Option<&ContainerView> {
        let current = self.current().find(|c| c.name == name)?;
        self.containers
            .iter()
            .filter(|c| c.name == name && c.id != current.id && c.phase == ContainerPhase::Exited)
            .max_by_key(|c| (c.restart_count, c.created_at))
    }

    /// Running containers / containers of the view (the table's READY is the computed
    /// status's, `present::print`).
    pub fn ready(&self) -> (usize, usize) {
        let cur: Vec<_> = self.current().collect();
        (
            cur.iter()
                .filter(|c| c.phase == ContainerPhase::Running)
                .count(),
            cur.len(),
        )
    }

    /// The sum of the current instances' restart counts.
    pub fn restarts(&self) -> u32 {
        self.current().map(|c| c.restart_count).sum()
    }
}

fn newer(a: &ContainerView, b: &ContainerView) -> bool {
    (a.restart_count, a.created_at) > (b.restart_count, b.created_at)
}
