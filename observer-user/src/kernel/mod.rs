//! The kernel side's userspace half: load and attach the eBPF programs, read the ring buffer,
//! decode records into typed events.
pub mod btf;
pub mod decode;
pub mod event;
pub mod kmsg;
mod known_inits;
mod loader;
mod metrics;
pub mod oom_report;
mod reader;
pub mod tracefs;

use std::{path::PathBuf, time::Duration};

pub use crate::model::BootClock;
pub use event::*;
pub use known_inits::KnownInits;
pub(crate) use loader::btf_path;
pub use loader::{
    privileges, ChargeSource, GroupDeadSource, KernelCounters, LimitHitSource, ProbeOptions,
    Probes, ProgramStats, Wake, Watch, CROSSING_THRESHOLDS, LIMIT_HIT_INTERVAL,
};
pub(crate) use metrics::run_time_accounted;
pub use observer_common::WatchRoot;
pub use reader::{EventReader, Wait};

/// The longest a record that does not wake the reader ([`Wake::Selective`]: a container's
/// processes other than its init) waits in the ring buffer before it is read, while records keep
/// coming: the reader polls this often when the kernel has not woken it. A record that wakes it
/// brings every record before it along (one ring, read in order).
pub(crate) const QUIET_RECORD_DELAY: Duration = Duration::from_millis(10);

/// The longest poll period: each poll that finds nothing doubles the period up to this, and a
/// record read brings it back to [`QUIET_RECORD_DELAY`] (`reader::QuietPoll`). So an idle
/// agent's reader wakes about once a second, and the first quiet record after an idle spell is
/// read within a second (at once, with a record that wakes the reader).
pub const QUIET_IDLE_DELAY: Duration = Duration::from_secs(1);

/// Depth of this process's pid namespace (0 on the host), from the `NSpid` entries of
/// /proc/self/status.
pub fn own_pid_ns_level() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .map(|v| v.split_whitespace().count().saturating_sub(1) as u32)
        })
        .unwrap_or(0)
}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("not privileged: loading eBPF tracing programs needs root (or CAP_BPF + CAP_PERFMON)")]
    NotPrivileged,
    #[error("kernel BTF not found at {0}: observer needs a kernel built with CONFIG_DEBUG_INFO_BTF=y (5.15+)")]
    NoBtf(PathBuf),
    #[error("kernel BTF: {0}")]
    Btf(String),
    #[error("tracefs: {0}")]
    Tracefs(String),
    #[error("tracepoint {0} does not exist on this kernel")]
    TracepointMissing(String),
    #[error("this binary was built without its eBPF object (AYA_BUILD_SKIP was set); rebuild without it")]
    NoObject,
    #[error("loading the eBPF object: {0}")]
    LoadObject(String),
    #[error("attaching {program}: {reason}")]
    Attach { program: String, reason: String },
    #[error("map {0}: {1}")]
    Map(&'static str, String),
    #[error("at most {max} watched cgroup roots, got {0}", max = observer_common::MAX_WATCH_ROOTS)]
    TooManyRoots(usize),
    #[error("the event reader was already taken")]
    ReaderTaken,
    #[error("the known-inits map was already taken")]
    InitsTaken,
    #[error(transparent)]
    Io(std::io::Error),
}
