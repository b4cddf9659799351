//! `tp_btf/sched_process_exit (struct task_struct *p, bool group_dead)` — `group_dead` is an
//! argument on recent kernels; older ones (6.1, 6.12) pass only the task, and `group_dead` comes
//! from `fentry/taskstats_exit` (group_dead.rs), or failing that from `signal->live`.
//!
//! Also completes OOM kills: the victim's exit is where its own cgroup is current.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::btf_tracepoint, programs::BtfTracePointContext,
};
use observer_common::{stat, EventKind, ExitRecord};

use crate::{
    config, count, oom,
    task::{current, header, read_field, watched},
    wake, EVENTS, GROUP_DEAD,
};

#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(ctx: BtfTracePointContext) -> i32 {
    let task: *const u8 = ctx.arg(0);
    let cfg = config();
    let off = &cfg.task;
    let exit_code = read_field::<u32>(task, off.exit_code);
    // OOM victims are reported wherever they are: a kill outside the watched subtrees still
    // matters to whoever owns that memory.
    oom::complete_if_victim(task, exit_code);

    // SAFETY: volatile reads of the loader-filled config; see crate::config.
    let (has_arg, hook, thread_exits) = unsafe {
        (
            core::ptr::read_volatile(&cfg.exit_has_group_dead),
            core::ptr::read_volatile(&cfg.exit_group_dead_hook),
            core::ptr::read_volatile(&cfg.thread_exits),
        )
    };
    // The hook's record, taken (removed) whether or not this exit is sent.
    let recorded = if has_arg == 0 && hook != 0 {
        let tid = bpf_get_current_pid_tgid() as u32;
        // SAFETY: the value is copied out before the removal.
        let v = unsafe { GROUP_DEAD.get(tid) }.copied();
        if v.is_some() {
            let _ = GROUP_DEAD.remove(tid);
        }
        v
    } else {
        None
    };
    let group_dead = if has_arg != 0 {
        ctx.arg::<u64>(1) as u8 != 0
    } else if let Some(v) = recorded {
        v != 0
    } else {
        let signal: *const u8 = read_field::<usize>(task, off.signal) as *const u8;
        !signal.is_null() && read_field::<i32>(signal, off.signal_live) == 0
    };
    if (!group_dead && thread_exits == 0) || !watched() {
        return 0;
    }
    let Some(mut entry) = EVENTS.reserve::<ExitRecord>(0) else {
        count(stat::RINGBUF_DROPS);
        return 0;
    };
    let rec = entry.as_mut_ptr();
    let info = current(task);
    // SAFETY: `rec` points at a reserved, exclusively owned ring-buffer slot of the right size.
    unsafe {
        (*rec).header = header(EventKind::Exit);
        (*rec).task = info;
        (*rec).exit_code = exit_code;
        (*rec).group_dead = group_dead as u8;
        (*rec)._pad = [0; 3];
    }
    entry.submit(wake::for_exit(
        &info,
        group_dead,
        wake::ring_bytes::<ExitRecord>(),
    ));
    0
}
