//! What the loader hands the kernel side: switches, and every offset that depends on the running
//! kernel. Offsets are found at load time (kernel BTF, tracepoint format files), never compiled in.

/// Most cgroup subtrees exec/exit can be limited to at once.
pub const MAX_WATCH_ROOTS: u32 = 16;

/// An entry of the `WATCH_ROOTS` array: tasks whose cgroup ancestor at `level` is `id` are watched.
/// `id == 0` marks an unused slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchRoot {
    pub id: u64,
    pub level: u32,
    pub _pad: u32,
}

/// Offsets of the fields the programs read from `struct task_struct` and friends, in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskOffsets {
    /// `task_struct.exit_code`
    pub exit_code: u32,
    /// `task_struct.real_parent`
    pub real_parent: u32,
    /// `task_struct.tgid`
    pub tgid: u32,
    /// `task_struct.signal`, used only where `sched_process_exit` has no `group_dead` argument.
    pub signal: u32,
    /// `signal_struct.live` (an atomic_t), ditto.
    pub signal_live: u32,
    /// `linux_binprm.filename`
    pub bprm_filename: u32,
    /// `task_struct.thread_pid`, `pid.level`, `pid.numbers`, `upid.nr`, `sizeof(struct upid)`:
    /// the pid a task has in its own pid namespace.
    pub thread_pid: u32,
    pub pid_level: u32,
    pub pid_numbers: u32,
    pub upid_nr: u32,
    pub upid_size: u32,
    /// `signal_struct.oom_score_adj` (a short): an OOM victim's adjustment, read from the victim
    /// where `oom/mark_victim` does not carry it (before Linux 6.8).
    pub signal_oom_score_adj: u32,
}

/// Most container inits the PLEG registers in `KNOWN_INITS` (their group exit wakes the reader).
/// A node runs a few hundred containers at most; past this an init's exit is delivered with the
/// records that do not wake the reader (within the reader's poll period).
pub const MAX_KNOWN_INITS: u32 = 2048;

/// `cgroup_hierarchy` value that sends cgroup events of every hierarchy.
pub const ALL_HIERARCHIES: u32 = u32::MAX;

/// Sentinel for a tracepoint field this kernel does not have.
pub const FIELD_ABSENT: u32 = u32::MAX;

/// Offsets of `oom/mark_victim` fields in the tracepoint record (from its format file). Fields other
/// than `pid` appeared in Linux 6.8; older kernels have [`FIELD_ABSENT`] there.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OomTpOffsets {
    pub pid: u32,
    pub comm: u32,
    pub total_vm: u32,
    pub anon_rss: u32,
    pub file_rss: u32,
    pub shmem_rss: u32,
    pub oom_score_adj: u32,
    pub _pad: u32,
}

impl Default for OomTpOffsets {
    fn default() -> Self {
        Self {
            pid: FIELD_ABSENT,
            comm: FIELD_ABSENT,
            total_vm: FIELD_ABSENT,
            anon_rss: FIELD_ABSENT,
            file_rss: FIELD_ABSENT,
            shmem_rss: FIELD_ABSENT,
            oom_score_adj: FIELD_ABSENT,
            _pad: 0,
        }
    }
}

/// Offsets of the fields shared by `cgroup_mkdir`, `cgroup_rmdir` and `cgroup_notify_populated`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CgroupTpOffsets {
    pub root: u32,
    pub level: u32,
    pub id: u32,
    pub path: u32,
    /// `val` of `cgroup_notify_populated`.
    pub val: u32,
    pub _pad: u32,
}

impl Default for CgroupTpOffsets {
    fn default() -> Self {
        Self {
            root: FIELD_ABSENT,
            level: FIELD_ABSENT,
            id: FIELD_ABSENT,
            path: FIELD_ABSENT,
            val: FIELD_ABSENT,
            _pad: 0,
        }
    }
}

/// [`ProbeConfig::wake`]: only the records something waits on wake the reader (a container
/// init's exec and exit, OOM kills, cgroup events); the others are submitted without a wake-up
/// and read at the reader's next wake-up or poll.
pub const WAKE_SELECTIVE: u8 = 0;
/// [`ProbeConfig::wake`]: every record wakes the reader at once (`observer watch --all`,
/// `--threads`: someone reads each record as it comes).
pub const WAKE_EVERY: u8 = 1;
/// [`ProbeConfig::wake`]: no record wakes the reader (but a ring an eighth fuller): it reads at
/// its polls. For an onlooker beside the agent (the benchmarks' own exit timestamps): each
/// wake-up costs the dying task an irq_work, and on the same tracepoint the onlooker's program
/// runs before the agent's, so its wake-ups would delay the agent's.
pub const WAKE_NONE: u8 = 2;

/// Offsets into `struct mem_cgroup` and what it points at, for the limit-hit probe
/// (`observer_common::memcg`), and how often it may send a record per memory cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemcgOffsets {
    /// `mem_cgroup.css` + `cgroup_subsys_state.cgroup`: the `struct cgroup *`.
    pub css_cgroup: u32,
    /// `cgroup.kn`, and `kernfs_node.id` (the directory's inode number).
    pub cgroup_kn: u32,
    pub kn_id: u32,
    /// `mem_cgroup.memory` + `page_counter.usage` / `page_counter.max`.
    pub usage: u32,
    pub max: u32,
    /// `nr_reclaimed` in `vmscan/mm_vmscan_memcg_reclaim_end` (the hook where fexit cannot be
    /// attached), [`FIELD_ABSENT`] where it is not used.
    pub tp_nr_reclaimed: u32,
    /// At most one record per memory cgroup per this many nanoseconds.
    pub interval_ns: u64,
}

impl Default for MemcgOffsets {
    fn default() -> Self {
        Self {
            css_cgroup: 0,
            cgroup_kn: 0,
            kn_id: 0,
            usage: 0,
            max: 0,
            tp_nr_reclaimed: FIELD_ABSENT,
            interval_ns: 0,
        }
    }
}

/// What the charge probe (observer-ebpf/src/charge.rs) reads and against what: the page counter
/// of `struct mem_cgroup` and its parents, and the thresholds of a limit it reports crossings of.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ChargeConfig {
    /// `mem_cgroup.memory` (a `struct page_counter`), and in `page_counter` its `usage`, `max`
    /// and `parent` (the parent cgroup's counter, which every charge also charges).
    pub memory: u32,
    pub pc_usage: u32,
    pub pc_max: u32,
    pub pc_parent: u32,
    /// `task_struct.cgroups` (a `struct css_set *`), `css_set.subsys` (an array of
    /// `struct cgroup_subsys_state *` indexed by `memory_cgrp_id`) and `mem_cgroup.css`: the
    /// charging task's own memory cgroup, which a charged one must be (a per-CPU page batch
    /// drained by one task updates the statistics of others' cgroups).
    pub task_cgroups: u32,
    pub css_set_subsys: u32,
    pub memory_cgrp_id: u32,
    pub memcg_css: u32,
    /// Thresholds in basis points of the limit, ascending; 0 ends the list.
    pub thresholds_bp: [u16; crate::memcg::MAX_THRESHOLDS],
    /// A threshold is sent again once usage fell this far below it (no flapping on it).
    pub rearm_bp: u16,
    /// Memory cgroups looked at from the charged one up (1: it alone; 2: and its parent, a
    /// container's pod).
    pub depth: u16,
    /// Where only the stat tracepoint is attached (it fires for every page, not once per charge
    /// batch): the page counters are read once per this many pages added on a CPU.
    pub batch_pages: u32,
    /// A `max` at or above this is no limit (`PAGE_COUNTER_MAX`).
    pub unlimited_pages: u64,
}

/// The `CONFIG` global of the kernel side.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProbeConfig {
    /// 1: exec/exit for every task; 0: only under `WATCH_ROOTS`.
    pub watch_all: u8,
    /// 1: an exit record for every thread; 0: only when the thread group dies.
    pub thread_exits: u8,
    /// 1: `sched_process_exit` passes `group_dead` as its second argument (Linux 6.x).
    pub exit_has_group_dead: u8,
    /// 1 where `exit_has_group_dead` is 0 and `fentry/taskstats_exit` is attached: it records
    /// each exiting thread's `group_dead` (do_exit passes it there just before the tracepoint) in
    /// `GROUP_DEAD`. 0: `signal->live` is read at the tracepoint instead, which two threads
    /// exiting at once on two CPUs can both see at zero.
    pub exit_group_dead_hook: u8,
    /// Hierarchy id (`root` field of the cgroup tracepoints) whose cgroup events are sent: 0 is the
    /// cgroup2 hierarchy on every kernel (v1 hierarchies are numbered from 1, as in /proc/self/cgroup).
    /// [`ALL_HIERARCHIES`] sends every hierarchy's.
    pub cgroup_hierarchy: u32,
    pub task: TaskOffsets,
    pub oom: OomTpOffsets,
    pub cgroup: CgroupTpOffsets,
    /// Which records wake the reader as they are written ([`WAKE_SELECTIVE`], [`WAKE_EVERY`],
    /// [`WAKE_NONE`]). See observer-ebpf/src/wake.rs.
    pub wake: u8,
    pub _pad: [u8; 3],
    /// Depth of the node's own pid namespace (0 on a host): pid 1 of a deeper namespace is a
    /// container's init.
    pub host_ns_level: u32,
    /// Unless `wake` is [`WAKE_EVERY`], a record that does not wake the reader still does when it brings the
    /// unread bytes across a multiple of this (a power of two, an eighth of the ring buffer), so
    /// a reader that only polls never lets the ring buffer fill.
    pub wake_batch_bytes: u32,
    pub _pad2: u32,
    pub memcg: MemcgOffsets,
    pub charge: ChargeConfig,
}

// The kernel side and userspace read these bytes with the same layout: a field added, moved or
// resized changes the size, and must change both sides (and the decoder's tests) together.
const _: () = assert!(core::mem::size_of::<WatchRoot>() == 16);
const _: () = assert!(core::mem::size_of::<TaskOffsets>() == 48);
const _: () = assert!(core::mem::size_of::<OomTpOffsets>() == 32);
const _: () = assert!(core::mem::size_of::<CgroupTpOffsets>() == 24);
const _: () = assert!(core::mem::size_of::<MemcgOffsets>() == 32);
const _: () = assert!(core::mem::size_of::<ChargeConfig>() == 64);
const _: () = assert!(core::mem::size_of::<ProbeConfig>() == 224);
