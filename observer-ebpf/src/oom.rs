//! `tracepoint/oom/mark_victim`: the OOM killer chose a victim. This runs in the allocating task,
//! so the victim's details are parked and sent from the victim's own exit.
//!
//! The kernel signals the victim before it marks it, so the victim may exit first (on 6.16+ the exit
//! tracepoint even fires before the victim's `exit_mm` waits for the killer's task lock). The two
//! meet in one `OOM_MEETINGS` entry per thread id: each side inserts its half only where no entry
//! is (BPF_NOEXIST, decided under the map's bucket lock), so the second always finds the first;
//! removing the entry decides which one sends, so the record goes out once. Two maps, each side
//! writing its own and then reading the other's, could miss each other: a store may pass a later
//! load.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
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
    oom::{
        KilledExit, MeetingHalf, OomMeeting, OomPending, KILLED_EXIT_WINDOW_NS, MEETING_EXIT,
        MEETING_MARK,
    },
    stat, EventKind, Header, OomRecord, TaskInfo, COMM_LEN,
};

use crate::{
    config, count,
    task::{current, header, read_field},
    wake, EVENTS, OOM_MEETINGS,
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
    let marked_ns = pending.marked_ns;
    let mine = OomMeeting {
        side: MEETING_MARK,
        half: MeetingHalf { pending },
    };
    // Twice at most: the second after a stale half was removed, or one removed under us.
    for _ in 0..2 {
        if OOM_MEETINGS.insert(tid, mine, BPF_NOEXIST as u64).is_ok() {
            return 0;
        }
        let Some(there) = OOM_MEETINGS.get_ptr(tid) else {
            continue;
        };
        // SAFETY: a live map value; `side` says which half of the union was written.
        let (side, then) = unsafe {
            let side = (*there).side;
            let then = if side == MEETING_EXIT {
                (*there).half.exit.exit_ns
            } else {
                (*there).half.pending.marked_ns
            };
            (side, then)
        };
        // An exit long before this mark was an earlier thread of the same id; a mark as old, of
        // a victim whose exit was never seen. A recent mark stands: this is a second one.
        if then.saturating_add(KILLED_EXIT_WINDOW_NS) < marked_ns {
            count(stat::OOM_STALE_MEETINGS);
            let _ = OOM_MEETINGS.remove(tid);
            continue;
        }
        if side != MEETING_EXIT {
            return 0;
        }
        // SAFETY: as above; copied out before the removal.
        let exited = unsafe { (*there).half.exit };
        if OOM_MEETINGS.remove(tid).is_ok() {
            count(stat::OOM_VICTIM_EXITED_FIRST);
            // SAFETY: `mine` was built from the pending half.
            send(exited.task, unsafe { mine.half.pending }, exited.exit_ns);
        }
        return 0;
    }
    count(stat::OOM_PENDING_FULL);
    aya_log_ebpf::warn!(
        &ctx,
        "OOM victim {} not tracked: OOM_MEETINGS refused it",
        pid
    );
    0
}

/// Called at every thread exit (`exit_code`: its wait status): sends the OOM record if this
/// thread was a chosen victim, and leaves a SIGKILLed one's half for a mark still to come.
#[inline(always)]
pub fn complete_if_victim(task: *const u8, exit_code: u32) {
    let tid = bpf_get_current_pid_tgid() as u32;
    let killed = exit_code & 0x7f == SIGKILLED;
    let mut marked = false;
    if killed {
        let mine = OomMeeting {
            side: MEETING_EXIT,
            half: MeetingHalf {
                exit: KilledExit {
                    // SAFETY: helper without preconditions.
                    exit_ns: unsafe { bpf_ktime_get_boot_ns() },
                    task: current(task),
                },
            },
        };
        for _ in 0..2 {
            if OOM_MEETINGS.insert(tid, mine, BPF_NOEXIST as u64).is_ok() {
                return;
            }
            let Some(there) = OOM_MEETINGS.get_ptr(tid) else {
                continue;
            };
            // SAFETY: a live map value.
            if unsafe { (*there).side } == MEETING_MARK {
                marked = true;
                break;
            }
            // An earlier thread of this id that exited of SIGKILL: this exit is the one a mark
            // may still name.
            let _ = OOM_MEETINGS.remove(tid);
        }
    } else {
        // Not SIGKILLed: a victim that was already exiting when it was chosen.
        marked = OOM_MEETINGS
            .get_ptr(tid)
            // SAFETY: a live map value.
            .is_some_and(|m| unsafe { (*m).side } == MEETING_MARK);
    }
    if !marked {
        return;
    }
    let Some(there) = OOM_MEETINGS.get_ptr(tid) else {
        return;
    };
    // SAFETY: a live map value whose side is the mark's; copied out before the removal.
    let mut pending = unsafe { (*there).half.pending };
    // Removed by someone else: the record is already on its way.
    if OOM_MEETINGS.remove(tid).is_err() {
        return;
    }
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
