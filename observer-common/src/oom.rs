//! `oom/mark_victim`, completed at the victim's exit.
//!
//! The tracepoint runs in the task whose allocation failed, not in the victim, so the victim's cgroup
//! is not current there. The kernel side stores an [`OomPending`] keyed by the victim's pid and sends
//! the [`OomRecord`] when that thread exits, where the current cgroup is the victim's own.
//!
//! The kernel sends the victim its SIGKILL *before* `mark_victim` fires; a victim woken on another
//! CPU (or preempting the allocating task on its own) can exit first. So the two meet in one map
//! entry per thread id, an [`OomMeeting`]: each SIGKILLed thread's exit leaves a [`KilledExit`],
//! each mark an [`OomPending`], and whichever side finds the other's half there sends the record.
use crate::{EventKind, Header, Record, TaskInfo, COMM_LEN};

/// What `mark_victim` saw, kept until the victim exits.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OomPending {
    /// Boot time of `mark_victim`.
    pub marked_ns: u64,
    /// Memory figures in kB as the tracepoint reports them; u64::MAX where this kernel lacks them.
    pub total_vm_kb: u64,
    pub anon_rss_kb: u64,
    pub file_rss_kb: u64,
    pub shmem_rss_kb: u64,
    /// The task that allocated and triggered the OOM killer, and its cgroup.
    pub trigger_pid: u32,
    pub trigger_tgid: u32,
    pub trigger_cgroup_id: u64,
    /// From the tracepoint, or where it lacks the field (before Linux 6.8) from the victim's
    /// `signal_struct` at its exit.
    pub oom_score_adj: i16,
    /// 1 when `oom_score_adj` was read.
    pub has_oom_score_adj: u8,
    pub _pad: [u8; 5],
    /// The victim's comm as the tracepoint reports it (before Linux 6.8, which has no comm there:
    /// the victim's own at its exit).
    pub comm: [u8; COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OomRecord {
    /// `time_ns` is the victim's exit; `pending.marked_ns` when the OOM killer chose it.
    pub header: Header,
    /// The victim, current at its exit: its own pid, comm and cgroup.
    pub victim: TaskInfo,
    pub pending: OomPending,
}

/// A thread that exited of SIGKILL, kept briefly in case `mark_victim` names it after its exit.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilledExit {
    /// Boot time of the exit.
    pub exit_ns: u64,
    /// The thread, current at its exit.
    pub task: TaskInfo,
}

/// One thread id's half of an OOM kill's meeting (observer-ebpf/src/oom.rs): written by whichever
/// of the mark and the SIGKILLed exit comes first, with an insert that fails where an entry is
/// already there, so that the second one always sees the first (two maps, each side writing its
/// own and reading the other's, can miss each other: a store may pass a later load).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct OomMeeting {
    /// [`MEETING_MARK`] or [`MEETING_EXIT`]: which half `half` is.
    pub side: u64,
    pub half: MeetingHalf,
}

/// The half of an [`OomMeeting`] that is there: a union, so the entry (and the BPF stack that
/// builds it) holds only the larger of the two.
#[repr(C)]
#[derive(Clone, Copy)]
pub union MeetingHalf {
    pub pending: OomPending,
    pub exit: KilledExit,
}

/// The OOM killer marked this thread; its exit has not been seen.
pub const MEETING_MARK: u64 = 1;
/// This thread exited of SIGKILL; no mark named it (yet, or ever: most SIGKILLs are not the OOM
/// killer's).
pub const MEETING_EXIT: u64 = 2;

/// How long after a SIGKILLed exit a `mark_victim` for the same thread id still counts as its
/// kill: the two are microseconds apart in the race; far past this the id may have been reused.
pub const KILLED_EXIT_WINDOW_NS: u64 = 1_000_000_000;

// SAFETY: repr(C), integers only.
unsafe impl Record for OomRecord {
    const KIND: EventKind = EventKind::OomKill;
}

// The kernel side and userspace read these bytes with the same layout: a field added, moved or
// resized changes the size, and must change both sides (and the decoder's tests) together.
const _: () = assert!(core::mem::size_of::<OomPending>() == 80);
const _: () = assert!(core::mem::size_of::<OomRecord>() == 144);
const _: () = assert!(core::mem::size_of::<OomMeeting>() == 88);
