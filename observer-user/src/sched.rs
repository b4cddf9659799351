//! Real-time scheduling for the one thread that reads the kernel (`--realtime-priority`).
//!
//! Only that thread is real-time, and with `SCHED_RESET_ON_FORK`: nothing it starts inherits the
//! policy. That matters beyond fairness: with RT group scheduling (`CONFIG_RT_GROUP_SCHED`) a
//! SCHED_FIFO task cannot enter a child cpu cgroup that has no real-time budget, so a runtime
//! started by a real-time process fails to put its container into its cgroup (runc: EINVAL
//! writing cgroup.procs). The same rule makes the kernel refuse the policy to a thread whose own
//! cpu cgroup has no budget, which is where an agent in a pod usually is on such kernels: then
//! the thread runs at normal priority, and says so once.
use std::sync::atomic::{AtomicBool, Ordering};

/// Linux's range of SCHED_FIFO priorities.
pub const PRIORITIES: std::ops::RangeInclusive<u8> = 1..=99;

/// `CAP_SYS_NICE`'s bit in the capability sets of /proc/self/status.
const CAP_SYS_NICE: u64 = 1 << 23;

#[derive(Debug, thiserror::Error)]
pub enum RealtimeError {
    #[error("real-time priority {0} is outside 1..=99")]
    OutOfRange(u8),
    #[error(
        "SCHED_FIFO {priority} refused: this process lacks CAP_SYS_NICE (and RLIMIT_RTPRIO \
         allows {rlimit})"
    )]
    NotPermitted { priority: u8, rlimit: u64 },
    #[error(
        "SCHED_FIFO {priority} refused despite CAP_SYS_NICE: the kernel's RT group scheduling \
         gives this process's cpu cgroup no real-time budget (cpu.rt_runtime_us is 0)"
    )]
    NoBudget { priority: u8 },
    #[error("SCHED_FIFO {priority}: {source}")]
    Other {
        priority: u8,
        source: std::io::Error,
    },
}

/// Makes the calling thread (only it) SCHED_FIFO at `priority`, with `SCHED_RESET_ON_FORK`.
pub fn set_realtime(priority: u8) -> Result<(), RealtimeError> {
    if !PRIORITIES.contains(&priority) {
        return Err(RealtimeError::OutOfRange(priority));
    }
    let param = libc::sched_param {
        sched_priority: i32::from(priority),
    };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call.
    let rc = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if rc == 0 {
        return Ok(());
    }
    let source = std::io::Error::last_os_error();
    Err(match source.raw_os_error() {
        Some(libc::EPERM) if has_cap_sys_nice() => RealtimeError::NoBudget { priority },
        Some(libc::EPERM) => RealtimeError::NotPermitted {
            priority,
            rlimit: rtprio_limit(),
        },
        _ => RealtimeError::Other { priority, source },
    })
}

/// The calling thread back to SCHED_OTHER (for a trial, `observer check`).
pub fn set_normal() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in set_realtime; SCHED_OTHER needs no privilege.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
}

/// Whether the calling thread runs SCHED_FIFO now.
pub fn is_realtime() -> bool {
    // SAFETY: pid 0 is the calling thread; no pointer is involved.
    let policy = unsafe { libc::sched_getscheduler(0) };
    policy >= 0 && policy & !libc::SCHED_RESET_ON_FORK == libc::SCHED_FIFO
}

/// [`set_realtime`] for the calling thread, `what` naming it. When the kernel refuses, the first
/// refusal in this process is logged (a warning, with why), later ones only at debug: the thread
/// then runs at normal priority, as it would without the option.
pub fn realtime_or_say_once(priority: u8, what: &str) -> bool {
    static SAID: AtomicBool = AtomicBool::new(false);
    match set_realtime(priority) {
        Ok(()) => {
            tracing::info!(priority, "{what}: real-time (SCHED_FIFO)");
            true
        }
        Err(e) if !SAID.swap(true, Ordering::Relaxed) => {
            tracing::warn!("{what} runs at normal priority: {e}");
            false
        }
        Err(e) => {
            tracing::debug!("{what} runs at normal priority: {e}");
            false
        }
    }
}

/// CAP_SYS_NICE in this process's effective set.
pub fn has_cap_sys_nice() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("CapEff:")
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            })
        })
        .is_some_and(|caps| caps & CAP_SYS_NICE != 0)
}

/// RLIMIT_RTPRIO's soft limit: the highest priority an unprivileged thread may take.
fn rtprio_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_RTPRIO)
        .map(|(soft, _)| soft)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_is_refused_before_the_kernel() {
        assert!(matches!(set_realtime(0), Err(RealtimeError::OutOfRange(0))));
        assert!(matches!(
            set_realtime(100),
            Err(RealtimeError::OutOfRange(100))
        ));
    }

    /// On a thread of its own: granted or refused, the policy never leaks to the test runner's
    /// threads, and a refusal says why.
    #[test]
    fn a_trial_on_a_thread_of_its_own() {
        std::thread::spawn(|| match set_realtime(1) {
            Ok(()) => {
                assert!(is_realtime());
                set_normal();
                assert!(!is_realtime());
            }
            Err(e) => {
                assert!(!is_realtime());
                assert!(
                    matches!(
                        e,
                        RealtimeError::NoBudget { .. } | RealtimeError::NotPermitted { .. }
                    ),
                    "{e}"
                );
            }
        })
        .join()
        .unwrap();
        assert!(!is_realtime());
    }
}
