//! `fexit/try_to_free_mem_cgroup_pages`: a charge met a memory cgroup's limit (`memory.max`, v1's
//! `memory.limit_in_bytes`, or `memory.high`) and the kernel reclaimed in that cgroup.
//!
//! A cgroup sitting at its limit can reclaim thousands of times a second, so the kernel side sums
//! the reclaims of each memory cgroup in a [`MemcgWindow`] and sends one [`LimitHitRecord`] per
//! cgroup per [`crate::config::MemcgOffsets::interval_ns`] at most: the first hit after a quiet
//! interval goes at once, the rest are summed into the next record.
use crate::{EventKind, Header, Record, TaskInfo};

/// The least memory cgroup reclaim asks for, in pages (the kernel's `SWAP_CLUSTER_MAX`): what a
/// reclaim seen only at its tracepoint is taken to have asked.
pub const SWAP_CLUSTER_MAX: u64 = 32;

/// Reclaims summed since the last record of one memory cgroup (kernel-side state, keyed by the
/// `struct mem_cgroup` address).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemcgWindow {
    /// Boot time of the last record sent for this cgroup.
    pub last_sent_ns: u64,
    /// Boot time of the first reclaim summed here (0: none yet).
    pub first_ns: u64,
    /// Pages asked for and pages freed, summed.
    pub requested: u64,
    pub reclaimed: u64,
    /// Reclaims summed, and of them those that freed less than asked.
    pub hits: u64,
    pub short: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LimitHitRecord {
    /// `time_ns`: the reclaim that sent the record (the window's last).
    pub header: Header,
    /// The task whose charge met the limit: its cgroup tells the container (the cgroup over its
    /// limit is that container's or an ancestor's: a pod-level limit).
    pub task: TaskInfo,
    /// The memory cgroup reclaimed in (the one at its limit): its kernfs id, which is the inode
    /// number of its directory in the hierarchy the memory controller lives in (cgroup2, or v1's
    /// memory hierarchy). 0 where only the tracepoint could be attached: not known.
    pub memcg_id: u64,
    /// Its `memory` page counter after the reclaim: usage and limit, in pages (0 where the
    /// memory cgroup is not known).
    pub usage_pages: u64,
    pub max_pages: u64,
    /// Boot time of the first reclaim summed in this record.
    pub first_ns: u64,
    /// Pages asked for and freed, summed over `hits` reclaims, of which `short` freed less than
    /// asked (reclaim that does not keep up: the OOM killer is next).
    pub requested_pages: u64,
    pub reclaimed_pages: u64,
    pub hits: u64,
    pub short: u64,
}

// SAFETY: repr(C), integers only.
unsafe impl Record for LimitHitRecord {
    const KIND: EventKind = EventKind::LimitHit;
}

// The kernel side and userspace read these bytes with the same layout: a field added, moved or
// resized changes the size, and must change both sides (and the decoder's tests) together.
const _: () = assert!(core::mem::size_of::<MemcgWindow>() == 48);
const _: () = assert!(core::mem::size_of::<LimitHitRecord>() == 128);

/// Most thresholds of a limit the charge probe follows (observer-ebpf/src/charge.rs).
pub const MAX_THRESHOLDS: usize = 8;

/// Where a memory cgroup's usage stands against its limit, as the charge probe last saw it
/// (kernel-side state, keyed by the cgroup's `page_counter` address).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CrossingState {
    /// Thresholds crossed and not yet fallen back below (0: none): a threshold is sent once
    /// per rise past it.
    pub level: u32,
    pub _pad: u32,
}

/// A charge took a watched memory cgroup's usage past a threshold of its limit (the highest
/// one, when a charge passed several). Sent once per rise: a cgroup that sits still, or sits
/// above its highest threshold, sends nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CrossingRecord {
    pub header: Header,
    /// The charging task: its cgroup tells the container.
    pub task: TaskInfo,
    /// The memory cgroup whose limit it is (its kernfs id, as [`LimitHitRecord::memcg_id`]).
    pub memcg_id: u64,
    /// Its page counter right after the charge: usage and limit, in pages.
    pub usage_pages: u64,
    pub max_pages: u64,
    /// The threshold crossed, in basis points of the limit (8600: 86 %).
    pub threshold_bp: u32,
    /// How far above the charged memory cgroup it is (0: that cgroup, 1: its parent).
    pub depth: u32,
}

// SAFETY: repr(C), integers only.
unsafe impl Record for CrossingRecord {
    const KIND: EventKind = EventKind::LimitCrossing;
}

const _: () = assert!(core::mem::size_of::<CrossingState>() == 8);
const _: () = assert!(core::mem::size_of::<CrossingRecord>() == 96);
