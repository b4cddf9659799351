//! The kernel side's userspace half: load and attach the eBPF programs, read the ring buffer,
//! decode records into typed events.
pub mod btf;
pub mod clock;
pub mod decode;
pub mod event;
pub mod kmsg;
mod loader;
mod reader;
pub mod tracefs;

use std::path::PathBuf;

pub use clock::BootClock;
pub use event::*;
pub use loader::{
    btf_path, privileges, GroupDeadSource, KernelCounters, ProbeOptions, Probes, ProgramStats,
    Watch,
};
pub use observer_common::WatchRoot;
pub use reader::EventReader;

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
    #[error(transparent)]
    Io(std::io::Error),
}
