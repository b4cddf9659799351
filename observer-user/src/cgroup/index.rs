//! cgroup id → path and kind, for the cgroup2 hierarchy.
//!
//! Kernel events carry only a cgroup id: on cgroup2 (where `bpf_get_current_cgroup_id()` and the
//! tracepoints' ids come from, on hybrid hosts too) the inode number of the cgroup's directory.
//! The index is filled by one walk of the tree at start and kept current by cgroup mkdir/rmdir
//! events. A miss (a mkdir lost with a full ring buffer, before the resync's walk) is looked for
//! by a walk of kubelet's roots alone, matching inode numbers: only there is a cgroup a pod's or a
//! container's, so an id found nowhere below them stays unknown (counted) and the rest of the
//! hierarchy is never walked for it. Nothing here needs a capability: directories are read as
//! any reader of cgroupfs reads them (the kernel's file handles, `open_by_handle_at`, would need
//! CAP_DAC_READ_SEARCH, which opens any inode of any filesystem).
//!
//! The walk runs on the reader's thread, so it is bounded three ways: at most [`WALK_EVERY`]
//! apart whatever the id, an id it did not find is not walked for again within [`MISS_TTL`], and
//! it stops after passing [`WALK_DIRS`] directories (a container with a writable cgroupfs can
//! make any number below its own cgroup).
use std::{
    collections::HashMap,
    fs,
    os::unix::fs::{DirEntryExt, MetadataExt},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{mounts::HierarchyMount, CgroupKind, KubeRoots};

/// A walk for an id the index lacks starts at most this often, whichever id missed: a burst of
/// misses costs one walk, which indexes every cgroup below the roots it passes. A node of 1000
/// pods is some 3000 directories, about 25 ms to list on the test VM: at most a tenth of the
/// reader's time however the misses come (the resync after lost records walks the same tree and
/// reads every container's processes too).
pub(crate) const WALK_EVERY: Duration = Duration::from_millis(250);
/// An id a walk did not find is answered "unknown" without a walk for this long: as long as the
/// PLEG holds an event for its cgroup's mkdir.
pub(crate) const MISS_TTL: Duration = Duration::from_secs(2);
/// Directories one walk for a missed id passes at most: about five times a node of 1000 pods
/// (pod, container and sandbox cgroups).
pub(crate) const WALK_DIRS: usize = 16_384;
/// Ids remembered as not found, at most (expired ones are dropped first, then all).
const MISSES: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupEntry {
    /// Relative to the hierarchy root, e.g. `/kubepods/burstable/pod<uid>/<id>`.
    pub path: Arc<str>,
    pub kind: CgroupKind,
}

/// What the look-ups of ids the index did not hold cost and found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Walks of kubelet's roots for an id the index did not hold.
    pub walks: u64,
    /// Look-ups that found no cgroup: not below kubelet's roots, removed, or not walked for
    /// again yet (within [`MISS_TTL`] of a walk that did not find it, or [`WALK_EVERY`] of any).
    pub unresolved: u64,
    /// Walks stopped at [`WALK_DIRS`] directories.
    pub cut: u64,
}

pub struct CgroupIndex {
    mount: HierarchyMount,
    /// What each path is, anchored at kubelet's roots.
    roots: KubeRoots,
    by_id: HashMap<u64, CgroupEntry>,
    /// Ids the last walks did not find, with when each may be walked for again.
    misses: HashMap<u64, Instant>,
    last_walk: Option<Instant>,
    stats: IndexStats,
}

impl CgroupIndex {
    pub fn new(mount: HierarchyMount, roots: KubeRoots) -> Self {
        Self {
            mount,
            roots,
            by_id: HashMap::new(),
            misses: HashMap::new(),
            last_walk: None,
            stats: IndexStats::default(),
        }
    }

    /// Walks the whole hierarchy once, at start. Directories that vanish meanwhile are skipped.
    pub fn scan(&mut self) {
        let root = self.mount.mount_point.clone();
        if let Some(rel) = self.mount.to_relative(&root) {
            self.walk(vec![(root, rel)], usize::MAX);
        }
    }

    pub fn insert(&mut self, id: u64, path: &str) -> &CgroupEntry {
        self.misses.remove(&id);
        self.by_id.insert(id, self.roots.entry(path));
        &self.by_id[&id]
    }

    pub fn remove(&mut self, id: u64) -> Option<CgroupEntry> {
        self.by_id.remove(&id)
    }

    pub fn get(&self, id: u64) -> Option<&CgroupEntry> {
        self.by_id.get(&id)
    }

    /// [`Self::get`], else a bounded walk of kubelet's roots for `id` (see the module's doc).
    pub(crate) fn resolve(&mut self, id: u64) -> Option<&CgroupEntry> {
        self.resolve_at(id, Instant::now())
    }

    fn resolve_at(&mut self, id: u64, now: Instant) -> Option<&CgroupEntry> {
        if !self.by_id.contains_key(&id) && !self.walk_for(id, now) {
            self.stats.unresolved += 1;
            return None;
        }
        self.by_id.get(&id)
    }

    /// Walks kubelet's roots for `id` unless a walk is not due; true when `id` is indexed after.
    fn walk_for(&mut self, id: u64, now: Instant) -> bool {
        if self.misses.get(&id).is_some_and(|&until| now < until)
            || self
                .last_walk
                .is_some_and(|at| now.saturating_duration_since(at) < WALK_EVERY)
        {
            return false;
        }
        self.last_walk = Some(now);
        self.stats.walks += 1;
        let starts = self
            .roots
            .paths()
            .filter_map(|rel| Some((self.mount.to_absolute(rel)?, rel.to_string())))
            .collect();
        if !self.walk(starts, WALK_DIRS) {
            self.stats.cut += 1;
            if self.stats.cut == 1 {
                tracing::warn!(
                    roots = %self.roots,
                    dirs = WALK_DIRS,
                    "a walk of kubelet's cgroups for a cgroup id the agent had not indexed \
                     stopped at its bound: a cgroup beyond it is not attributed until its events \
                     name it (counted in observer_cgroup_id_walks_cut_total; said once). A \
                     container with a writable cgroupfs made that many cgroups below its own: \
                     find it by the directories below its cgroup, and give it a read-only one"
                );
            }
        }
        if self.by_id.contains_key(&id) {
            return true;
        }
        if self.misses.len() >= MISSES {
            self.misses.retain(|_, until| now < *until);
            if self.misses.len() >= MISSES {
                self.misses.clear();
            }
        }
        self.misses.insert(id, now + MISS_TTL);
        false
    }

    /// Indexes every directory below `starts` (absolute, relative) that the index does not hold
    /// yet, passing at most `budget` directories; false when it stopped there. A directory's id
    /// is its inode number, as its parent's listing gives it (kernfs lists each node with its id:
    /// no stat per directory).
    fn walk(&mut self, starts: Vec<(PathBuf, String)>, budget: usize) -> bool {
        let mut stack = Vec::new();
        for (abs, rel) in starts {
            let Ok(md) = fs::metadata(&abs) else { continue };
            self.by_id
                .entry(md.ino())
                .or_insert_with(|| self.roots.entry(&rel));
            stack.push((abs, rel));
        }
        // Counted as listed, not as read: one directory can hold any number.
        let mut passed = 0;
        while let Some((dir, rel)) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if passed == budget {
                    return false;
                }
                passed += 1;
                // Like `HierarchyMount::to_relative`: a name that is not UTF-8 has no path here.
                let name = e.file_name();
                let Some(name) = name.to_str() else { continue };
                let child = format!("{}/{name}", rel.trim_end_matches('/'));
                self.by_id
                    .entry(e.ino())
                    .or_insert_with(|| self.roots.entry(&child));
                stack.push((e.path(), child));
            }
        }
        true
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

    pub fn stats(&self) -> IndexStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{
        container_cgroup_path, mounts::CgroupVersion, pod_cgroup_path, CgroupDriver, ContainerId,
        PodUid, Qos, Runtime,
    };
    use std::path::Path;

    const UID: &str = "0f3c4a2e-1b7d-4c8e-9a6f-2d5b8e1c7a90";

    fn container(n: u32) -> String {
        container_cgroup_path(
            CgroupDriver::Cgroupfs,
            Qos::Burstable,
            &PodUid::parse(UID).unwrap(),
            Runtime::Containerd,
            &ContainerId::parse(&format!("{n:064x}")).unwrap(),
        )
    }

    /// `rel` made below `top`; its id (inode number).
    fn make(top: &Path, rel: &str) -> u64 {
        let abs = top.join(rel.trim_start_matches('/'));
        fs::create_dir_all(&abs).unwrap();
        fs::metadata(&abs).unwrap().ino()
    }

    fn index(top: &Path) -> CgroupIndex {
        let mount = HierarchyMount {
            version: CgroupVersion::V2,
            mount_point: top.to_path_buf(),
            root: "/".into(),
        };
        CgroupIndex::new(mount, KubeRoots::new(["/kubepods"]).unwrap())
    }

    /// Directories on any filesystem stand for cgroups: the walk reads names and inode numbers.
    #[test]
    fn a_miss_below_kubelets_roots_is_found_by_a_walk_and_indexed_with_its_neighbours() {
        let dir = tempfile::tempdir().unwrap();
        let mut idx = index(dir.path());
        let t = Instant::now();
        let a = make(dir.path(), &container(1));
        let b = make(dir.path(), &container(2));
        let pod = make(
            dir.path(),
            &pod_cgroup_path(
                CgroupDriver::Cgroupfs,
                Qos::Burstable,
                &PodUid::parse(UID).unwrap(),
            ),
        );
        let e = idx.resolve_at(a, t).cloned().unwrap();
        assert_eq!(&*e.path, container(1));
        assert!(e.kind.container().is_some(), "{e:?}");
        assert_eq!(idx.stats().walks, 1);
        // The walk indexed what it passed: no walk for them, even at once.
        assert!(idx
            .resolve_at(b, t)
            .is_some_and(|e| *e.path == container(2)));
        assert!(idx
            .resolve_at(pod, t)
            .is_some_and(|e| e.kind.pod().is_some()));
        assert_eq!(
            idx.stats(),
            IndexStats {
                walks: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn an_id_outside_the_roots_stays_unknown_and_is_not_walked_for_again_at_once() {
        let dir = tempfile::tempdir().unwrap();
        make(dir.path(), &container(1));
        let spoof = make(dir.path(), &format!("/evil{}", container(1)));
        let mut idx = index(dir.path());
        let t = Instant::now();
        assert!(idx.resolve_at(spoof, t).is_none());
        assert_eq!((idx.stats().walks, idx.stats().unresolved), (1, 1));
        // Again, after the global bound but within the id's own: no walk.
        let later = t + WALK_EVERY;
        assert!(idx.resolve_at(spoof, later).is_none());
        assert_eq!((idx.stats().walks, idx.stats().unresolved), (1, 2));
        // Once that expires, walked for again (the cgroup may have moved in meanwhile).
        assert!(idx.resolve_at(spoof, t + MISS_TTL).is_none());
        assert_eq!((idx.stats().walks, idx.stats().unresolved), (2, 3));
        // Its mkdir names it: indexed, and Foreign by its path.
        idx.insert(spoof, &format!("/evil{}", container(1)));
        assert_eq!(idx.resolve_at(spoof, t).unwrap().kind, CgroupKind::Foreign);
        assert_eq!(idx.stats().unresolved, 3);
    }

    #[test]
    fn walks_are_at_least_the_global_bound_apart_whatever_the_id() {
        let dir = tempfile::tempdir().unwrap();
        let mut idx = index(dir.path());
        let t = Instant::now();
        assert!(idx.resolve_at(u64::MAX, t).is_none());
        // A cgroup made right after the walk, whose mkdir the index never saw.
        let late = make(dir.path(), &container(3));
        assert!(idx.resolve_at(late, t + WALK_EVERY / 2).is_none());
        assert_eq!(idx.stats().walks, 1, "within the bound: no walk");
        // Not remembered as missing: the next look-up after the bound walks and finds it.
        assert!(idx.resolve_at(late, t + WALK_EVERY).is_some());
        assert_eq!(idx.stats().walks, 2);
    }

    #[test]
    fn a_walk_stops_at_its_bound_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let mut idx = index(dir.path());
        let wanted = make(dir.path(), &container(1));
        let base = dir.path().join("kubepods/burstable");
        for i in 0..WALK_DIRS {
            fs::create_dir_all(base.join(format!("a{i:05}"))).unwrap();
        }
        // Listed in no set order: the pod's directory may be passed before the bound or not;
        // either way the walk indexes at most WALK_DIRS directories besides its roots.
        let t = Instant::now();
        let found = idx.resolve_at(wanted, t).is_some();
        assert_eq!(idx.stats().cut, 1);
        assert_eq!(idx.len(), WALK_DIRS + 1);
        assert_eq!(idx.stats().unresolved, u64::from(!found));
    }

    #[test]
    fn the_start_up_walk_indexes_the_whole_hierarchy_by_inode() {
        let dir = tempfile::tempdir().unwrap();
        let a = make(dir.path(), &container(1));
        let spoof = make(dir.path(), &format!("/evil{}", container(1)));
        let mut idx = index(dir.path());
        idx.scan();
        assert_eq!(&*idx.get(a).unwrap().path, container(1));
        assert_eq!(idx.get(spoof).unwrap().kind, CgroupKind::Foreign);
        let root = fs::metadata(dir.path()).unwrap().ino();
        assert_eq!(&*idx.get(root).unwrap().path, "/");
        assert_eq!(idx.stats(), IndexStats::default(), "no look-up walked");
    }

    /// On this machine's cgroup2 hierarchy (as root): the id the kernel gives a cgroup is what
    /// the walk reads for it from its parent's listing.
    #[test]
    fn real_cgroup2_ids_are_what_the_walk_reads() {
        let Some(unified) = crate::cgroup::CgroupMounts::detect(None)
            .ok()
            .and_then(|m| m.unified().cloned())
            .filter(|u| u.root == "/")
        else {
            return;
        };
        let top = format!("/observer-index-test-{}", std::process::id());
        let rel = format!("{top}{}", container(7));
        let abs = unified.to_absolute(&rel).unwrap();
        if fs::create_dir_all(&abs).is_err() {
            eprintln!("SKIPPED: cannot make cgroups here (not root?)");
            return;
        }
        let id = crate::cgroup::cgroup_id(&abs).unwrap();
        let roots = KubeRoots::new([format!("{top}/kubepods")]).unwrap();
        let mut idx = CgroupIndex::new(unified.clone(), roots);
        let found = idx.resolve(id).cloned();
        // Children first: cgroupfs removes only empty directories.
        let mut p = abs.clone();
        while p.starts_with(unified.to_absolute(&top).unwrap()) {
            let _ = fs::remove_dir(&p);
            p.pop();
        }
        let found = found.expect("the walk finds the cgroup by its id");
        assert_eq!(&*found.path, rel);
        assert!(found.kind.container().is_some());
    }
}
