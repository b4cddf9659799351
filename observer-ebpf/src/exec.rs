//! `tp_btf/sched_process_exec (struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`.
use aya_ebpf::{
    helpers::bpf_probe_read_kernel_str_bytes, macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use observer_common::{stat, EventKind, ExecRecord};

use crate::{
    config, count,
    task::{current, header, read_field, watched},
    wake, EVENTS,
};

#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(ctx: BtfTracePointContext) -> i32 {
    if !watched() {
        return 0;
    }
    let task: *const u8 = ctx.arg(0);
    let old_pid: i32 = ctx.arg(1);
    let bprm: *const u8 = ctx.arg(2);
    let Some(mut entry) = EVENTS.reserve::<ExecRecord>(0) else {
        count(stat::RINGBUF_DROPS);
        return 0;
    };
    let rec = entry.as_mut_ptr();
    let info = current(task);
    // SAFETY: `rec` points at a reserved, exclusively owned ring-buffer slot of the right size.
    unsafe {
        (*rec).header = header(EventKind::Exec);
        (*rec).task = info;
        (*rec).old_pid = old_pid as u32;
        (*rec)._pad = 0;
        (*rec).filename[0] = 0;
        let filename: *const u8 =
            read_field::<usize>(bprm, config().task.bprm_filename) as *const u8;
        if !filename.is_null() {
            let _ = bpf_probe_read_kernel_str_bytes(filename, &mut (*rec).filename);
        }
    }
    entry.submit(wake::for_exec(&info, wake::ring_bytes::<ExecRecord>()));
    0
}
