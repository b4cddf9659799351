//! Reclaim in a memory cgroup at its limit (see observer_common::memcg), from one of two hooks:
//!
//! - `fexit/try_to_free_mem_cgroup_pages` where BPF trampolines are allowed: the memory cgroup
//!   reclaimed in, the pages asked for and those freed. Called by the charge path when a charge
//!   meets `memory.max` (v1: `memory.limit_in_bytes`), by `memory.high` throttling, and by writes
//!   that lower a limit or ask for reclaim.
//! - else `tracepoint/vmscan/mm_vmscan_memcg_reclaim_end` (the same function's end): the pages
//!   freed only. Which cgroup was at its limit is then found by userspace (the charging task's
//!   cgroup or a parent, whichever has the least headroom), and a reclaim is short when it freed
//!   less than the least memcg reclaim asks for (`SWAP_CLUSTER_MAX` pages).
//!
//! Either way the task is current (the charging task): only charges of tasks under the watched
//! subtrees count (a writer outside the pods is not one), and records are bounded under a storm: one map update per reclaim (which already
//! costs the kernel far more), one record per cgroup per interval whatever the rate of reclaims.
use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_task, bpf_ktime_get_boot_ns},
    macros::{fexit, tracepoint},
    programs::{FExitContext, TracePointContext},
};
use observer_common::{
    config::FIELD_ABSENT,
    memcg::{MemcgWindow, SWAP_CLUSTER_MAX},
    stat, EventKind, LimitHitRecord,
};

use crate::{
    config, count,
    task::{current, header, read_field, watched},
    wake, EVENTS, MEMCG_WINDOWS,
};

#[fexit(function = "try_to_free_mem_cgroup_pages")]
pub fn memcg_reclaim(ctx: FExitContext) -> i32 {
    // (struct mem_cgroup *memcg, unsigned long nr_pages, ...) -> unsigned long nr_reclaimed
    let memcg: *const u8 = ctx.arg(0);
    let requested: u64 = ctx.arg(1);
    let Ok(reclaimed) = ctx.ret::<u64>() else {
        return 0;
    };
    if memcg.is_null() {
        return 0;
    }
    on_reclaim(memcg as u64, memcg, requested, reclaimed);
    0
}

#[tracepoint(category = "vmscan", name = "mm_vmscan_memcg_reclaim_end")]
pub fn memcg_reclaim_end(ctx: TracePointContext) -> u32 {
    let off = config().memcg.tp_nr_reclaimed;
    if off == FIELD_ABSENT {
        return 0;
    }
    // SAFETY: offset from this tracepoint's format file; read_at checks the address.
    let Ok(reclaimed) = (unsafe { ctx.read_at::<u64>(off as usize) }) else {
        return 0;
    };
    // SAFETY: a helper without preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    on_reclaim(cgroup, core::ptr::null(), SWAP_CLUSTER_MAX, reclaimed);
    0
}

/// Sums one reclaim into the window of `key` (the memory cgroup, or the charging task's cgroup
/// where the memory cgroup is not known), and sends the window when its interval has passed.
#[inline(always)]
fn on_reclaim(key: u64, memcg: *const u8, requested: u64, reclaimed: u64) {
    // Charges of tasks outside the watched subtrees (kubelet's pods) are not the agent's.
    if !watched() {
        return;
    }
    // SAFETY: a helper without preconditions.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let window = match MEMCG_WINDOWS.get_ptr_mut(key) {
        Some(w) => w,
        None => {
            // BPF_NOEXIST: a reclaim on another CPU may have made it meanwhile; either way it
            // is there now (or the map refused, and this reclaim is not summed).
            let _ = MEMCG_WINDOWS.insert(key, MemcgWindow::default(), 1);
            match MEMCG_WINDOWS.get_ptr_mut(key) {
                Some(w) => w,
                None => return,
            }
        }
    };
    // SAFETY: `window` points at a map value that lives while this program runs. The BPF target
    // has no atomic read-modify-write in Rust's core, so two CPUs reclaiming in one cgroup at the
    // same instant may lose a count of one of them, or both send a record for one interval
    // (bounded by the CPUs): the counts are a measure, the records' rate is what is bounded.
    let w = unsafe { &mut *window };
    if w.first_ns == 0 {
        w.first_ns = now;
    }
    w.hits += 1;
    w.requested += requested;
    w.reclaimed += reclaimed;
    if reclaimed < requested {
        w.short += 1;
    }
    let off = &config().memcg;
    // SAFETY: volatile read of the loader-filled config; see crate::config.
    let interval = unsafe { core::ptr::read_volatile(&off.interval_ns) };
    if now.wrapping_sub(w.last_sent_ns) < interval {
        count(stat::LIMIT_HITS_SUMMED);
        return;
    }
    w.last_sent_ns = now;
    let sums = *w;
    w.first_ns = 0;
    w.hits = 0;
    w.short = 0;
    w.requested = 0;
    w.reclaimed = 0;
    let Some(mut entry) = EVENTS.reserve::<LimitHitRecord>(0) else {
        count(stat::RINGBUF_DROPS);
        return;
    };
    // SAFETY: a helper without preconditions.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let (memcg_id, usage, max) = if memcg.is_null() {
        (0, 0, 0)
    } else {
        let cgroup: *const u8 = read_field::<usize>(memcg, off.css_cgroup) as *const u8;
        let kn: *const u8 = if cgroup.is_null() {
            core::ptr::null()
        } else {
            read_field::<usize>(cgroup, off.cgroup_kn) as *const u8
        };
        (
            if kn.is_null() {
                0
            } else {
                read_field::<u64>(kn, off.kn_id)
            },
            read_field::<u64>(memcg, off.usage),
            read_field::<u64>(memcg, off.max),
        )
    };
    let rec = entry.as_mut_ptr();
    // SAFETY: `rec` points at a reserved, exclusively owned ring-buffer slot of the right size.
    unsafe {
        (*rec).header = header(EventKind::LimitHit);
        (*rec).task = current(task);
        (*rec).memcg_id = memcg_id;
        (*rec).usage_pages = usage;
        (*rec).max_pages = max;
        (*rec).first_ns = sums.first_ns;
        (*rec).hits = sums.hits;
        (*rec).short = sums.short;
        (*rec).requested_pages = sums.requested;
        (*rec).reclaimed_pages = sums.reclaimed;
    }
    // A limit hit wakes the reader: at 64 MiB/s a leak is killed some tens of ms after its first.
    entry.submit(wake::waking(wake::ring_bytes::<LimitHitRecord>()));
}
