//! observer's kernel side: one file per probe, all writing to one ring buffer (`EVENTS`).
//!
//! Nothing here is compiled for one kernel: every struct offset arrives in `CONFIG`, filled by the
//! loader from the running kernel's BTF and tracepoint format files.
#![no_std]
#![no_main]
// The workspace warns of `pub` items nothing outside the crate reaches; in a BPF object nothing is
// reached by path at all (the loader finds programs by section and symbol), so `pub` here only
// says "a probe's entry or a helper other probes call".
#![allow(unreachable_pub)]

// The host-side stub library of this package (see lib.rs); nothing of it is used here.
use observer_ebpf as _;

mod cgroup;
mod charge;
mod exec;
mod exit;
mod group_dead;
mod memcg;
mod oom;
mod task;
mod wake;

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use observer_common::{
    memcg::{CrossingState, MemcgWindow},
    oom::OomMeeting,
    stat, ProbeConfig, WatchRoot, MAX_KNOWN_INITS, MAX_WATCH_ROOTS, RING_BUFFER_BYTES,
};

/// Filled by the loader (`EbpfLoader::override_global`). Read only through [`config`]: a plain read
/// of an immutable static would be folded to the zeros below at compile time.
#[unsafe(no_mangle)]
// SAFETY: ProbeConfig is plain integers, for which all zeros is a valid value.
static CONFIG: ProbeConfig = unsafe { core::mem::zeroed() };

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(RING_BUFFER_BYTES, 0);

/// Per-CPU counters indexed by `observer_common::stat`.
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

/// Cgroup subtrees whose tasks' exec/exit are sent, filled contiguously from index 0.
#[map]
static WATCH_ROOTS: Array<WatchRoot> = Array::with_max_entries(MAX_WATCH_ROOTS, 0);

/// OOM kills' meetings by thread id: the mark's half or a SIGKILLed exit's, whichever came first
/// (oom.rs). LRU: most SIGKILLed exits are no OOM victim's, and only the most recent can still
/// meet their mark.
#[map]
static OOM_MEETINGS: LruHashMap<u32, OomMeeting> = LruHashMap::with_max_entries(4096, 0);

/// `group_dead` of each exiting thread, from `fentry/taskstats_exit` to `sched_process_exit`
/// (see group_dead.rs). LRU: an entry whose tracepoint never ran cannot fill it.
#[map]
static GROUP_DEAD: LruHashMap<u32, u8> = LruHashMap::with_max_entries(16384, 0);

/// Container inits by process id, filled by the PLEG (ContainerStarted in, ContainerDied out): their
/// group exit wakes the reader (wake.rs). Not preallocated: memory follows the containers running.
#[map]
static KNOWN_INITS: HashMap<u32, u8> =
    HashMap::with_max_entries(MAX_KNOWN_INITS, BPF_F_NO_PREALLOC);

/// Limit hits summed per memory cgroup (by `struct mem_cgroup` address) between two records.
/// LRU: the cgroups that hit their limit most recently; one evicted starts a new window.
#[map]
static MEMCG_WINDOWS: LruHashMap<u64, MemcgWindow> = LruHashMap::with_max_entries(4096, 0);

/// Where each watched memory cgroup's usage stands among the thresholds of its limit, by its
/// `page_counter` address (charge.rs). LRU: an evicted cgroup sends its current threshold again.
#[map]
static CHARGE_LEVELS: LruHashMap<u64, CrossingState> = LruHashMap::with_max_entries(4096, 0);

/// Pages added to memory cgroup statistics on this CPU since the charge probe last read the page
/// counters (only where it follows the statistics' tracepoint: charge.rs).
#[map]
static CHARGE_BATCH: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn config() -> &'static ProbeConfig {
    // SAFETY: CONFIG lives in .rodata for the program's lifetime; the volatile read of the address
    // stops the compiler from assuming its contents.
    unsafe { &*core::ptr::read_volatile(&&raw const CONFIG) }
}

#[inline(always)]
fn count(index: u32) {
    if let Some(p) = STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
        unsafe { *p += 1 };
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
