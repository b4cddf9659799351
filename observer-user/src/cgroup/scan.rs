//! The start-up walk: containers that existed before the agent, with their processes and init.
//!
//! Runs once, so it reads what it needs plainly; it must only never fail on a tree that changes
//! underneath it (cgroups and processes come and go while we read).
use std::collections::HashSet;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use procfs::process::Process;
use tracing::debug;

use super::mounts::{CgroupVersion, HierarchyMount};
use super::path::CgroupKind;
use super::{CgroupError, KubeRoots};

#[derive(Debug, Clone)]
pub struct ScanOptions {
    /// procfs of the pid namespace the cgroup.procs pids are in (the agent's own, `/proc`,
    /// unless it reads the host's from elsewhere).
    pub proc_root: PathBuf,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// A pod, container (own or nested cgroup) or conmon cgroup found by the walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedCgroup {
    /// Directory inode: the kernel's cgroup id on cgroup2 (see [`super::cgroup_id`]).
    pub id: u64,
    /// Relative to the hierarchy root, as kernel events name it.
    pub path: String,
    pub kind: CgroupKind,
    /// Processes in this cgroup and every cgroup below it, sorted.
    pub pids: Vec<u32>,
    /// Containers only, nested ones included: the container's init. The process that is pid 1
    /// of a pid namespace (the outermost if several), else the oldest (a pod sharing the host
    /// pid namespace, or one sharing the pause container's). `None` when no process is left.
    pub init_pid: Option<u32>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Directories visited.
    pub dirs: u64,
    /// Below a kubepods root but of no known shape; not descended into.
    pub unrecognized: u64,
    /// Removed while we read (ENOENT): normal.
    pub vanished: u64,
    /// Any other read error.
    pub unreadable: u64,
}

#[derive(Debug, Clone)]
pub struct Scan {
    pub version: CgroupVersion,
    /// Parents before children.
    pub cgroups: Vec<ScannedCgroup>,
    pub stats: ScanStats,
}

/// [`scan`] below kubelet's default roots, which must exist here.
#[cfg(test)]
pub(crate) fn scan_kubepods(
    mount: &HierarchyMount,
    opts: &ScanOptions,
) -> Result<Scan, CgroupError> {
    let roots = KubeRoots::detect::<&str>(mount, &[])?;
    if !roots
        .paths()
        .any(|p| mount.to_absolute(p).is_some_and(|a| a.is_dir()))
    {
        return Err(CgroupError::NoKubepodsRoot {
            mount_point: mount.mount_point.clone(),
        });
    }
    scan(mount, &roots, opts)
}

/// Walks the hierarchy below each of kubelet's `roots` once and returns its pods, containers and
/// conmon cgroups (a root that does not exist yet is counted as vanished). Works the same on
/// cgroup2 and on a v1 hierarchy.
pub fn scan(
    mount: &HierarchyMount,
    roots: &KubeRoots,
    opts: &ScanOptions,
) -> Result<Scan, CgroupError> {
    let mut w = Walk {
        roots,
        nodes: Vec::new(),
        seen: HashSet::new(),
        stats: ScanStats::default(),
    };
    for root in roots.paths() {
        let rel = normalized(root);
        let abs = mount
            .to_absolute(&rel)
            .ok_or_else(|| CgroupError::OutsideMount {
                path: rel.clone(),
                mount_point: mount.mount_point.clone(),
            })?;
        w.walk(abs, rel);
    }
    let Walk {
        mut nodes, stats, ..
    } = w;

    // Children come after their parent, so a reverse pass sees each subtree complete.
    let mut pids: Vec<Vec<u32>> = nodes
        .iter_mut()
        .map(|n| std::mem::take(&mut n.own))
        .collect();
    for i in (0..nodes.len()).rev() {
        if let Some(p) = nodes[i].parent.filter(|&p| is_output(&nodes[p].kind)) {
            let child = std::mem::take(&mut pids[i]);
            pids[p].extend_from_slice(&child);
            pids[i] = child;
        }
    }
    let mut inits: Vec<Option<u32>> = vec![None; nodes.len()];
    for i in 0..nodes.len() {
        let CgroupKind::Container(c) = nodes[i].kind else {
            continue;
        };
        pids[i].sort_unstable();
        pids[i].dedup();
        let parent_is_container = nodes[i]
            .parent
            .is_some_and(|p| matches!(nodes[p].kind, CgroupKind::Container(_)));
        inits[i] = if c.nested && parent_is_container {
            nodes[i].parent.and_then(|p| inits[p])
        } else {
            init_pid(&pids[i], &opts.proc_root)
        };
    }

    let cgroups = nodes
        .into_iter()
        .zip(pids)
        .zip(inits)
        .filter(|((n, _), _)| is_output(&n.kind))
        .map(|((n, mut pids), init_pid)| {
            pids.sort_unstable();
            pids.dedup();
            ScannedCgroup {
                id: n.id,
                path: n.rel,
                kind: n.kind,
                pids,
                init_pid,
            }
        })
        .collect();
    debug!(?stats, "cgroup scan done");
    Ok(Scan {
        version: mount.version,
        cgroups,
        stats,
    })
}

fn is_output(kind: &CgroupKind) -> bool {
    matches!(
        kind,
        CgroupKind::Pod(_) | CgroupKind::Container(_) | CgroupKind::Conmon(_)
    )
}

struct Node {
    rel: String,
    parent: Option<usize>,
    kind: CgroupKind,
    id: u64,
    own: Vec<u32>,
}

struct Walk<'r> {
    roots: &'r KubeRoots,
    nodes: Vec<Node>,
    /// Ids already walked: overlapping roots must not list a cgroup twice.
    seen: HashSet<u64>,
    stats: ScanStats,
}

enum Read<T> {
    Ok(T),
    Vanished,
    Failed,
}

impl Walk<'_> {
    fn read<T>(&mut self, path: &Path, r: std::io::Result<T>) -> Read<T> {
        match r {
            Ok(v) => Read::Ok(v),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.stats.vanished += 1;
                Read::Vanished
            }
            Err(e) => {
                debug!(?path, error = %e, "cgroup scan: unreadable");
                self.stats.unreadable += 1;
                Read::Failed
            }
        }
    }

    fn walk(&mut self, abs: PathBuf, rel: String) {
        let mut stack = vec![(abs, rel, None::<usize>)];
        while let Some((abs, rel, parent)) = stack.pop() {
            self.stats.dirs += 1;
            let kind = self.roots.classify(&rel);
            if kind == CgroupKind::Unrecognized {
                // Nothing below an unknown shape can classify as anything else.
                debug!(path = %rel, "cgroup scan: unrecognized kubepods path");
                self.stats.unrecognized += 1;
                continue;
            }
            let id = match self.read(&abs, std::fs::symlink_metadata(&abs)) {
                Read::Ok(md) => md.ino(),
                _ => continue,
            };
            if !self.seen.insert(id) {
                continue;
            }
            let rd = match self.read(&abs, std::fs::read_dir(&abs)) {
                Read::Ok(rd) => rd,
                _ => continue,
            };
            let own = if is_output(&kind) {
                let procs = abs.join("cgroup.procs");
                match self.read(&procs, std::fs::read_to_string(&procs)) {
                    Read::Ok(s) => s.lines().filter_map(|l| l.trim().parse().ok()).collect(),
                    Read::Vanished => continue,
                    Read::Failed => Vec::new(),
                }
            } else {
                Vec::new()
            };
            let idx = self.nodes.len();
            self.nodes.push(Node {
                rel: rel.clone(),
                parent,
                kind,
                id,
                own,
            });
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let child_rel = join(&rel, &e.file_name().to_string_lossy());
                    stack.push((e.path(), child_rel, Some(idx)));
                }
            }
        }
    }
}

/// The container's init among `pids` (see [`ScannedCgroup::init_pid`]). Processes that exit
/// while we look are left out.
fn init_pid(pids: &[u32], proc_root: &Path) -> Option<u32> {
    struct Info {
        pid: u32,
        /// Pid namespaces the process is in, counted from ours (NSpid entries).
        levels: usize,
        /// Pid 1 of its innermost namespace, which is not ours.
        ns_init: bool,
        start: u64,
    }
    let infos: Vec<Info> = pids
        .iter()
        .filter_map(|&pid| {
            let p = Process::new_with_root(proc_root.join(pid.to_string())).ok()?;
            let nspid = p.status().ok()?.nspid.unwrap_or_default();
            let start = p.stat().ok()?.starttime;
            Some(Info {
                pid,
                levels: nspid.len(),
                ns_init: nspid.len() > 1 && nspid.last() == Some(&1),
                start,
            })
        })
        .collect();
    infos
        .iter()
        .filter(|i| i.ns_init)
        .min_by_key(|i| (i.levels, i.start, i.pid))
        .or_else(|| infos.iter().min_by_key(|i| (i.start, i.pid)))
        .map(|i| i.pid)
}

fn normalized(rel: &str) -> String {
    let mut s = String::with_capacity(rel.len() + 1);
    for c in rel.split('/').filter(|c| !c.is_empty()) {
        s.push('/');
        s.push_str(c);
    }
    if s.is_empty() {
        s.push('/');
    }
    s
}

fn join(parent: &str, name: &str) -> String {
    let mut s = String::with_capacity(parent.len() + 1 + name.len());
    s.push_str(parent.trim_end_matches('/'));
    s.push('/');
    s.push_str(name);
    s
}

#[cfg(test)]
mod tests {
    //! Walks of real trees made by a test live in the integration tests (tests/tests/host.rs).
    use super::*;
    use crate::cgroup::mounts::CgroupMounts;

    #[test]
    fn missing_roots_are_quiet_and_outside_roots_are_errors() {
        let m = HierarchyMount {
            version: CgroupVersion::V2,
            mount_point: PathBuf::from("/nonexistent-cgroup-mount"),
            root: "/sub".into(),
        };
        let roots = |p: &str| KubeRoots::new([p]).unwrap();
        let s = scan(&m, &roots("/sub/kubepods"), &ScanOptions::default()).unwrap();
        assert!(s.cgroups.is_empty());
        assert_eq!(s.stats.vanished, 1);
        assert!(matches!(
            scan(&m, &roots("/other/kubepods"), &ScanOptions::default()),
            Err(CgroupError::OutsideMount { .. })
        ));
        assert!(matches!(
            scan_kubepods(&m, &ScanOptions::default()),
            Err(CgroupError::NoKubepodsRoot { .. })
        ));
    }

    /// Whole real trees below kubelet's roots, whatever else runs on this machine meanwhile: never
    /// an error.
    #[test]
    fn every_hierarchy_here_scans_from_its_root() {
        let mounts = CgroupMounts::detect(None).unwrap();
        let all = mounts
            .unified()
            .into_iter()
            .chain(mounts.v1_hierarchies().iter().map(|h| &h.mount));
        for m in all {
            let roots = KubeRoots::detect::<&str>(m, &[]).unwrap();
            let s = scan(m, &roots, &ScanOptions::default()).unwrap();
            assert!(s.stats.dirs + s.stats.vanished >= 1, "{m:?}");
            assert_eq!(s.stats.unreadable, 0, "{m:?}");
            for c in &s.cgroups {
                assert_eq!(roots.classify(&c.path), c.kind);
                assert!(c.kind.pod().is_some(), "{c:?}");
            }
        }
    }

    #[test]
    fn init_of_exited_pids_is_none() {
        // Pids that do not exist (beyond pid_max) have no /proc entry.
        assert_eq!(
            init_pid(&[u32::MAX - 1, u32::MAX], Path::new("/proc")),
            None
        );
        assert_eq!(init_pid(&[], Path::new("/proc")), None);
        // Our own process: in our namespace, so the oldest-process rule picks it.
        let me = std::process::id();
        assert_eq!(init_pid(&[me, u32::MAX], Path::new("/proc")), Some(me));
    }

    #[test]
    fn path_helpers() {
        assert_eq!(normalized(""), "/");
        assert_eq!(normalized("a//b/"), "/a/b");
        assert_eq!(join("/", "x"), "/x");
        assert_eq!(join("/a", "x"), "/a/x");
    }
}
