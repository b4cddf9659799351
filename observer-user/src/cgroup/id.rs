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
