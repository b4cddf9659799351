//! `tracepoint/oom/mark_victim`: the OOM killer chose a victim. This runs in the allocating task,
//! so the victim's details are parked in `OOM_PENDING` and sent from the victim's own exit.
//!
//! The kernel signals the victim before it marks it, so the victim may exit first: each side writes
//! its own map before it reads the other's (the exit `KILLED_EXITS`, the mark `OOM_PENDING`), and
//! whichever comes second sends the record; removing the pending entry decides who, so it is sent
//! once. Should both still miss each other (the two maps are not ordered by a fence), the kernel
//! log's report of the kill remains (`reconcile::history`).
use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_boot_ns,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::tracepoint,
    programs::TracePointContext,
    EbpfContext,
};
use observer_common::{
    config::FIELD_ABSENT,
    oom::{KilledExit, OomPending, KILLED_EXIT_WINDOW_NS},
    stat, EventKind, Header, OomRecord, TaskInfo, COMM_LEN,
};

use crate::{
    config, count,
    task::{current, header, read_field},
    wake, EVENTS, KILLED_EXITS, OOM_PENDING,
};

/// The exit status of a thread killed by SIGKILL (no core is dumped on SIGKILL).
const SIGKILLED: u32 = 9;

#[inline(always)]
fn field<T: Copy + Default>(ctx: &TracePointContext, offset: u32) -> Option<T> {
    if offset == FIELD_ABSENT {
        return None;
    }
    // SAFETY: the offset comes from this tracepoint's format file; read_at checks the address.
    unsafe { ctx.read_at::<T>(offset as usize) }.ok()
}

#[tracepoint(category = "oom", name = "mark_victim")]
pub fn oom_mark_victim(ctx: TracePointContext) -> u32 {
    let off = &config().oom;
    let Some(pid) = field::<i32>(&ctx, off.pid) else {
        return 0;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: a helper without preconditions.
    let trigger_cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let kb = |o: u32| field::<u64>(&ctx, o).unwrap_or(u64::MAX);
    let adj = field::<i16>(&ctx, off.oom_score_adj);
    let mut pending = OomPending {
        // SAFETY: helpers without preconditions.
        marked_ns: unsafe { bpf_ktime_get_boot_ns() },
        total_vm_kb: kb(off.total_vm),
        anon_rss_kb: kb(off.anon_rss),
        file_rss_kb: kb(off.file_rss),
        shmem_rss_kb: kb(off.shmem_rss),
        trigger_pid: pid_tgid as u32,
        trigger_tgid: (pid_tgid >> 32) as u32,
        trigger_cgroup_id,
        oom_score_adj: adj.unwrap_or(0),
        has_oom_score_adj: adj.is_some() as u8,
        _pad: [0; 5],
        comm: [0; COMM_LEN],
    };
    // comm is a __data_loc: (len << 16) | offset from the record's start.
    if let Some(loc) = field::<u32>(&ctx, off.comm) {
        let src = (ctx.as_ptr() as *const u8).wrapping_add((loc & 0xffff) as usize);
        // SAFETY: the kernel checks the source address; the destination is our stack buffer.
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(src, &mut pending.comm) };
    }
    let tid = pid as u32;
    if OOM_PENDING.insert(tid, pending, 0).is_err() {
        count(stat::OOM_PENDING_FULL);
        aya_log_ebpf::warn!(&ctx, "OOM victim {} not tracked: OOM_PENDING full", pid);
        return 0;
    }
    // SAFETY: the value is copied out before any other map operation.
    let Some(exited) = (unsafe { KILLED_EXITS.get(tid) }).copied() else {
        return 0;
    };
    let _ = KILLED_EXITS.remove(tid);
    // The victim exited first; an exit long before this is an earlier thread of that id.
    if pending.marked_ns.wrapping_sub(exited.exit_ns) > KILLED_EXIT_WINDOW_NS {
        return 0;
    }
    if OOM_PENDING.remove(tid).is_ok() {
        count(stat::OOM_VICTIM_EXITED_FIRST);
        send(exited.task, pending, exited.exit_ns);
    }
    0
}

/// Called at every thread exit (`exit_code`: its wait status): sends the OOM record if this
/// thread was a chosen victim.
#[inline(always)]
pub fn complete_if_victim(task: *const u8, exit_code: u32) {
    let tid = bpf_get_current_pid_tgid() as u32;
    let killed = exit_code & 0x7f == SIGKILLED;
    if killed {
        let exited = KilledExit {
            // SAFETY: helper without preconditions.
            exit_ns: unsafe { bpf_ktime_get_boot_ns() },
            task: current(task),
        };
        // Full: the LRU drops the oldest, which no mark will ask for any more.
        let _ = KILLED_EXITS.insert(tid, exited, 0);
    }
    // SAFETY: the value is copied out before any other map operation.
    let Some(pending) = (unsafe { OOM_PENDING.get(tid) }).copied() else {
        return;
    };
    if killed {
        let _ = KILLED_EXITS.remove(tid);
    }
    // Removed by the mark (it saw this exit): the record is already on its way.
    if OOM_PENDING.remove(tid).is_err() {
        return;
    }
    let mut pending = pending;
    // A pid-only `mark_victim` (before Linux 6.8): the victim itself tells its oom_score_adj
    // (signal_struct lives until the last thread is reaped) and, in `send`, its name.
    if pending.has_oom_score_adj == 0 {
        let off = &config().task;
        let signal: *const u8 = read_field::<usize>(task, off.signal) as *const u8;
        if !signal.is_null() {
            pending.oom_score_adj = read_field::<i16>(signal, off.signal_oom_score_adj);
            pending.has_oom_score_adj = 1;
        }
    }
    // SAFETY: helper without preconditions.
    send(current(task), pending, unsafe { bpf_ktime_get_boot_ns() });
}

/// One OOM record: `exit_ns` is the victim's exit.
#[inline(always)]
fn send(victim: TaskInfo, mut pending: OomPending, exit_ns: u64) {
    let Some(mut entry) = EVENTS.reserve::<OomRecord>(0) else {
        count(stat::RINGBUF_DROPS);
        return;
    };
    // A pid-only `mark_victim` (before Linux 6.8) has no comm: the victim's own at its exit.
    if pending.comm[0] == 0 {
        pending.comm = victim.comm;
    }
    let mut h: Header = header(EventKind::OomKill);
    h.time_ns = exit_ns;
    let rec = entry.as_mut_ptr();
    // SAFETY: `rec` points at a reserved, exclusively owned ring-buffer slot of the right size.
    unsafe {
        (*rec).header = h;
        (*rec).victim = victim;
        (*rec).pending = pending;
    }
    // An OOM kill always wakes the reader.
    entry.submit(wake::waking(wake::ring_bytes::<OomRecord>()));
}
