//! Cgroup ids: the kernfs node id of a cgroup's directory, which is its inode number.
//!
//! On the cgroup2 hierarchy this is the value of `bpf_get_current_cgroup_id()` and of the
//! `cgroup_id` in our kernel records. v1 hierarchies have ids too, but only within that
//! hierarchy: the kernel's `current cgroup id` is always the cgroup2 one.
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};

use super::mounts::CgroupVersion;
use super::CgroupError;

/// The id of the cgroup directory at `path` (absolute, on a cgroup mount).
pub fn cgroup_id(path: &Path) -> Result<u64, CgroupError> {
    cgroup_id_and_version(path).map(|(id, _)| id)
}

/// [`cgroup_id`], and whether the directory is on cgroup2 or a v1 hierarchy.
pub fn cgroup_id_and_version(path: &Path) -> Result<(u64, CgroupVersion), CgroupError> {
    let io = |source: std::io::Error| CgroupError::Io {
        path: path.to_owned(),
        source,
    };
    let fs = statfs(path).map_err(|e| io(e.into()))?;
    let version = match fs.filesystem_type() {
        CGROUP2_SUPER_MAGIC => CgroupVersion::V2,
        CGROUP_SUPER_MAGIC => CgroupVersion::V1,
        _ => {
            return Err(CgroupError::NotCgroup {
                path: path.to_owned(),
            })
        }
    };
    let md = std::fs::metadata(path).map_err(io)?;
    if !md.is_dir() {
        // An interface file (cgroup.procs) has an inode too, but it is not a cgroup.
        return Err(CgroupError::NotCgroup {
            path: path.to_owned(),
        });
    }
    Ok((md.ino(), version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::mounts::CgroupMounts;
    use crate::testutil::{require_root, TestTree};

    /// kernfs file handles carry the node id, which is what the kernel calls the cgroup id: an
    /// independent read of the same number (as `name_to_handle_at(2)` in systemd and cgroupfs
    /// tools).
    fn id_from_file_handle(path: &Path) -> u64 {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        #[repr(C)]
        struct Handle {
            bytes: u32,
            kind: i32,
            data: [u8; 64],
        }
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        let mut h = Handle {
            bytes: 64,
            kind: 0,
            data: [0; 64],
        };
        let mut mount_id = 0;
        // SAFETY: `h` is a file_handle header followed by `bytes` bytes of room.
        let rc = unsafe {
            libc::name_to_handle_at(
                libc::AT_FDCWD,
                c.as_ptr(),
                (&mut h as *mut Handle).cast(),
                &mut mount_id,
                0,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        assert_eq!(h.bytes, 8, "kernfs handles are one u64");
        u64::from_ne_bytes(h.data[..8].try_into().unwrap())
    }

    #[test]
    fn id_is_the_directory_inode_and_the_kernfs_id() {
        if !require_root("id_is_the_directory_inode_and_the_kernfs_id") {
            return;
        }
        let mounts = CgroupMounts::detect(None).unwrap();
        let u = mounts.unified().expect("cgroup2 mounted");
        let tree = TestTree::new(u, "id");
        let dir = tree.mkdir("/a/b");
        let (id, version) = cgroup_id_and_version(&dir).unwrap();
        assert_eq!(version, CgroupVersion::V2);
        assert_eq!(id, std::fs::metadata(&dir).unwrap().ino());
        assert_eq!(id, id_from_file_handle(&dir));
        // Distinct cgroups, distinct ids; the root's is 1 on cgroup2.
        let parent = cgroup_id(dir.parent().unwrap()).unwrap();
        assert_ne!(parent, id);
        if u.root == "/" {
            assert_eq!(cgroup_id(&u.mount_point).unwrap(), 1);
        }
        // A v1 hierarchy answers with its own ids.
        if let Some(pids) = mounts.v1("pids") {
            let (_, v) = cgroup_id_and_version(&pids.mount_point).unwrap();
            assert_eq!(v, CgroupVersion::V1);
        }
    }

    #[test]
    fn not_a_cgroup() {
        assert!(matches!(
            cgroup_id(Path::new("/proc")),
            Err(CgroupError::NotCgroup { .. })
        ));
        assert!(matches!(
            cgroup_id(Path::new("/nonexistent/cgroup")),
            Err(CgroupError::Io { ref source, .. }) if source.kind() == std::io::ErrorKind::NotFound
        ));
        let mounts = CgroupMounts::detect(None).unwrap();
        if let Some(u) = mounts.unified() {
            assert!(matches!(
                cgroup_id(&u.mount_point.join("cgroup.procs")),
                Err(CgroupError::NotCgroup { .. })
            ));
        }
    }
}
