//! Where the cgroup hierarchies are mounted, read from mountinfo.
//!
//! Nothing here assumes /sys/fs/cgroup: production nodes mount cgroup2 there, hybrid hosts at
//! /sys/fs/cgroup/unified, and an agent in a container may see the host's cgroupfs under some
//! other directory (pass it as `under`).
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use procfs::process::MountInfo;
use tracing::{debug, warn};

use super::CgroupError;

/// How the node's cgroups are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupMode {
    /// cgroup2 only (v1 hierarchies without controllers, like a leftover name=systemd, may exist).
    Unified,
    /// v1 controllers plus a cgroup2 mount (systemd's /sys/fs/cgroup/unified).
    Hybrid,
    /// v1 only.
    Legacy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// One hierarchy as mounted in this mount namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HierarchyMount {
    pub version: CgroupVersion,
    /// Where it is mounted, as this process sees it.
    pub mount_point: PathBuf,
    /// The hierarchy path shown at `mount_point`: "/" unless a sub-tree was bind-mounted or the
    /// mount was made in another cgroup namespace.
    pub root: String,
}

impl HierarchyMount {
    /// `/sys/fs/cgroup/unified/kubepods/x` → `/kubepods/x` (lexically; nothing is read).
    /// `None` if `abs` is not below the mount point or has `..` or non-UTF-8 components.
    pub fn to_relative(&self, abs: &Path) -> Option<String> {
        let rest = abs.strip_prefix(&self.mount_point).ok()?;
        let mut rel = self.root.trim_end_matches('/').to_string();
        for c in rest.components() {
            match c {
                Component::Normal(name) => {
                    rel.push('/');
                    rel.push_str(name.to_str()?);
                }
                Component::CurDir => {}
                _ => return None,
            }
        }
        if rel.is_empty() {
            rel.push('/');
        }
        Some(rel)
    }

    /// `/kubepods/x` → `/sys/fs/cgroup/unified/kubepods/x`. `None` if the path is outside the
    /// part of the hierarchy this mount shows, or has `..` components.
    pub fn to_absolute(&self, rel: &str) -> Option<PathBuf> {
        let mut rel_parts = rel.split('/').filter(|c| !c.is_empty() && *c != ".");
        for root_part in self.root.split('/').filter(|c| !c.is_empty()) {
            if rel_parts.next()? != root_part {
                return None;
            }
        }
        let mut abs = self.mount_point.clone();
        for part in rel_parts {
            if part == ".." {
                return None;
            }
            abs.push(part);
        }
        Some(abs)
    }
}

/// A cgroup v1 hierarchy: its controllers and/or its name (`name=systemd`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct V1Hierarchy {
    pub controllers: Vec<String>,
    pub name: Option<String>,
    pub mount: HierarchyMount,
}

/// All cgroup hierarchies mounted here (or under a given directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMounts {
    mode: CgroupMode,
    unified: Option<HierarchyMount>,
    v1: Vec<V1Hierarchy>,
}

/// v1 controllers the kernel has had; other superblock options (rw, nsdelegate, xattr,
/// release_agent=..., clone_children, ...) are not controllers.
const V1_CONTROLLERS: &[&str] = &[
    "cpuset",
    "cpu",
    "cpuacct",
    "blkio",
    "io",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "perf_event",
    "net_prio",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
    "debug",
];

impl CgroupMounts {
    /// Reads /proc/self/mountinfo. With `under`, only mounts at or below that directory count:
    /// the host's cgroupfs as mounted into the agent's container, say at /host/sys/fs/cgroup.
    pub fn detect(under: Option<&Path>) -> Result<Self, CgroupError> {
        let path = Path::new("/proc/self/mountinfo");
        let text = std::fs::read_to_string(path).map_err(|source| CgroupError::Io {
            path: path.to_owned(),
            source,
        })?;
        // mountinfo shows resolved paths; a caller's /host/sys may be a symlink.
        let under = under.map(|u| std::fs::canonicalize(u).unwrap_or_else(|_| u.to_owned()));
        let mut mounts = Self::from_mountinfo(&text, under.as_deref())?;
        mounts.resolve_roots_outside_namespace();
        Ok(mounts)
    }

    /// A mount made outside this process's cgroup namespace shows its root relative to our
    /// namespace root ("/../.."). Kernel paths (the cgroup tracepoints') start at the hierarchy's
    /// real root, so when the mount point is that real root, call it "/". Otherwise the mount
    /// cannot translate paths: kept, but every conversion answers `None`.
    pub fn resolve_roots_outside_namespace(&mut self) {
        let mounts = self
            .unified
            .iter_mut()
            .chain(self.v1.iter_mut().map(|h| &mut h.mount));
        for m in mounts {
            if !m.root.split('/').any(|c| c == "..") {
                continue;
            }
            if is_hierarchy_root(m) {
                debug!(mount_point = ?m.mount_point, root = %m.root, "mount shows the hierarchy root");
                m.root = "/".into();
            } else {
                warn!(mount_point = ?m.mount_point, root = %m.root,
                    "cgroup mount outside our cgroup namespace shows a sub-tree; its paths cannot be mapped");
            }
        }
    }

    /// Parses mountinfo text. Lines procfs cannot parse are skipped with a warning: one odd
    /// mount elsewhere must not blind the agent.
    pub fn from_mountinfo(text: &str, under: Option<&Path>) -> Result<Self, CgroupError> {
        let mut unified: Option<HierarchyMount> = None;
        let mut v1: Vec<(String, V1Hierarchy)> = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let mi = match MountInfo::from_line(line) {
                Ok(mi) => mi,
                Err(e) => {
                    warn!(line, error = %e, "skipping unparsable mountinfo line");
                    continue;
                }
            };
            let version = match mi.fs_type.as_str() {
                "cgroup2" => CgroupVersion::V2,
                "cgroup" => CgroupVersion::V1,
                _ => continue,
            };
            let mount_point = PathBuf::from(OsString::from_vec(unescape(
                mi.mount_point.as_os_str().as_bytes(),
            )));
            if under.is_some_and(|u| !mount_point.starts_with(u)) {
                continue;
            }
            let root = String::from_utf8_lossy(&unescape(mi.root.as_bytes())).into_owned();
            let mount = HierarchyMount {
                version,
                mount_point,
                root,
            };
            match version {
                CgroupVersion::V2 => {
                    // The same hierarchy can be mounted more than once (bind mounts); prefer
                    // the mount that shows all of it, then the first.
                    if unified
                        .as_ref()
                        .is_none_or(|u| u.root != "/" && mount.root == "/")
                    {
                        unified = Some(mount);
                    }
                }
                CgroupVersion::V1 => {
                    let mut controllers: Vec<String> = mi
                        .super_options
                        .keys()
                        .filter(|k| V1_CONTROLLERS.contains(&k.as_str()))
                        .cloned()
                        .collect();
                    controllers.sort();
                    let name = mi.super_options.get("name").cloned().flatten();
                    let h = V1Hierarchy {
                        controllers,
                        name,
                        mount,
                    };
                    // Mounts of one v1 hierarchy share its superblock, hence the device number.
                    match v1.iter_mut().find(|(dev, _)| *dev == mi.majmin) {
                        Some((_, old)) => {
                            if old.mount.root != "/" && h.mount.root == "/" {
                                *old = h;
                            }
                        }
                        None => v1.push((mi.majmin.clone(), h)),
                    }
                }
            }
        }
        let v1: Vec<V1Hierarchy> = v1.into_iter().map(|(_, h)| h).collect();
        let v1_controllers = v1.iter().any(|h| !h.controllers.is_empty());
        let mode = match (&unified, v1.is_empty(), v1_controllers) {
            (Some(_), _, true) => CgroupMode::Hybrid,
            (Some(_), _, false) => CgroupMode::Unified,
            (None, false, _) => CgroupMode::Legacy,
            (None, true, _) => {
                return Err(CgroupError::NoCgroupMounts {
                    under: under.map(Path::to_owned),
                })
            }
        };
        debug!(?mode, ?unified, v1 = v1.len(), "cgroup mounts");
        Ok(CgroupMounts { mode, unified, v1 })
    }

    pub fn mode(&self) -> CgroupMode {
        self.mode
    }

    /// The cgroup2 hierarchy, the one `bpf_get_current_cgroup_id()` ids refer to.
    pub fn unified(&self) -> Option<&HierarchyMount> {
        self.unified.as_ref()
    }

    #[cfg(test)]
    pub(crate) fn v1_hierarchies(&self) -> &[V1Hierarchy] {
        &self.v1
    }

    /// The memory limit in bytes of the cgroup at `rel` (hierarchy-relative, as the kernel log
    /// names memory cgroups): cgroup2's `memory.max` where the memory controller lives there, else
    /// the v1 memory hierarchy's `memory.limit_in_bytes`. `None` when unlimited or unreadable.
    pub fn memory_limit(&self, rel: &str) -> Option<u64> {
        let v2 = self.unified.as_ref().filter(|u| {
            std::fs::read_to_string(u.mount_point.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        });
        let (mount, file) = match v2 {
            Some(u) => (u, "memory.max"),
            None => (self.v1("memory")?, "memory.limit_in_bytes"),
        };
        let text = std::fs::read_to_string(mount.to_absolute(rel)?.join(file)).ok()?;
        // v1 says "unlimited" with a page-rounded i64::MAX.
        text.trim().parse::<u64>().ok().filter(|&b| b < (1 << 62))
    }

    /// A v1 hierarchy by controller (`memory`) or by name (`name=systemd`).
    pub fn v1(&self, controller: &str) -> Option<&HierarchyMount> {
        let by_name = controller.strip_prefix("name=");
        self.v1
            .iter()
            .find(|h| match by_name {
                Some(n) => h.name.as_deref() == Some(n),
                None => h.controllers.iter().any(|c| c == controller),
            })
            .map(|h| &h.mount)
    }
}

/// Interface files the kernel creates only on (v1) or never on (v2) a hierarchy's root cgroup.
fn is_hierarchy_root(m: &HierarchyMount) -> bool {
    let has = |f: &str| m.mount_point.join(f).exists();
    match m.version {
        CgroupVersion::V2 => has("cgroup.procs") && !has("cgroup.type"),
        CgroupVersion::V1 => has("cgroup.sane_behavior"),
    }
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` octal escapes.
fn unescape(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            if let Some(oct) = b.get(i + 1..i + 4) {
                if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                    let v = oct
                        .iter()
                        .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                    if let Ok(byte) = u8::try_from(v) {
                        out.push(byte);
                        i += 4;
                        continue;
                    }
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIFIED: &str = "\
24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
25 24 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:8 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
26 24 0:24 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime shared:9 - bpf bpf rw,mode=700
";

    const LEGACY: &str = "\
25 24 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:8 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,xattr,release_agent=/usr/lib/systemd/systemd-cgroups-agent,name=systemd
28 25 0:25 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,cpu,cpuacct
29 25 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory
30 25 0:27 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,net_cls,net_prio
31 25 0:28 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,pids
";

    /// This machine's layout, plus a bind mount of part of the memory hierarchy.
    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
90 80 0:32 /kubepods /mnt/kp rw,relatime - cgroup cgroup rw,memory
";

    /// An agent container: its own cgroupns view at /sys/fs/cgroup, the host's at /host/....
    const AGENT_CONTAINER: &str = "\
700 600 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup ro,nsdelegate
701 600 0:23 /../../.. /host/sys/fs/cgroup rw,nosuid,nodev,noexec,relatime master:8 - cgroup2 cgroup2 rw,nsdelegate
702 600 0:99 / /host/odd\\040dir/cg rw - cgroup2 cgroup2 rw
this line is not mountinfo
";

    #[test]
    fn unified_fixture() {
        let m = CgroupMounts::from_mountinfo(UNIFIED, None).unwrap();
        assert_eq!(m.mode(), CgroupMode::Unified);
        let u = m.unified().unwrap();
        assert_eq!(u.mount_point, Path::new("/sys/fs/cgroup"));
        assert_eq!(u.root, "/");
        assert_eq!(u.version, CgroupVersion::V2);
        assert!(m.v1_hierarchies().is_empty());
        assert_eq!(m.v1("memory"), None);
    }

    #[test]
    fn legacy_fixture() {
        let m = CgroupMounts::from_mountinfo(LEGACY, None).unwrap();
        assert_eq!(m.mode(), CgroupMode::Legacy);
        assert_eq!(m.unified(), None);
        assert_eq!(m.v1_hierarchies().len(), 5);
        let cpu = m.v1("cpuacct").unwrap();
        assert_eq!(cpu.mount_point, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(m.v1("cpu"), Some(cpu));
        assert_eq!(
            m.v1("net_prio").unwrap().mount_point,
            Path::new("/sys/fs/cgroup/net_cls,net_prio")
        );
        let sd = m.v1("name=systemd").unwrap();
        assert_eq!(sd.mount_point, Path::new("/sys/fs/cgroup/systemd"));
        assert_eq!(sd.version, CgroupVersion::V1);
        let sd_h = m
            .v1_hierarchies()
            .iter()
            .find(|h| h.name.as_deref() == Some("systemd"))
            .unwrap();
        // release_agent=, xattr and rw are options, not controllers.
        assert!(sd_h.controllers.is_empty());
        assert_eq!(m.v1("systemd"), None);
        assert_eq!(m.v1("hugetlb"), None);
    }

    #[test]
    fn hybrid_fixture_and_bind_mount_dedup() {
        let m = CgroupMounts::from_mountinfo(HYBRID, None).unwrap();
        assert_eq!(m.mode(), CgroupMode::Hybrid);
        assert_eq!(
            m.unified().unwrap().mount_point,
            Path::new("/sys/fs/cgroup/unified")
        );
        // 0:32 is mounted twice; the full view wins.
        assert_eq!(m.v1_hierarchies().len(), 3);
        let mem = m.v1("memory").unwrap();
        assert_eq!(mem.mount_point, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(mem.root, "/");
        // Only the partial mount below /mnt.
        let m = CgroupMounts::from_mountinfo(HYBRID, Some(Path::new("/mnt"))).unwrap();
        assert_eq!(m.mode(), CgroupMode::Legacy);
        let kp = m.v1("memory").unwrap();
        assert_eq!(kp.root, "/kubepods");
        assert_eq!(
            kp.to_absolute("/kubepods/burstable"),
            Some(PathBuf::from("/mnt/kp/burstable"))
        );
        assert_eq!(kp.to_absolute("/kubepods"), Some(PathBuf::from("/mnt/kp")));
        assert_eq!(kp.to_absolute("/kubepodsx/burstable"), None);
        assert_eq!(kp.to_absolute("/system.slice"), None);
        assert_eq!(
            kp.to_relative(Path::new("/mnt/kp/burstable/")),
            Some("/kubepods/burstable".into())
        );
        assert_eq!(
            kp.to_relative(Path::new("/mnt/kp")),
            Some("/kubepods".into())
        );
        assert_eq!(kp.to_relative(Path::new("/mnt/kpx")), None);
        assert_eq!(kp.to_relative(Path::new("/mnt/kp/../x")), None);
    }

    #[test]
    fn override_root_for_an_agent_container() {
        let m = CgroupMounts::from_mountinfo(AGENT_CONTAINER, None).unwrap();
        // Without an override the container's own view comes first.
        assert_eq!(
            m.unified().unwrap().mount_point,
            Path::new("/sys/fs/cgroup")
        );
        let host = Path::new("/host/sys/fs/cgroup");
        let m = CgroupMounts::from_mountinfo(AGENT_CONTAINER, Some(host)).unwrap();
        assert_eq!(m.mode(), CgroupMode::Unified);
        let u = m.unified().unwrap();
        assert_eq!(u.mount_point, host);
        let m = CgroupMounts::from_mountinfo(AGENT_CONTAINER, Some(Path::new("/host/odd dir")))
            .unwrap();
        let u = m.unified().unwrap();
        assert_eq!(u.mount_point, Path::new("/host/odd dir/cg"));
        assert_eq!(
            u.to_absolute("kubepods.slice/"),
            Some(PathBuf::from("/host/odd dir/cg/kubepods.slice"))
        );
        assert!(matches!(
            CgroupMounts::from_mountinfo(AGENT_CONTAINER, Some(Path::new("/nowhere"))),
            Err(CgroupError::NoCgroupMounts { .. })
        ));
        assert!(matches!(
            CgroupMounts::from_mountinfo("", None),
            Err(CgroupError::NoCgroupMounts { under: None })
        ));
    }

    #[test]
    fn relative_absolute_round_trip_at_root() {
        let u = HierarchyMount {
            version: CgroupVersion::V2,
            mount_point: PathBuf::from("/sys/fs/cgroup"),
            root: "/".into(),
        };
        assert_eq!(u.to_relative(Path::new("/sys/fs/cgroup")), Some("/".into()));
        assert_eq!(u.to_absolute("/"), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(u.to_absolute(""), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(u.to_absolute("/a/../../etc"), None);
        for rel in ["/kubepods.slice", "/a/b/c"] {
            let abs = u.to_absolute(rel).unwrap();
            assert_eq!(u.to_relative(&abs).as_deref(), Some(rel));
        }
        assert_eq!(u.to_relative(Path::new("/sys/fs/cgroupx/a")), None);
        assert_eq!(u.to_relative(Path::new("relative")), None);
    }

    #[test]
    fn unescape_octal() {
        assert_eq!(unescape(br"a\040b\011c\134d"), b"a b\tc\\d");
        // Not escapes: left as they are, never a panic on a trailing backslash.
        assert_eq!(unescape(br"a\04"), br"a\04");
        assert_eq!(unescape(br"\"), br"\");
        assert_eq!(unescape(br"\777x"), br"\777x");
        assert_eq!(unescape(br"\08x"), br"\08x");
    }

    /// The real mountinfo, checked against what the kernel says about this process's cgroups
    /// (/proc/self/cgroup) and the filesystems actually mounted.
    #[test]
    fn this_machine() {
        use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};
        let m = CgroupMounts::detect(None).unwrap();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let mut has_v2 = false;
        let mut v1_controllers = false;
        let pid = std::process::id().to_string();
        for line in own.lines() {
            let mut f = line.splitn(3, ':');
            let (id, ctrls, path) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
            let mount = if id == "0" {
                has_v2 = true;
                m.unified()
            } else {
                let first = ctrls.split(',').next().unwrap();
                v1_controllers |= !first.starts_with("name=");
                m.v1(first)
            };
            let mount = mount.unwrap_or_else(|| panic!("no mount for {line}"));
            let want = if id == "0" {
                CGROUP2_SUPER_MAGIC
            } else {
                CGROUP_SUPER_MAGIC
            };
            assert_eq!(
                statfs(&mount.mount_point).unwrap().filesystem_type(),
                want,
                "{line}"
            );
            // Our own cgroup, found through the mount, lists us.
            let dir = mount.to_absolute(path).unwrap();
            assert_eq!(mount.to_relative(&dir).as_deref(), Some(path));
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
            assert!(procs.lines().any(|p| p == pid), "{line}: not in {dir:?}");
        }
        let want = match (has_v2, v1_controllers) {
            (true, true) => CgroupMode::Hybrid,
            (true, false) => CgroupMode::Unified,
            (false, _) => CgroupMode::Legacy,
        };
        assert_eq!(m.mode(), want);
    }
}
