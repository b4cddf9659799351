//! `cgroup_mkdir`, `cgroup_rmdir`, and `cgroup_notify_populated` with `val == 0` (the cgroup became
//! empty: its last process exited or moved away).
use crate::{EventKind, Header, Record, CGROUP_PATH_LEN};

/// One record type for the three events; the header's kind tells them apart.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CgroupRecord {
    pub header: Header,
    /// Cgroup id (kernfs node id; the directory's inode number).
    pub id: u64,
    /// Depth below the hierarchy root (root is 0).
    pub level: u32,
    /// Hierarchy id (`root` field).
    pub hierarchy: u32,
    pub _pad: u32,
    /// Bytes of `path` copied, including the NUL; `CGROUP_PATH_LEN` means it may be truncated.
    pub path_len: u32,
    /// Path relative to the hierarchy root, NUL-terminated.
    pub path: [u8; CGROUP_PATH_LEN],
}

// SAFETY: repr(C), integers only.
unsafe impl Record for CgroupRecord {
    const KIND: EventKind = EventKind::CgroupMkdir;
}

// The kernel side and userspace read these bytes with the same layout: a field added, moved or
// resized changes the size, and must change both sides (and the decoder's tests) together.
const _: () = assert!(core::mem::size_of::<CgroupRecord>() == 296);
