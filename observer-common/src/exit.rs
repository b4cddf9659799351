//! `sched_process_exit`: a thread exited; with `group_dead` the whole process is gone.
use crate::{EventKind, Header, Record, TaskInfo};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExitRecord {
    pub header: Header,
    pub task: TaskInfo,
    /// `task_struct.exit_code`: the wait status (code << 8 | signal | 0x80 if a core was dumped).
    pub exit_code: u32,
    /// 1 when this was the last thread of its group.
    pub group_dead: u8,
    pub _pad: [u8; 3],
}

// SAFETY: repr(C), integers only.
unsafe impl Record for ExitRecord {
    const KIND: EventKind = EventKind::Exit;
}

// The kernel side and userspace read these bytes with the same layout: a field added, moved or
// resized changes the size, and must change both sides (and the decoder's tests) together.
const _: () = assert!(core::mem::size_of::<ExitRecord>() == 72);
