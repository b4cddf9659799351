//! `tracepoint/oom/mark_victim`: the OOM killer chose a victim. This runs in the allocating task,
//! so the victim's details are parked in `OOM_PENDING` and sent from the victim's own exit.
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
    config::FIELD_ABSENT, oom::OomPending, stat, EventKind, OomRecord, COMM_LEN,
};

use crate::{
    config, count,
    task::{current, header, read_field},
    wake, EVENTS, OOM_PENDING,
};

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
    if OOM_PENDING.insert(pid as u32, pending, 0).is_err() {
        count(stat::OOM_PENDING_FULL);
        aya_log_ebpf::warn!(&ctx, "OOM victim {} not tracked: OOM_PENDING full", pid);
    }
    0
}

/// Called at every thread exit: sends the OOM record if this thread was a chosen victim.
#[inline(always)]
pub fn complete_if_victim(task: *const u8) {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: the value is copied out before any other map operation.
    let Some(pending) = (unsafe { OOM_PENDING.get(tid) }).copied() else {
        return;
    };
    let _ = OOM_PENDING.remove(tid);
    let Some(mut entry) = EVENTS.reserve::<OomRecord>(0) else {
        count(stat::RINGBUF_DROPS);
        return;
    };
    let victim = current(task);
    let mut pending = pending;
    // A pid-only `mark_victim` (before Linux 6.8): the victim itself tells its name (it is current
    // here) and its oom_score_adj (signal_struct lives until the last thread is reaped).
    if pending.comm[0] == 0 {
        pending.comm = victim.comm;
    }
    if pending.has_oom_score_adj == 0 {
        let off = &config().task;
        let signal: *const u8 = read_field::<usize>(task, off.signal) as *const u8;
        if !signal.is_null() {
            pending.oom_score_adj = read_field::<i16>(signal, off.signal_oom_score_adj);
            pending.has_oom_score_adj = 1;
        }
    }
    let rec = entry.as_mut_ptr();
    // SAFETY: `rec` points at a reserved, exclusively owned ring-buffer slot of the right size.
    unsafe {
        (*rec).header = header(EventKind::OomKill);
        (*rec).victim = victim;
        (*rec).pending = pending;
    }
    // An OOM kill always wakes the reader.
    entry.submit(wake::waking(wake::ring_bytes::<OomRecord>()));
}
