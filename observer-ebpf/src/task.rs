//! What every task-scoped record needs: the current task's identity, and the watch filter.
use aya_ebpf::helpers::{
    bpf_get_current_ancestor_cgroup_id, bpf_get_current_cgroup_id, bpf_get_current_comm,
    bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_boot_ns,
    bpf_probe_read_kernel,
};
use observer_common::{stat, EventKind, Header, TaskInfo, MAX_WATCH_ROOTS};

use crate::{config, count, WATCH_ROOTS};

#[inline(always)]
pub fn header(kind: EventKind) -> Header {
    // SAFETY: helpers without preconditions.
    unsafe {
        Header {
            kind: kind as u32,
            cpu: bpf_get_smp_processor_id(),
            time_ns: bpf_ktime_get_boot_ns(),
        }
    }
}

/// Reads a field at a loader-supplied byte offset of a kernel struct; zero (and counted) on failure.
#[inline(always)]
pub fn read_field<T: Copy + Default>(base: *const u8, offset: u32) -> T {
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one returns an error, not a fault.
    match unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize) as *const T) } {
        Ok(v) => v,
        Err(_) => {
            count(stat::READ_ERRORS);
            T::default()
        }
    }
}

/// The current task. `task` is its `task_struct`, used for the parent's tgid.
#[inline(always)]
pub fn current(task: *const u8) -> TaskInfo {
    let pid_tgid = bpf_get_current_pid_tgid();
    let off = &config().task;
    let parent: *const u8 = read_field::<usize>(task, off.real_parent) as *const u8;
    let ppid = if parent.is_null() {
        0
    } else {
        read_field::<u32>(parent, off.tgid)
    };
    let (ns_pid, ns_level) = ns_pid(task);
    TaskInfo {
        pid: pid_tgid as u32,
        tgid: (pid_tgid >> 32) as u32,
        ppid,
        ns_pid,
        ns_level,
        _pad: 0,
        // SAFETY: helper without preconditions.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    }
}

/// The task's pid in its own (innermost) pid namespace and that namespace's level:
/// `task->thread_pid->numbers[level].nr`.
#[inline(always)]
fn ns_pid(task: *const u8) -> (u32, u32) {
    let off = &config().task;
    let pid: *const u8 = read_field::<usize>(task, off.thread_pid) as *const u8;
    if pid.is_null() {
        return (0, 0);
    }
    let level: u32 = read_field(pid, off.pid_level);
    // Linux nests pid namespaces at most 32 deep.
    if level > 32 {
        return (0, level);
    }
    let nr: i32 = read_field(pid, off.pid_numbers + level * off.upid_size + off.upid_nr);
    (nr as u32, level)
}

/// Whether the current task is inside one of the watched cgroup subtrees. The check uses the
/// task's cgroup at the moment of the event, so there is no window in which a new container's
/// first exec is missed, unlike adding each container's cgroup from userspace after it appears.
#[inline(always)]
pub fn watched() -> bool {
    // SAFETY: CONFIG is read through a volatile pointer; see crate::config.
    if unsafe { core::ptr::read_volatile(&config().watch_all) } != 0 {
        return true;
    }
    for i in 0..MAX_WATCH_ROOTS {
        let Some(root) = WATCH_ROOTS.get(i) else {
            return false;
        };
        if root.id == 0 {
            return false;
        }
        // SAFETY: helper without preconditions; returns 0 when the level is deeper than the task's.
        if unsafe { bpf_get_current_ancestor_cgroup_id(root.level as i32) } == root.id {
            return true;
        }
    }
    false
}
