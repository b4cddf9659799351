//! Process, mount and cgroup housekeeping on this host, shared by the cluster's `down` and the
//! test harness's teardown (tests/src/sys.rs).
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Processes whose command line mentions `needle` (its arguments joined by spaces; e.g. a
/// private socket path), this one excepted.
pub fn pids_with_cmdline(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(needle)
            })
        })
        .collect()
}

/// A process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat): together with
/// the pid it names one process, even after the pid is reused. None for a zombie, which has
/// exited and waits only for its parent.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses; fields resume after the last ')'.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Mount points at or below `root`, deepest first, from this process's mount table.
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return vec![];
    };
    // The table names mount points by their resolved path: a `target/cluster` that is a symlink
    // (a shared build cache) would otherwise match nothing and leave kubelet's mounts behind.
    let resolved = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let root = resolved.as_path();
    let mut found: Vec<PathBuf> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p.starts_with(root))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// mountinfo escapes space, tab, newline and backslash as octal.
pub fn unescape_mount_path(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = (b[i] == b'\\' && i + 3 < b.len())
            .then(|| &b[i + 1..i + 4])
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| {
                let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                u8::try_from(v).ok()
            });
        if let Some(v) = octal {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Unmounts everything at or below `root` (lazily when busy). Returns what is still mounted.
pub fn unmount_all(root: &Path) -> Vec<PathBuf> {
    for _ in 0..3 {
        let mounts = mounts_under(root);
        if mounts.is_empty() {
            return vec![];
        }
        for m in mounts {
            if nix::mount::umount2(&m, nix::mount::MntFlags::empty()).is_err() {
                let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
    mounts_under(root)
}

/// Every mounted cgroup hierarchy (v1 controllers, named v1 hierarchies such as name=systemd,
/// and the v2 mount), from the mount table.
pub fn cgroup_mounts() -> Vec<PathBuf> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return vec![];
    };
    table
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split(' ').next()?;
            let mountpoint = pre.split(' ').nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| unescape_mount_path(mountpoint))
        })
        .collect()
}

/// Kills every process in the cgroup subtree `rel` (e.g. `/kubepods/burstable/pod<uid>`) of every
/// hierarchy, then removes the subtree's directories, leaves first. Processes take a moment to
/// leave a cgroup after SIGKILL, so removal retries until `timeout`. Returns what is left.
pub fn destroy_cgroup_subtree(rel: &str, timeout: Duration) -> Vec<PathBuf> {
    let rel = rel.trim_start_matches('/');
    if rel.is_empty() {
        return vec![];
    }
    let roots: Vec<PathBuf> = cgroup_mounts()
        .into_iter()
        .map(|m| m.join(rel))
        .filter(|p| p.exists())
        .collect();
    let deadline = Instant::now() + timeout;
    loop {
        let mut left = Vec::new();
        for root in &roots {
            for dir in dirs_leaves_first(root) {
                if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    }
                }
                if std::fs::remove_dir(&dir).is_err() && dir.exists() {
                    left.push(dir);
                }
            }
        }
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn dirs_leaves_first(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    walk(&e.path(), out);
                }
            }
        }
        out.push(d.to_path_buf());
    }
    if root.is_dir() {
        walk(root, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_identifies_this_process() {
        let me = std::process::id();
        assert!(start_time(me).is_some_and(|t| t > 0));
    }

    #[test]
    fn mounts_under_a_symlink_are_found_by_their_resolved_path() {
        let link = std::env::temp_dir().join(format!("observer-proc-link-{}", std::process::id()));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/proc", &link).unwrap();
        let found = mounts_under(&link);
        let _ = std::fs::remove_file(&link);
        assert!(found.contains(&PathBuf::from("/proc")), "{found:?}");
    }

    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(
            unescape_mount_path(r"/tmp/a\040b"),
            PathBuf::from("/tmp/a b")
        );
        assert_eq!(unescape_mount_path("/plain"), PathBuf::from("/plain"));
        assert_eq!(unescape_mount_path(r"/x\13"), PathBuf::from(r"/x\13"));
        assert_eq!(unescape_mount_path(r"/x\777"), PathBuf::from(r"/x\777"));
    }
}
