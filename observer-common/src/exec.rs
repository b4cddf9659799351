//! `sched_process_exec`: a task replaced its program.
use crate::{EventKind, Header, Record, TaskInfo};

/// Bytes of the exec'd file name that are kept.
pub const FILENAME_LEN: usize = 128;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecRecord {
    pub header: Header,
    pub task: TaskInfo,
    /// The pid the task had before exec (differs when a non-leader thread execs).
    pub old_pid: u32,
    pub _pad: u32,
    /// NUL-terminated path given to execve.
    pub filename: [u8; FILENAME_LEN],
}

// SAFETY: repr(C), integers only.
unsafe impl Record for ExecRecord {
    const KIND: EventKind = EventKind::Exec;
}

// The kernel side and userspace read these bytes with the same layout: a field added, moved or
// resized changes the size, and must change both sides (and the decoder's tests) together.
const _: () = assert!(core::mem::size_of::<ExecRecord>() == 200);
