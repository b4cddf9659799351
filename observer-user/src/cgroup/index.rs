//! cgroup id → path and kind, for the cgroup2 hierarchy.
//!
//! Kernel events carry only a cgroup id. The index is filled by one walk of the tree at start and
//! kept current by cgroup mkdir/rmdir events; a miss (an id the walk and the events never showed,
//! e.g. a cgroup made between the walk and the probes' attach) is answered exactly by asking the
//! kernel: a cgroup2 file handle is its id, so `open_by_handle_at` opens the directory.
use std::{collections::HashMap, fs, os::unix::fs::MetadataExt, path::Path, sync::Arc};

use super::{mounts::HierarchyMount, CgroupKind, KubeRoots};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupEntry {
    /// Relative to the hierarchy root, e.g. `/kubepods/burstable/pod<uid>/<id>`.
    pub path: Arc<str>,
    pub kind: CgroupKind,
}

pub struct CgroupIndex {
    mount: HierarchyMount,
    /// What each path is, anchored at kubelet's roots.
    roots: KubeRoots,
    by_id: HashMap<u64, CgroupEntry>,
}

impl CgroupIndex {
    pub fn new(mount: HierarchyMount, roots: KubeRoots) -> Self {
        Self {
            mount,
            roots,
            by_id: HashMap::new(),
        }
    }

    /// Walks the whole hierarchy once. Directories that vanish meanwhile are skipped.
    pub fn scan(&mut self) {
        let root = self.mount.mount_point.clone();
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            let Ok(md) = fs::metadata(&dir) else { continue };
            if let Some(rel) = self.mount.to_relative(&dir) {
                self.by_id.insert(md.ino(), self.roots.entry(&rel));
            }
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }

    pub fn insert(&mut self, id: u64, path: &str) -> &CgroupEntry {
        self.by_id.insert(id, self.roots.entry(path));
        &self.by_id[&id]
    }

    pub fn remove(&mut self, id: u64) -> Option<CgroupEntry> {
        self.by_id.remove(&id)
    }

    pub fn get(&self, id: u64) -> Option<&CgroupEntry> {
        self.by_id.get(&id)
    }

    /// [`Self::get`], falling back to asking the kernel for the path of `id`.
    pub(crate) fn resolve(&mut self, id: u64) -> Option<&CgroupEntry> {
        if !self.by_id.contains_key(&id) {
            let abs = path_of_id(&self.mount.mount_point, id)?;
            let rel = self.mount.to_relative(&abs)?;
            self.by_id.insert(id, self.roots.entry(&rel));
        }
        self.by_id.get(&id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn mount(&self) -> &HierarchyMount {
        &self.mount
    }

    pub fn roots(&self) -> &KubeRoots {
        &self.roots
    }
}

/// The absolute path of the cgroup2 directory whose id is `id`, through the kernfs file handle
/// (type FILEID_KERNFS, 8 bytes: the id). Needs CAP_DAC_READ_SEARCH; `None` if the cgroup is gone.
pub(crate) fn path_of_id(mount_point: &Path, id: u64) -> Option<std::path::PathBuf> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    #[repr(C)]
    struct KernfsHandle {
        handle_bytes: u32,
        handle_type: i32,
        id: u64,
    }
    const FILEID_KERNFS: i32 = 0xfe;
    let mount = fs::File::open(mount_point).ok()?;
    let mut handle = KernfsHandle {
        handle_bytes: 8,
        handle_type: FILEID_KERNFS,
        id,
    };
    // SAFETY: `handle` is a valid struct file_handle with 8 bytes of f_handle; the returned fd,
    // if any, is owned by the OwnedFd below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount.as_raw_fd(),
            &mut handle as *mut KernfsHandle,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let link = fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    // The link is the path in the mount namespace, which is what `mount_point` is in.
    link.starts_with(mount_point).then_some(link)
}
