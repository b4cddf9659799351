//! A watched memory cgroup's usage crossing thresholds of its limit (observer_common::memcg's
//! `CrossingRecord`), followed from the charge itself, before the limit is met: a pure anonymous
//! leak has nothing to reclaim, so the limit-hit probe (memcg.rs) first hears of it at the kill.
//! One of two hooks, chosen at load (observer-user's `ChargeSource`):
//!
//! - `fexit/try_charge_memcg` where BPF trampolines are allowed: the charge path proper. It runs
//!   at every charge (the CPU's stock of precharged pages is consumed inside it, and the page
//!   counter moves only when the stock is refilled, 64 pages at a time), so the charges are
//!   summed per CPU and the page counters read once per `batch_pages`: every quarter MiB a CPU
//!   charges.
//! - else `raw_tp/mod_memcg_lruvec_state` (Linux 6.14+: a memory cgroup's per-node statistic
//!   changed; its arguments are the `struct mem_cgroup *`, the item and the change in pages). It
//!   fires for every page's statistics (anon mapped, on an LRU list, file, shmem, slab, stacks,
//!   page tables), so the additions are summed per CPU and the page counters read once per
//!   `batch_pages`: the same quarter-MiB step. The plain tracepoint of the same name carries only
//!   the cgroup's id, not the page counter; a raw tracepoint is not a tracing program, and is
//!   allowed where those are refused.
//!
//! Either way, the charged cgroup and its parent (the container's pod: a pod-level limit) are
//! read: where one has a limit, its usage is placed among `thresholds_bp`, and a record is sent
//! only when it rises past one it had not (state per cgroup in `CHARGE_LEVELS`); a threshold is
//! armed again once usage fell `rearm_bp` below it. So a cgroup that sits still, or sits above its
//! highest threshold (a cache at its limit), sends nothing, and a leak sends at most one record
//! per threshold on its way to the kill.
use aya_ebpf::{
    helpers::bpf_get_current_task,
    macros::{fexit, raw_tracepoint},
    programs::{FExitContext, RawTracePointContext},
};
use observer_common::{
    memcg::{CrossingRecord, CrossingState, MAX_THRESHOLDS},
    stat, EventKind,
};

use crate::{
    config, count,
    task::{current, header, read_field, watched},
    wake, CHARGE_BATCH, CHARGE_LEVELS, EVENTS,
};

/// The most memory cgroups looked at per charge (`ChargeConfig::depth` is capped here).
const MAX_DEPTH: u16 = 3;

#[fexit(function = "try_charge_memcg")]
pub fn charge_memcg(ctx: FExitContext) -> i32 {
    // (struct mem_cgroup *memcg, gfp_t gfp_mask, unsigned int nr_pages) -> int: 0 when charged.
    // A refused charge is reclaim and the OOM killer's (memcg.rs, oom.rs).
    if ctx.ret::<i32>() != Ok(0) {
        return 0;
    }
    // It runs at every charge, the CPU's stock consumed first inside it; the page counter moves
    // once per stock refill, so it is read once per `batch_pages` charged on this CPU.
    if batch_full(u64::from(ctx.arg::<u32>(2))) {
        on_charge(ctx.arg::<*const u8>(0));
    }
    0
}

#[raw_tracepoint(tracepoint = "mod_memcg_lruvec_state")]
pub fn memcg_stat(ctx: RawTracePointContext) -> i32 {
    // (struct mem_cgroup *memcg, int item, int val): val in pages, negative when freed.
    let val = ctx.arg::<u64>(2) as u32 as i32;
    if val > 0 && batch_full(val as u64) {
        on_charge(ctx.arg::<*const u8>(0));
    }
    0
}

/// Adds `pages` to this CPU's sum; true (and the sum restarted) once it reached a batch.
#[inline(always)]
fn batch_full(pages: u64) -> bool {
    let Some(sum) = CHARGE_BATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: a per-CPU slot; no other program runs on this CPU while this one does.
    let sum = unsafe { &mut *sum };
    *sum += pages;
    if *sum < u64::from(config().charge.batch_pages) {
        return false;
    }
    *sum = 0;
    true
}

/// Reads the charged cgroup's page counter and its parents' against their limits.
#[inline(always)]
fn on_charge(memcg: *const u8) {
    if memcg.is_null() || !watched() {
        return;
    }
    let c = &config().charge;
    // Only the charging task's own memory cgroup: the statistics of another's are updated here
    // too (a CPU's batch of pages put on their LRU lists by whoever drains it, a remote charge),
    // and a record would name the wrong container, and use up that cgroup's crossing.
    // SAFETY: a helper without preconditions.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let cset: *const u8 = read_field::<usize>(task, c.task_cgroups) as *const u8;
    if cset.is_null() {
        return;
    }
    let css: usize = read_field(
        cset,
        c.css_set_subsys + c.memory_cgrp_id * core::mem::size_of::<usize>() as u32,
    );
    if css.wrapping_sub(c.memcg_css as usize) != memcg as usize {
        return;
    }
    count(stat::CHARGE_CHECKS);
    let depth = if c.depth > MAX_DEPTH {
        MAX_DEPTH
    } else {
        c.depth
    };
    let mut counter = memcg.wrapping_add(c.memory as usize);
    for d in 0..MAX_DEPTH {
        if d >= depth {
            break;
        }
        let max: u64 = read_field(counter, c.pc_max);
        if max > 0 && max < c.unlimited_pages {
            let usage: u64 = read_field(counter, c.pc_usage);
            check(counter, usage, max, u32::from(d));
        }
        let parent: usize = read_field(counter, c.pc_parent);
        if parent == 0 {
            break;
        }
        counter = parent as *const u8;
    }
}

/// Places `usage` among the thresholds of `max` and sends a record when it rose past one.
#[inline(always)]
fn check(counter: *const u8, usage: u64, max: u64, depth: u32) {
    let c = &config().charge;
    // In basis points. No 128-bit multiply on this target: a counter past 2^40 pages (4 PiB) is
    // scaled down first, so the product stays in 64 bits.
    let ratio = if usage >= max {
        10_000
    } else if max >> 40 != 0 {
        (usage >> 12) * 10_000 / (max >> 12)
    } else {
        usage * 10_000 / max
    };
    let rearm = u64::from(c.rearm_bp);
    // Thresholds at or under the usage, and those it is not yet `rearm` under.
    let (mut level, mut keep, mut crossed) = (0u32, 0u32, 0u32);
    for i in 0..MAX_THRESHOLDS {
        let t = u64::from(c.thresholds_bp[i]);
        if t == 0 {
            break;
        }
        if ratio >= t {
            level = i as u32 + 1;
            crossed = t as u32;
        }
        if ratio + rearm >= t {
            keep = i as u32 + 1;
        }
    }
    let key = counter as u64;
    match CHARGE_LEVELS.get_ptr_mut(key) {
        Some(state) => {
            // SAFETY: a map value, alive while this program runs. Two CPUs crossing at once in
            // one cgroup may both send (no atomics on this target): one record more, no loss.
            let state = unsafe { &mut *state };
            if level > state.level {
                state.level = level;
            } else {
                if keep < state.level {
                    state.level = keep;
                }
                return;
            }
        }
        // Below the first threshold, a cgroup takes no entry.
        None if level == 0 => return,
        None => {
            let _ = CHARGE_LEVELS.insert(key, CrossingState { level, _pad: 0 }, 0);
        }
    }
    send(counter, usage, max, crossed, depth);
}

#[inline(always)]
fn send(counter: *const u8, usage: u64, max: u64, threshold_bp: u32, depth: u32) {
    let Some(mut entry) = EVENTS.reserve::<CrossingRecord>(0) else {
        count(stat::RINGBUF_DROPS);
        return;
    };
    let off = &config().memcg;
    let memcg = counter.wrapping_sub(config().charge.memory as usize);
    let cgroup: *const u8 = read_field::<usize>(memcg, off.css_cgroup) as *const u8;
    let kn: *const u8 = if cgroup.is_null() {
        core::ptr::null()
    } else {
        read_field::<usize>(cgroup, off.cgroup_kn) as *const u8
    };
    let memcg_id = if kn.is_null() {
        0
    } else {
        read_field::<u64>(kn, off.kn_id)
    };
    // SAFETY: a helper without preconditions.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let rec = entry.as_mut_ptr();
    // SAFETY: `rec` points at a reserved, exclusively owned ring-buffer slot of the right size.
    unsafe {
        (*rec).header = header(EventKind::LimitCrossing);
        (*rec).task = current(task);
        (*rec).memcg_id = memcg_id;
        (*rec).usage_pages = usage;
        (*rec).max_pages = max;
        (*rec).threshold_bp = threshold_bp;
        (*rec).depth = depth;
    }
    count(stat::LIMIT_CROSSINGS);
    // A crossing wakes the reader: at 64 MiB/s the last one comes some tens of ms before the kill.
    entry.submit(wake::waking(wake::ring_bytes::<CrossingRecord>()));
}
