//! `tracepoint/cgroup/{cgroup_mkdir, cgroup_rmdir, cgroup_notify_populated}`.
use aya_ebpf::{
    helpers::bpf_probe_read_kernel_str_bytes, macros::tracepoint, programs::TracePointContext,
    EbpfContext,
};
use observer_common::{config::ALL_HIERARCHIES, stat, CgroupRecord, EventKind};

use crate::{config, count, task::header, wake, EVENTS};

#[tracepoint(category = "cgroup", name = "cgroup_mkdir")]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    send(&ctx, EventKind::CgroupMkdir);
    0
}

#[tracepoint(category = "cgroup", name = "cgroup_rmdir")]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    send(&ctx, EventKind::CgroupRmdir);
    0
}

/// Only the transition to empty is sent: the populated side is already an exec.
#[tracepoint(category = "cgroup", name = "cgroup_notify_populated")]
pub fn cgroup_notify_populated(ctx: TracePointContext) -> u32 {
    let off = &config().cgroup;
    // SAFETY: offset from this tracepoint's format file; read_at checks the address.
    if let Ok(0) = unsafe { ctx.read_at::<i32>(off.val as usize) } {
        send(&ctx, EventKind::CgroupEmpty);
    }
    0
}

#[inline(always)]
fn send(ctx: &TracePointContext, kind: EventKind) {
    let off = &config().cgroup;
    // SAFETY: offsets from the format file shared by the three tracepoints.
    let hierarchy = unsafe { ctx.read_at::<i32>(off.root as usize) }.unwrap_or(-1) as u32;
    // SAFETY: volatile read of the loader-filled config; see crate::config.
    let wanted = unsafe { core::ptr::read_volatile(&config().cgroup_hierarchy) };
    if wanted != ALL_HIERARCHIES && hierarchy != wanted {
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<CgroupRecord>(0) else {
        count(stat::RINGBUF_DROPS);
        return;
    };
    let rec = entry.as_mut_ptr();
    // SAFETY: `rec` points at a reserved, exclusively owned ring-buffer slot; offsets as above.
    unsafe {
        (*rec).header = header(kind);
        (*rec).hierarchy = hierarchy;
        (*rec).id = ctx.read_at::<u64>(off.id as usize).unwrap_or(0);
        (*rec).level = ctx.read_at::<i32>(off.level as usize).unwrap_or(0) as u32;
        (*rec)._pad = 0;
        (*rec).path_len = 0;
        (*rec).path[0] = 0;
        if let Ok(loc) = ctx.read_at::<u32>(off.path as usize) {
            let src = (ctx.as_ptr() as *const u8).wrapping_add((loc & 0xffff) as usize);
            if let Ok(s) = bpf_probe_read_kernel_str_bytes(src, &mut (*rec).path) {
                (*rec).path_len = s.len() as u32;
            }
        }
    }
    // Cgroup events always wake the reader: a container's cgroup appearing, emptying or going.
    entry.submit(wake::waking(wake::ring_bytes::<CgroupRecord>()));
}
