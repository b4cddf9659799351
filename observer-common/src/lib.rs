//! The event ABI shared by the eBPF programs and userspace.
//!
//! Every record the kernel writes to the ring buffer starts with a [`Header`]; its `kind` says which
//! `#[repr(C)]` struct follows. One file per record kind. Nothing here knows about pods: the domain
//! model lives in `observer` (userspace) and is built from these records by one small decoder each.
#![no_std]

pub mod cgroup;
pub mod config;
pub mod exec;
pub mod exit;
pub mod memcg;
pub mod oom;

pub use cgroup::CgroupRecord;
pub use config::{ProbeConfig, WatchRoot, MAX_KNOWN_INITS, MAX_WATCH_ROOTS};
pub use exec::ExecRecord;
pub use exit::ExitRecord;
pub use memcg::{CrossingRecord, LimitHitRecord};
pub use oom::OomRecord;

/// Length of `task_struct::comm`, including the NUL.
pub const COMM_LEN: usize = 16;
/// Longest cgroup path the kernel side copies (relative to its hierarchy's root).
pub const CGROUP_PATH_LEN: usize = 256;

/// Ring buffer size in bytes. Must be a power-of-two multiple of the page size.
///
/// 2 MiB holds some 26 000 exits or 6 900 cgroup records: seconds of a fork storm's records
/// (about 1 MB/s at 3 500 forks/s) where the real-time reader is held off at most a few
/// milliseconds. Every byte costs twice in the agent's resident memory: the kernel maps the data
/// pages twice over (for records that wrap), populated at `mmap`, so 4 MiB was 8 MiB of RSS.
pub const RING_BUFFER_BYTES: u32 = 2 << 20;

/// Names shared by the kernel side and the loader, so neither spells them twice.
pub mod names {
    pub const EVENTS: &str = "EVENTS";
    pub const STATS: &str = "STATS";
    pub const WATCH_ROOTS: &str = "WATCH_ROOTS";
    pub const OOM_MEETINGS: &str = "OOM_MEETINGS";
    pub const GROUP_DEAD: &str = "GROUP_DEAD";
    pub const KNOWN_INITS: &str = "KNOWN_INITS";
    pub const MEMCG_WINDOWS: &str = "MEMCG_WINDOWS";
    pub const CHARGE_LEVELS: &str = "CHARGE_LEVELS";
    pub const CONFIG: &str = "CONFIG";
}

/// What follows the header.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Exec = 1,
    Exit = 2,
    OomKill = 3,
    CgroupMkdir = 4,
    CgroupRmdir = 5,
    CgroupEmpty = 6,
    LimitHit = 7,
    LimitCrossing = 8,
}

impl EventKind {
    pub const fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Exec,
            2 => Self::Exit,
            3 => Self::OomKill,
            4 => Self::CgroupMkdir,
            5 => Self::CgroupRmdir,
            6 => Self::CgroupEmpty,
            7 => Self::LimitHit,
            8 => Self::LimitCrossing,
            _ => return None,
        })
    }
}

/// First bytes of every ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Header {
    /// An [`EventKind`] as u32: a raw integer so a record from a newer kernel side never makes an
    /// invalid enum in userspace.
    pub kind: u32,
    /// CPU that wrote the record; with `time_ns` it orders records written on one CPU.
    pub cpu: u32,
    /// `bpf_ktime_get_boot_ns`: boot time, including suspend, so it maps to wall clock.
    pub time_ns: u64,
}

/// The task that was current when a record was written.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TaskInfo {
    /// Kernel thread id.
    pub pid: u32,
    /// Thread group id (what userspace calls the pid).
    pub tgid: u32,
    /// `real_parent->tgid`.
    pub ppid: u32,
    /// The thread's pid in its own pid namespace (1 for a container's init), and that
    /// namespace's depth (0: the host's). A runtime's helper processes run in the host's
    /// namespace before the container's init is made, which is how the two are told apart.
    pub ns_pid: u32,
    pub ns_level: u32,
    pub _pad: u32,
    /// cgroup v2 id of the task's cgroup (the directory's inode number on the cgroup2 mount).
    pub cgroup_id: u64,
    pub comm: [u8; COMM_LEN],
}

/// Indexes into the per-CPU `STATS` array.
pub mod stat {
    /// Records that could not be reserved in the ring buffer: each one is a lost event.
    pub const RINGBUF_DROPS: u32 = 0;
    /// OOM victims whose exit was never seen because `OOM_MEETINGS` refused the mark's half.
    pub const OOM_PENDING_FULL: u32 = 1;
    /// Kernel reads (`bpf_probe_read_kernel`) that failed; the record was sent with zeros.
    pub const READ_ERRORS: u32 = 2;
    /// Records submitted with a wake-up of the reader (one that waits on them, or one that made
    /// the unread bytes cross a wake-up batch).
    pub const WAKING: u32 = 3;
    /// Records submitted without one (`BPF_RB_NO_WAKEUP`): read at the reader's next wake-up or
    /// poll.
    pub const QUIET: u32 = 4;
    /// Memory cgroup reclaims summed into a limit-hit record rather than sent on their own.
    pub const LIMIT_HITS_SUMMED: u32 = 5;
    /// OOM kills whose victim exited before the OOM killer marked it (the kill was sent by the
    /// mark, observer-ebpf/src/oom.rs).
    pub const OOM_VICTIM_EXITED_FIRST: u32 = 6;
    /// Charges after which the charge probe read a memory cgroup's page counters against its
    /// limit (observer-ebpf/src/charge.rs): every charge through `try_charge_memcg`, one per
    /// `ChargeConfig::batch_pages` pages where only the stat tracepoint could be attached.
    pub const CHARGE_CHECKS: u32 = 7;
    /// Threshold crossings sent (`CrossingRecord`).
    pub const LIMIT_CROSSINGS: u32 = 8;
    /// Halves of an OOM kill's meeting found stale and replaced: a SIGKILLed exit or a mark of the
    /// same thread id longer ago than `oom::KILLED_EXIT_WINDOW_NS` (an earlier thread of that id).
    pub const OOM_STALE_MEETINGS: u32 = 9;
    pub const COUNT: u32 = 10;
}

/// A record that can be read back from bytes by userspace.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain only integers and arrays of integers, and have every
/// bit pattern valid.
pub unsafe trait Record: Copy + Sized {
    const KIND: EventKind;
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C), plain integers and arrays of them: no invalid bit patterns, no padding read.
    unsafe impl aya::Pod for super::ProbeConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::WatchRoot {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::oom::OomPending {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::memcg::MemcgWindow {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::memcg::CrossingState {}
}

// The kernel side and userspace read these bytes with the same layout: a field added, moved or
// resized changes the size, and must change both sides (and the decoder's tests) together.
const _: () = assert!(core::mem::size_of::<Header>() == 16);
const _: () = assert!(core::mem::size_of::<TaskInfo>() == 48);
