//! Typed kernel events: what the decoder makes of ring-buffer records. Everything above the
//! decoder (PLEG, `observer watch`) works on these and can be tested without a kernel.
use std::fmt;

pub use crate::model::BootNs;

/// A task name as the kernel keeps it: at most 15 bytes, stored inline so events don't allocate.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Comm {
    bytes: [u8; 16],
    len: u8,
}

impl Comm {
    pub(crate) fn from_nul_terminated(raw: &[u8]) -> Self {
        let len = raw
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(raw.len())
            .min(16);
        let mut bytes = [0; 16];
        bytes[..len].copy_from_slice(&raw[..len]);
        Self {
            bytes,
            len: len as u8,
        }
    }

    /// Lossy: comm is whatever bytes the program set, not necessarily UTF-8.
    pub fn as_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.bytes[..self.len as usize])
    }
}

impl fmt::Display for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str())
    }
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl From<&str> for Comm {
    fn from(s: &str) -> Self {
        Self::from_nul_terminated(s.as_bytes())
    }
}

/// The task that was current when the kernel wrote the event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Task {
    /// Thread id.
    pub pid: u32,
    /// Process id (thread group).
    pub tgid: u32,
    /// Parent's process id.
    pub ppid: u32,
    /// Pid in the task's own pid namespace (1: a container's init) and the namespace's depth
    /// (0: the host's).
    pub ns_pid: u32,
    pub ns_level: u32,
    pub comm: Comm,
    /// cgroup v2 id (inode number of the cgroup's directory on the cgroup2 mount).
    pub cgroup_id: u64,
}

/// A wait status as the kernel stores it in `task_struct.exit_code`.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct WaitStatus(pub u32);

impl Task {
    /// Pid 1 of a pid namespace other than the host's: a container's init.
    #[cfg(test)]
    pub(crate) fn is_namespace_init(&self) -> bool {
        self.ns_level > 0 && self.ns_pid == 1
    }
}

impl WaitStatus {
    pub fn exited(code: u8) -> Self {
        Self(u32::from(code) << 8)
    }

    #[cfg(test)]
    pub(crate) fn signaled(signal: u8, core_dumped: bool) -> Self {
        Self(u32::from(signal & 0x7f) | if core_dumped { 0x80 } else { 0 })
    }

    /// The terminating signal, when the process was killed by one.
    pub fn signal(self) -> Option<u8> {
        match (self.0 & 0x7f) as u8 {
            0 => None,
            s => Some(s),
        }
    }

    /// `exit(code)`'s code when the process exited normally.
    pub fn code(self) -> Option<u8> {
        self.signal()
            .is_none()
            .then_some(((self.0 >> 8) & 0xff) as u8)
    }

    /// Killed by SIGKILL: how the OOM killer (and a runtime's last resort) ends a process.
    pub fn sigkilled(self) -> bool {
        self.signal() == Some(nix::sys::signal::Signal::SIGKILL as u8)
    }

    pub fn core_dumped(self) -> bool {
        self.signal().is_some() && self.0 & 0x80 != 0
    }

    /// The status as a shell and container runtimes show it: the code, or 128 + signal.
    pub fn exit_code(self) -> i32 {
        match self.signal() {
            Some(s) => 128 + i32::from(s),
            None => i32::from(self.code().unwrap_or(0)),
        }
    }
}

impl fmt::Debug for WaitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.signal() {
            Some(s) => write!(
                f,
                "signal {s}{}",
                if self.core_dumped() {
                    " (core dumped)"
                } else {
                    ""
                }
            ),
            None => write!(f, "exit {}", self.code().unwrap_or(0)),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exec {
    pub at: BootNs,
    pub task: Task,
    /// Thread id before exec: differs from `task.pid` when a non-leader thread exec'd.
    pub old_pid: u32,
    pub filename: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    pub at: BootNs,
    pub task: Task,
    pub status: WaitStatus,
    /// This was the last thread: the process is gone.
    pub group_dead: bool,
}

/// Memory of the victim when the OOM killer chose it, in kB; `None` where the kernel's
/// `mark_victim` lacks the field (before Linux 6.8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomMemory {
    pub total_vm_kb: Option<u64>,
    pub anon_rss_kb: Option<u64>,
    pub file_rss_kb: Option<u64>,
    pub shmem_rss_kb: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomKill {
    /// When the victim exited.
    pub at: BootNs,
    /// When the OOM killer chose it.
    pub marked_at: BootNs,
    /// The killed thread, with its own cgroup.
    pub victim: Task,
    /// Name the OOM killer reported (the victim's comm when it was chosen).
    pub victim_comm: Comm,
    pub memory: OomMemory,
    pub oom_score_adj: Option<i16>,
    /// The task whose allocation invoked the OOM killer and its cgroup: with a pod-level limit this
    /// can be a sibling container of the victim.
    pub trigger_pid: u32,
    pub trigger_tgid: u32,
    pub trigger_cgroup_id: u64,
}

/// Reclaim in a memory cgroup at its limit, summed since the cgroup's previous record
/// (observer_common::memcg): the kernel's own word that a charge met the limit. Or, with
/// [`Self::crossing`], a charge that took the cgroup's usage past a threshold of its limit, before
/// it is met (observer-ebpf/src/charge.rs): no reclaim then, and no hits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitHit {
    /// The last reclaim summed.
    pub at: BootNs,
    /// The first reclaim summed.
    pub first_at: BootNs,
    /// The task whose charge met the limit, with its own cgroup.
    pub task: Task,
    /// The memory cgroup at its limit: the inode number of its directory in the hierarchy the
    /// memory controller lives in (cgroup2, or v1's memory hierarchy). The task's own or an
    /// ancestor's (a pod-level limit).
    pub memcg_id: u64,
    /// Its usage and limit after the last reclaim, in bytes; `limit_bytes` is `None` when the
    /// cgroup has no limit (reclaim for `memory.high`, or asked for by a write).
    pub usage_bytes: u64,
    pub limit_bytes: Option<u64>,
    /// Reclaims summed; of them, those that freed less than asked.
    pub hits: u64,
    pub short: u64,
    /// Bytes asked for and freed, summed.
    pub requested_bytes: u64,
    pub reclaimed_bytes: u64,
    /// Not a limit hit: the threshold of the limit the usage rose past.
    pub crossing: Option<Crossing>,
}

/// A threshold of a memory limit a charge took the usage past (observer_common::memcg's
/// `CrossingRecord`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crossing {
    /// In basis points of the limit (8600: 86 %).
    pub threshold_bp: u32,
    /// How far above the charged memory cgroup the limit is (0: its own; 1: its parent's, a
    /// container's pod).
    pub depth: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupChange {
    pub at: BootNs,
    pub id: u64,
    pub level: u32,
    /// Hierarchy id: 0 for cgroup2.
    pub hierarchy: u32,
    /// Path relative to the hierarchy's root, e.g. `/kubepods/burstable/pod<uid>/<id>`.
    pub path: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelEvent {
    Exec(Exec),
    Exit(Exit),
    OomKill(OomKill),
    LimitHit(LimitHit),
    CgroupMkdir(CgroupChange),
    CgroupRmdir(CgroupChange),
    /// The cgroup's last process left (cgroup2 `populated` went to 0).
    CgroupEmpty(CgroupChange),
    /// Records the kernel could not put in the ring buffer since the last `Lost`: whatever they
    /// said is gone, so anything derived from the stream must be resynced.
    Lost {
        at: BootNs,
        records: u64,
    },
}

impl KernelEvent {
    pub fn at(&self) -> BootNs {
        match self {
            Self::Exec(e) => e.at,
            Self::Exit(e) => e.at,
            Self::OomKill(e) => e.at,
            Self::LimitHit(e) => e.at,
            Self::CgroupMkdir(c) | Self::CgroupRmdir(c) | Self::CgroupEmpty(c) => c.at,
            Self::Lost { at, .. } => *at,
        }
    }

    /// Every [`Self::type_name`], in [`Self::type_index`] order.
    pub(crate) const TYPES: [&'static str; 9] = [
        "exec",
        "exit",
        "oom_kill",
        "cgroup_mkdir",
        "cgroup_rmdir",
        "cgroup_empty",
        "lost",
        "limit_hit",
        "limit_crossing",
    ];

    pub(crate) fn type_index(&self) -> usize {
        match self {
            Self::Exec(_) => 0,
            Self::Exit(_) => 1,
            Self::OomKill(_) => 2,
            Self::CgroupMkdir(_) => 3,
            Self::CgroupRmdir(_) => 4,
            Self::CgroupEmpty(_) => 5,
            Self::Lost { .. } => 6,
            Self::LimitHit(h) if h.crossing.is_some() => 8,
            Self::LimitHit(_) => 7,
        }
    }

    /// The `type` name of `observer watch --format json`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Exec(_) => "exec",
            Self::Exit(_) => "exit",
            Self::OomKill(_) => "oom_kill",
            Self::CgroupMkdir(_) => "cgroup_mkdir",
            Self::CgroupRmdir(_) => "cgroup_rmdir",
            Self::CgroupEmpty(_) => "cgroup_empty",
            Self::Lost { .. } => "lost",
            Self::LimitHit(h) if h.crossing.is_some() => "limit_crossing",
            Self::LimitHit(_) => "limit_hit",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_status() {
        let s = WaitStatus(42 << 8);
        assert_eq!(
            (s.code(), s.signal(), s.core_dumped(), s.exit_code()),
            (Some(42), None, false, 42)
        );
        let k = WaitStatus(9);
        assert_eq!((k.code(), k.signal(), k.exit_code()), (None, Some(9), 137));
        let segv = WaitStatus(11 | 0x80);
        assert_eq!(
            (segv.signal(), segv.core_dumped(), segv.exit_code()),
            (Some(11), true, 139)
        );
        assert_eq!(WaitStatus::exited(3), WaitStatus(0x300));
        assert_eq!(WaitStatus::signaled(6, true), WaitStatus(0x86));
        assert_eq!(format!("{:?}", WaitStatus(0x86)), "signal 6 (core dumped)");
    }

    #[test]
    fn type_index_matches_the_names() {
        let lost = KernelEvent::Lost {
            at: BootNs(1),
            records: 1,
        };
        assert_eq!(KernelEvent::TYPES[lost.type_index()], lost.type_name());
    }

    #[test]
    fn comm() {
        assert_eq!(Comm::from_nul_terminated(b"sh\0garbage").as_str(), "sh");
        assert_eq!(
            Comm::from_nul_terminated(b"0123456789abcdefXYZ").as_str(),
            "0123456789abcdef"
        );
        assert_eq!(
            Comm::from_nul_terminated(&[0xff, b'a', 0]).as_str(),
            "\u{fffd}a"
        );
    }
}
