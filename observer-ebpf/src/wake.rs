//! Whether a record wakes the reader (`bpf_ringbuf_submit` flags).
//!
//! Every wake-up is an irq_work that raises a self-IPI on the CPU of the task that wrote the
//! record: about 20 µs of the dying task's time in a nested VM, where the IPI is a VM exit. Only
//! the records something waits on wake the reader:
//!
//! - a container init's exec and exit: the task is pid 1 of a pid namespace deeper than the
//!   node's, or (for its exit) its process is one the PLEG registered in `KNOWN_INITS` (an init
//!   that is not pid 1: shared pid namespaces, hostPID; an init whose last thread is not the
//!   leader);
//! - OOM kills and cgroup events, always.
//!
//! Everything else (a container's other processes, whatever `Watch::All` adds) is submitted with
//! `BPF_RB_NO_WAKEUP`; the reader reads it with the next waking record (which it follows in the
//! ring: order is kept) or at its next poll (observer-user's `kernel::QUIET_RECORD_DELAY`). A quiet
//! record still wakes the reader when it brings the unread bytes across a multiple of
//! `wake_batch_bytes`, so a reader that only polls never lets a storm fill the ring.
//!
//! `WAKE_EVERY` wakes the reader for every record; `WAKE_NONE` for none but the batch crossings
//! (an onlooker's probes, which must not delay the agent's on the same tracepoint).
use aya_ebpf::bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP};
use observer_common::{
    config::{WAKE_EVERY, WAKE_NONE},
    stat, TaskInfo,
};

use crate::{config, count, EVENTS, KNOWN_INITS};

/// Bytes a record of `T` takes in the ring buffer: the kernel's 8-byte header, rounded up to 8.
#[inline(always)]
pub const fn ring_bytes<T>() -> u64 {
    ((core::mem::size_of::<T>() as u64 + 8) + 7) & !7
}

/// Submit flags for a record someone waits on. The kernel's default (0) wakes the reader only
/// when it has read everything before this record, which is not the case behind quiet records:
/// then the wake-up is forced.
#[inline(always)]
pub fn waking(size: u64) -> u64 {
    if wake_mode() == WAKE_NONE {
        return quiet(size);
    }
    count(stat::WAKING);
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) > size {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        0
    }
}

/// Submit flags for a record nothing waits on: no wake-up, unless this record brings the unread
/// bytes across a multiple of `wake_batch_bytes`. Crossing, not "above": a lagging reader is
/// woken once per batch, not once per record.
#[inline(always)]
pub fn quiet(size: u64) -> u64 {
    // SAFETY: volatile read of the loader-filled config; see crate::config.
    let batch = u64::from(unsafe { core::ptr::read_volatile(&config().wake_batch_bytes) });
    let avail = EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    if batch != 0 && avail >= size && (avail - size) / batch != avail / batch {
        count(stat::WAKING);
        return BPF_RB_FORCE_WAKEUP as u64;
    }
    count(stat::QUIET);
    BPF_RB_NO_WAKEUP as u64
}

/// `ProbeConfig::wake`.
#[inline(always)]
fn wake_mode() -> u8 {
    // SAFETY: volatile read of the loader-filled config; see crate::config.
    unsafe { core::ptr::read_volatile(&config().wake) }
}

/// Whether every record wakes the reader.
#[inline(always)]
pub fn wake_all() -> bool {
    wake_mode() == WAKE_EVERY
}

/// The task is pid 1 of a pid namespace deeper than the node's: a container's init.
#[inline(always)]
pub fn is_ns_init(task: &TaskInfo) -> bool {
    // SAFETY: volatile read of the loader-filled config; see crate::config.
    let host = unsafe { core::ptr::read_volatile(&config().host_ns_level) };
    task.ns_pid == 1 && task.ns_level > host
}

/// Submit flags for an exec.
#[inline(always)]
pub fn for_exec(task: &TaskInfo, size: u64) -> u64 {
    if wake_all() || is_ns_init(task) {
        waking(size)
    } else {
        quiet(size)
    }
}

/// Submit flags for an exit (`group_dead`: the whole process is gone).
#[inline(always)]
pub fn for_exit(task: &TaskInfo, group_dead: bool, size: u64) -> u64 {
    if wake_all() || is_ns_init(task) || (group_dead && KNOWN_INITS.get_ptr(task.tgid).is_some()) {
        waking(size)
    } else {
        quiet(size)
    }
}
